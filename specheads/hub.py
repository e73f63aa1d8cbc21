"""Export heads for one serving engine.

`<run>/final/` already loads in both SGLang and vLLM (it carries both layer-id keys).
`export --format sglang|vllm` writes a folder with only the keys that engine reads, in its
own convention, so nothing depends on which key an engine version prefers:
  sglang: `eagle_config.eagle_aux_hidden_state_layer_ids` = outputs of layers (ours);
  vllm:   top-level `eagle_aux_hidden_state_layer_ids` = inputs of layers (ours + 1).
The head is validated on load (names, shapes, dtypes, d2t/t2d, no embed_tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specheads.heads.format import CONFIG_FILE, META_FILE, hf_config, load_head, save_head

FORMATS = ("sglang", "vllm")

LAUNCH = {
    "sglang": ("python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
               "--speculative-draft-model-path {folder} --speculative-num-steps 5 --speculative-eagle-topk 4 "
               "--speculative-num-draft-tokens 16"),
    "vllm": ("vllm serve {target} --speculative-config "
             "'{{\"method\": \"eagle3\", \"model\": \"{folder}\", \"num_speculative_tokens\": 5}}'"),
}


def engine_config(head, fmt: str, dtype: torch.dtype, target_name: str | None) -> dict:
    cfg = hf_config(head.config, dtype, target_name)
    if fmt == "sglang":
        del cfg["eagle_aux_hidden_state_layer_ids"]
    elif fmt == "vllm":
        cfg["eagle_config"] = {"use_aux_hidden_state": True}
    else:
        raise ValueError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    return cfg


def export_head(src: str | Path, fmt: str, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    src, out = Path(src), Path(out)
    head = load_head(src)
    meta = json.loads((src / META_FILE).read_text()) if (src / META_FILE).is_file() else {}
    dtype = dtype or next(p.dtype for p in head.parameters())
    target_name = json.loads((src / CONFIG_FILE).read_text()).get("specheads_target")
    save_head(head, out, dtype, {k: v for k, v in meta.items() if k not in ("kind", "config", "layer_id_convention")},
              target_name=target_name)
    (out / CONFIG_FILE).write_text(json.dumps(engine_config(head, fmt, dtype, target_name), indent=2) + "\n")
    launch = LAUNCH[fmt].format(target=target_name or "<target>", folder=out)
    (out / "SERVING.md").write_text(f"# Serve with {fmt}\n\n    {launch}\n")
    return out
