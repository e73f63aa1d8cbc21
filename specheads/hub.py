"""Head folders from and for the Hub, and exports for one serving engine.

`resolve_head` turns a `--draft` spec into a local folder: an existing path wins, else
`org/name[@revision]` is fetched with `snapshot_download` (the Hugging Face cache, its token
and HF_HUB_OFFLINE apply).

`<run>/final/` already loads in both SGLang and vLLM (it carries both layer-id keys).
`export --format sglang|vllm` writes a folder with only the keys that engine reads, in its
own convention, so nothing depends on which key an engine version prefers:
  sglang: `eagle_config.eagle_aux_hidden_state_layer_ids` = outputs of layers (ours);
  vllm:   top-level `eagle_aux_hidden_state_layer_ids` = inputs of layers (ours + 1).
The head is validated on load (names, shapes, dtypes, d2t/t2d, no embed_tokens).
The launch command in the export's SERVING.md runs as written: the target is its hub id where
one is known, else a placeholder that the text says to fill in.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specheads.heads.fetch import HEAD_FILES, REPO_ID, HubError, check_repo_id, resolve_head  # noqa: F401 (re-exported)
from specheads.heads.format import CONFIG_FILE, META_FILE, hf_config, load_head, save_head
from specheads.target.loader import DEFAULT_TARGET, SMOLLM2_GGUF

FORMATS = ("sglang", "vllm")
DEFAULT_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded GGUF's source
# stands for the target in a launch command when its hub id is not known
TARGET_PLACEHOLDER = "<path or hub id of the target>"

LAUNCH = {
    "sglang": ("python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
               "--speculative-draft-model-path {folder} --speculative-num-steps 5 --speculative-eagle-topk 4 "
               "--speculative-num-draft-tokens 16"),
    "vllm": ("vllm serve {target} --speculative-config "
             "'{{\"method\": \"eagle3\", \"model\": \"{folder}\", \"num_speculative_tokens\": 5}}'"),
}


def base_model_id(target: str | None) -> str | None:
    """The target as a hub id, or None where it is a local path (or not recorded)."""
    # the embedded default, by name or as its GGUF file staged elsewhere (e.g. on a GPU box)
    if target == DEFAULT_TARGET or (target and Path(target).name == SMOLLM2_GGUF):
        return DEFAULT_TARGET_HUB_ID
    if (target and not Path(target).exists() and not target.startswith((".", "/", "~"))
            and REPO_ID.fullmatch(target) and "--" not in target and ".." not in target):
        return target
    return None


def engine_config(head, fmt: str, dtype: torch.dtype, target_name: str | None) -> dict:
    cfg = hf_config(head.config, dtype, target_name)
    if fmt == "sglang":
        del cfg["eagle_aux_hidden_state_layer_ids"]
    elif fmt == "vllm":
        cfg["eagle_config"] = {"use_aux_hidden_state": True}
    else:
        raise ValueError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    return cfg


def serving_md(fmt: str, target_name: str | None, folder: Path) -> str:
    """SERVING.md: the launch command, last, with the target as the engine must be given it."""
    target = base_model_id(target_name)
    if target is None and target_name and Path(target_name).expanduser().is_dir():
        target = str(Path(target_name).expanduser().resolve())  # a local HF checkpoint folder loads as it is
    lines = [f"# Serve with {fmt}", ""]
    if target is None:
        # a .gguf file, a folder of another machine, or nothing recorded: the engine needs an HF checkpoint
        recorded = f"recorded as `{target_name}`" if target_name else "not recorded in config.json"
        lines += [f"Replace `{TARGET_PLACEHOLDER}` with the target this head was trained for ({recorded}): "
                  "its hub id or a local Hugging Face checkpoint folder.", ""]
        target = TARGET_PLACEHOLDER
    return "\n".join(lines + ["    " + LAUNCH[fmt].format(target=target, folder=folder)]) + "\n"


def export_head(src: str | Path, fmt: str, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    src, out = resolve_head(src), Path(out)
    head = load_head(src)
    meta = json.loads((src / META_FILE).read_text()) if (src / META_FILE).is_file() else {}
    dtype = dtype or next(p.dtype for p in head.parameters())
    target_name = json.loads((src / CONFIG_FILE).read_text()).get("specheads_target")
    save_head(head, out, dtype, {k: v for k, v in meta.items() if k not in ("kind", "config", "layer_id_convention")},
              target_name=target_name)
    (out / CONFIG_FILE).write_text(json.dumps(engine_config(head, fmt, dtype, target_name), indent=2) + "\n")
    (out / "SERVING.md").write_text(serving_md(fmt, target_name, out.resolve()))
    return out
