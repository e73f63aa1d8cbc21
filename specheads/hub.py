"""Head folders from and for the Hub, and exports for one serving engine.

`resolve_head` turns a `--draft` spec into a local folder: an existing path wins, else
`org/name[@revision]` is fetched with `snapshot_download` (the Hugging Face cache, its token
and HF_HUB_OFFLINE apply).

`<run>/final/` already loads in the engines its kind supports (an EAGLE-3 folder carries both
SGLang's and vLLM's layer-id keys). `export --format FORMAT` writes a folder with the
config.json that one engine reads, from the head kind's exporter for that format, with the
kind's architecture names for it (`specheads.heads.registry`).
The head is validated on load (names, shapes, dtypes, d2t/t2d, no embed_tokens).
The launch command in the export's SERVING.md runs as written: the target is its hub id where
one is known, else a placeholder that the text says to fill in.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specheads.heads.fetch import (DEFAULT_TARGET_HUB_ID, HEAD_FILES, REPO_ID, HubError, base_model_id,  # noqa: F401
                                   check_repo_id, resolve_head)  # (re-exported)
from specheads.heads.format import CONFIG_FILE, META_FILE, WEIGHTS_FILE, load_head, save_head
from specheads.heads.registry import HeadKind, HeadKindError, head_kind, head_kinds, kind_of

# stands for the target in a launch command when its hub id is not known
TARGET_PLACEHOLDER = "<path or hub id of the target>"


def export_formats(kind: str | None = None) -> tuple[str, ...]:
    """The export formats of one head kind, or of every registered kind."""
    kinds = [kind] if kind is not None else head_kinds()
    return tuple(dict.fromkeys(fmt for k in kinds for fmt in head_kind(k).exporters))


# the speculators layouts specheads writes, for a kind that has none and says no more (the built-in
# MTP and Medusa kinds give their own reasons: their configs' refused_exports)
SPECULATORS_KINDS = ("specheads writes speculators' eagle3 type (speculators 0.9.0) for EAGLE-3 heads, its eagle "
                     "type (speculators 0.4.0, docs/formats/speculators-eagle.md) for EAGLE-1 heads and its mtp type "
                     "(speculators 0.9.0) for one-module MTP heads of Qwen3-family targets")


def _exporter(kind: HeadKind, fmt: str):
    if fmt not in kind.exporters:
        if fmt == "speculators":
            raise HeadKindError(f"{kind.title} heads have no speculators layout: {SPECULATORS_KINDS}; "
                                f"{kind.name} heads export to: {', '.join(kind.exporters) or 'nothing'}")
        if not set(kind.exporters) - {"speculators"}:  # no serving engine's layout (speculators' is a library's)
            also = f" ({kind.name} heads export to: speculators)" if kind.exporters else ""
            raise HeadKindError(f"{kind.title} heads have no {fmt} export: no public engine loads this kind for a "
                                f"target that does not ship it; the head folder itself runs with `specheads serve`{also}")
        raise HeadKindError(f"export format {fmt!r} is not one of {kind.name} heads' formats: "
                            f"{', '.join(kind.exporters)}")
    return kind.exporters[fmt]


def engine_config(head, fmt: str, dtype: torch.dtype, target_name: str | None) -> dict:
    """The config.json that engine `fmt` reads for `head`: its kind's exporter and architecture names."""
    kind = kind_of(head)
    refused = getattr(head.config, "refused_exports", dict)()  # a shape that engine's loader does not take
    if fmt in refused:
        raise HeadKindError(refused[fmt])
    cfg = _exporter(kind, fmt)(head, dtype, target_name)
    cfg["architectures"] = list(kind.hub_architectures[fmt])
    cfg["specheads_kind"] = kind.name
    return cfg


def serving_md(fmt: str, target_name: str | None, folder: Path, launch: str) -> str:
    """SERVING.md: the launch command (`launch`, with {target} and {folder}), last, with the target
    as the engine must be given it."""
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
    return "\n".join(lines + ["    " + launch.format(target=target, folder=folder)]) + "\n"


def export_head(src: str | Path, fmt: str, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the head at `src` (a folder or hub id) to `out` for engine `fmt`, one of its kind's formats."""
    src, out = resolve_head(src), Path(out)
    head = load_head(src)
    kind = kind_of(head)
    meta = json.loads((src / META_FILE).read_text()) if (src / META_FILE).is_file() else {}
    dtype = dtype or next(p.dtype for p in head.parameters())
    target_name = json.loads((src / CONFIG_FILE).read_text()).get("specheads_target")
    config = engine_config(head, fmt, dtype, target_name)  # an unknown or refused format fails before anything is written
    why = kind.export_checks[fmt](meta) if fmt in kind.export_checks else None
    if why:
        raise HeadKindError(why)
    save_head(head, out, dtype, {k: v for k, v in meta.items() if k not in ("kind", "config", "layer_id_convention")},
              target_name=target_name)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if fmt in kind.tensor_exporters:  # that engine's own tensor names: the folder is no longer ours to load
        from safetensors.torch import load_file, save_file

        tensors = kind.tensor_exporters[fmt](load_file(out / WEIGHTS_FILE), head.config)
        save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        (out / META_FILE).unlink()
    if fmt in kind.launch:
        (out / "SERVING.md").write_text(serving_md(fmt, target_name, out.resolve(), kind.launch[fmt]))
    return out
