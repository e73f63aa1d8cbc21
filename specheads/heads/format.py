"""Head folders: `config.json` + `model.safetensors` (+ `specheads.json`), as SGLang and vLLM load them.

Layer ids: our `target_layer_ids` are OUTPUTS of 0-based decoder layers. SGLang reads
`eagle_config.eagle_aux_hidden_state_layer_ids` in that same convention (it adds one to
get the layer whose input it captures); vLLM reads the top-level
`eagle_aux_hidden_state_layer_ids` as the layer whose INPUT it captures, i.e. ours + 1.
We write both, so one folder loads in either engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.heads.fetch import resolve_head  # a hub id becomes its cached snapshot folder

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "specheads.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"

WEIGHT_SHAPES = {  # name -> shape as a function of the config
    "fc.weight": lambda c: (c.hidden_size, 3 * c.target_hidden_size),
    "midlayer.input_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.hidden_norm.weight": lambda c: (c.hidden_size,),
    "midlayer.post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.self_attn.q_proj.weight": lambda c: (c.num_attention_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.k_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.v_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "midlayer.mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "norm.weight": lambda c: (c.hidden_size,),
    "lm_head.weight": lambda c: (c.draft_vocab_size, c.hidden_size),
    "d2t": lambda c: (c.draft_vocab_size,),
    "t2d": lambda c: (c.vocab_size,),
}


class HeadFormatError(ValueError):
    pass


def hf_config(cfg: Eagle3Config, dtype: torch.dtype, target_name: str | None) -> dict:
    rope = dict(cfg.rope_parameters)
    rope_theta = rope.get("rope_theta", 10000.0)
    rope_scaling = None if rope.get("rope_type", "default") == "default" else {
        k: v for k, v in rope.items() if k != "rope_theta"
    }
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": False,
        # vLLM: ids of the layers whose input is captured (= our output ids + 1)
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        # SGLang: ids of the layers whose output is captured
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(cfg.target_layer_ids),
            "use_aux_hidden_state": True,
        },
        "torch_dtype": str(dtype).replace("torch.", ""),
        "specheads_target": target_name,
    }


def save_head(head: Eagle3Head, folder: str | Path, dtype: torch.dtype = torch.bfloat16, meta: dict | None = None,
              target_name: str | None = None) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = head.config
    tensors = {}
    for name, t in head.state_dict().items():
        if name not in WEIGHT_SHAPES:
            continue
        t = t.detach().cpu()
        tensors[name] = t.to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config(cfg, dtype, target_name), indent=2) + "\n")
    info = {"kind": head.kind, "layer_id_convention": "output of 0-based target decoder layer",
            "config": cfg.to_dict(), **(meta or {})}
    (folder / META_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
    return folder


def config_from_folder(folder: Path) -> Eagle3Config:
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise HeadFormatError(f"head folder {str(folder)!r} has no {CONFIG_FILE}")
    raw = json.loads(config_path.read_text())
    meta_path = folder / META_FILE
    if meta_path.is_file():
        return Eagle3Config(**json.loads(meta_path.read_text())["config"])
    # a head written by another tool: rebuild our config from the HF keys
    arch = (raw.get("architectures") or ["?"])[0]
    if "Eagle3" not in arch:
        raise HeadFormatError(f"{config_path}: architectures {raw.get('architectures')} is not an EAGLE-3 head")
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None and raw.get("eagle_aux_hidden_state_layer_ids"):
        ids = [i - 1 for i in raw["eagle_aux_hidden_state_layer_ids"]]
    rope = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)}
    if raw.get("rope_scaling"):
        rope = {**raw["rope_scaling"], "rope_theta": raw.get("rope_theta", 10000.0)}
        rope.setdefault("rope_type", rope.pop("type", "default"))
    n_target = raw.get("target_num_hidden_layers") or (max(ids) + 4 if ids else 32)
    return Eagle3Config(
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        vocab_size=raw["vocab_size"],
        draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
        target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
        target_num_layers=n_target,
        target_layer_ids=ids or [1, n_target // 2 - 1, n_target - 4],
        rope_parameters=rope,
    )


def validate_weights(tensors: dict, cfg: Eagle3Config, where: str) -> None:
    problems = []
    if any("embed_tokens" in k for k in tensors):
        problems.append("contains embed_tokens (the target's embeddings must not be saved)")
    for name, shape_of in WEIGHT_SHAPES.items():
        if name not in tensors:
            problems.append(f"missing tensor {name}")
            continue
        want = shape_of(cfg)
        if tuple(tensors[name].shape) != want:
            problems.append(f"{name} has shape {tuple(tensors[name].shape)}, expected {want}")
    extra = sorted(set(tensors) - set(WEIGHT_SHAPES) - {k for k in tensors if "embed_tokens" in k})
    if extra:
        problems.append(f"unexpected tensors {extra[:5]} (vLLM refuses unknown names)")
    for name, t in tensors.items():  # a NaN head would load and serve, drafting tokens that are never accepted
        n_bad = int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0
        if n_bad:
            problems.append(f"tensor {name} holds {n_bad} NaN/Inf value(s) of {t.numel()} (the run that wrote it "
                            "diverged: retrain it, e.g. with a lower train.lr)")
    if "d2t" in tensors and tensors["d2t"].dtype != torch.int64:
        problems.append(f"d2t has dtype {tensors['d2t'].dtype}, expected torch.int64")
    if "t2d" in tensors and tensors["t2d"].dtype != torch.bool:
        problems.append(f"t2d has dtype {tensors['t2d'].dtype}, expected torch.bool")
    if "d2t" in tensors and "t2d" in tensors and not problems:
        target_ids = torch.arange(cfg.draft_vocab_size) + tensors["d2t"]
        if int(tensors["t2d"].sum()) != cfg.draft_vocab_size or not bool(tensors["t2d"][target_ids].all()):
            problems.append("d2t and t2d disagree (t2d must be True exactly at the draft tokens' target ids)")
    if problems:
        raise HeadFormatError(f"head {where} failed validation: " + "; ".join(problems))


def load_head(folder: str | Path, device="cpu", dtype: torch.dtype | None = None) -> Eagle3Head:
    from safetensors.torch import load_file

    folder = resolve_head(folder)
    cfg = config_from_folder(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise HeadFormatError(f"head folder {str(folder)!r} has no {WEIGHTS_FILE}")
    tensors = load_file(str(weights))
    validate_weights(tensors, cfg, str(folder))
    head = Eagle3Head(cfg)
    float_dtype = dtype or next(t.dtype for t in tensors.values() if t.is_floating_point())
    head.load_state_dict(tensors, strict=True)
    return head.to(device=device, dtype=float_dtype)
