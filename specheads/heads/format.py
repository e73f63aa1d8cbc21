"""Head folders: `config.json` + `model.safetensors` (+ `specheads.json`), as SGLang and vLLM load them.

The folder's kind picks the registry entry that reads and checks it: specheads.json names it
("kind"; a folder written before kinds were recorded holds the default kind). A folder
without specheads.json (another tool wrote it) is known by config.json's `architectures`,
and by its `specheads_kind` where specheads wrote it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specheads.heads.fetch import resolve_head  # a hub id becomes its cached snapshot folder
from specheads.heads.kind import HeadFormatError  # noqa: F401  (there: heads raise it without this module)
from specheads.heads.registry import DEFAULT_KIND, HeadKind, HeadKindError, head_kind, head_kinds, kind_of
from specheads.runtime.defaults import tree_pool

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "specheads.json"
TREE_KEY = "tree"  # specheads.json: the tree this head drafts by default, chosen on the validation split
TREE_FIELDS = ("num_steps", "topk", "num_draft_tokens")




def hf_config(cfg, dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json of a head folder of config `cfg` (its kind's keys, and the kind's name)."""
    return {**cfg.to_hf(dtype, target_name), "specheads_kind": kind_of(cfg).name}


def save_head(head, folder: str | Path, dtype: torch.dtype = torch.bfloat16, meta: dict | None = None,
              target_name: str | None = None) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kind, cfg = kind_of(head), head.config
    names = kind.weights(cfg)
    tensors = {}
    for name, t in head.state_dict().items():
        if name not in names:
            continue
        t = t.detach().cpu()
        tensors[name] = t.to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config(cfg, dtype, target_name), indent=2) + "\n")
    info = {"kind": kind.name, "layer_id_convention": "output of 0-based target decoder layer",
            "config": cfg.to_dict(), **(meta or {})}
    (folder / META_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
    return folder


def _a(title: str) -> str:
    return ("an " if title[:1].upper() in "AEIOU" else "a ") + title


def read_folder_config(folder: Path) -> tuple[HeadKind, object]:
    """The kind and the config of a head folder."""
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise HeadFormatError(f"head folder {str(folder)!r} has no {CONFIG_FILE}")
    raw = json.loads(config_path.read_text())
    meta_path = folder / META_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        kind = _known_kind(meta.get("kind", DEFAULT_KIND), meta_path)
        return kind, kind.config.from_dict(meta["config"])
    # a head written by another tool: the kind from config.json, the config from its keys
    archs = raw.get("architectures") or []
    kinds = [head_kind(k) for k in head_kinds()]
    matching = [k for k in kinds if set(archs) & set(k.architectures())]
    if raw.get("specheads_kind") is not None:
        kind = _known_kind(raw["specheads_kind"], config_path)
        if kind.architectures() and kind not in matching:
            raise HeadFormatError(f"{config_path}: architectures {raw.get('architectures')} is not "
                                  f"{_a(kind.title)} head ({kind.name}: {', '.join(kind.architectures())})")
    elif matching:
        kind = matching[0]
    else:
        known = "; ".join(f"{k.name}: {', '.join(k.architectures())}" for k in kinds)
        raise HeadFormatError(f"{config_path}: architectures {raw.get('architectures')} is not "
                              f"{' nor '.join(_a(k.title) + ' head' for k in kinds)} (known architectures: {known})")
    return kind, kind.config.from_hf(raw)


def _known_kind(name, where: Path) -> HeadKind:
    try:
        return head_kind(name)
    except HeadKindError:
        raise HeadFormatError(f"{where} names head kind {name!r}, which this specheads does not know "
                              f"(known kinds: {', '.join(head_kinds())}); update specheads or fix the kind") from None


def config_from_folder(folder: Path):
    return read_folder_config(folder)[1]


def validate_weights(tensors: dict, cfg, where: str) -> None:
    """Names and shapes from the config's kind, no embed_tokens, finite values, and a consistent
    vocab map (d2t int64, t2d bool, t2d True exactly at the draft tokens' target ids)."""
    expected = kind_of(cfg).weights(cfg)
    problems = []
    if any("embed_tokens" in k for k in tensors):
        problems.append("contains embed_tokens (the target's embeddings must not be saved)")
    for name, want in expected.items():
        if name not in tensors:
            problems.append(f"missing tensor {name}")
            continue
        if tuple(tensors[name].shape) != tuple(want):
            problems.append(f"{name} has shape {tuple(tensors[name].shape)}, expected {tuple(want)}")
    extra = sorted(set(tensors) - set(expected) - {k for k in tensors if "embed_tokens" in k})
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
        n_draft = tensors["d2t"].numel()
        target_ids = torch.arange(n_draft) + tensors["d2t"]
        if int(tensors["t2d"].sum()) != n_draft or not bool(tensors["t2d"][target_ids].all()):
            problems.append("d2t and t2d disagree (t2d must be True exactly at the draft tokens' target ids)")
    if problems:
        raise HeadFormatError(f"head {where} failed validation: " + "; ".join(problems))


def load_head(folder: str | Path, device="cpu", dtype: torch.dtype | None = None):
    """The head saved in `folder` (or under a hub id), validated, as its kind's module."""
    from safetensors.torch import load_file

    folder = resolve_head(folder)
    kind, cfg = read_folder_config(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise HeadFormatError(f"head folder {str(folder)!r} has no {WEIGHTS_FILE}")
    tensors = load_file(str(weights))
    if kind.tensor_importer is not None:  # a folder in one of the kind's engine layouts: the head's own names
        tensors = kind.tensor_importer(json.loads((folder / CONFIG_FILE).read_text()), tensors)
    validate_weights(tensors, cfg, str(folder))
    head = kind.module(cfg)
    float_dtype = dtype or next(t.dtype for t in tensors.values() if t.is_floating_point())
    head.load_state_dict(tensors, strict=True)
    head.tree = head_tree(folder) or kind.default_tree  # None: the runtime's default tree
    return head.to(device=device, dtype=float_dtype)


def head_tree(folder: str | Path) -> tuple[int, int, int] | None:
    """The (num_steps, topk, num_draft_tokens) a head folder's specheads.json names as its default
    tree (`specheads evaluate --save-tree` writes it), checked; None when it names none."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get(TREE_KEY)
    if entry is None:
        return None
    want = (f"expected {{\"num_steps\": S, \"topk\": K, \"num_draft_tokens\": N}} with S, K >= 1 and "
            "1 <= N <= K + (S - 1) K^2 (the nodes a tree of that depth and branching can hold)")
    try:
        steps, topk, n = (entry[f] for f in TREE_FIELDS)
    except (KeyError, TypeError):
        raise HeadFormatError(f"{path}: {TREE_KEY!r} is {entry!r}; {want}") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (steps, topk, n)) \
            or steps < 1 or topk < 1 or not 1 <= n <= tree_pool(steps, topk):
        raise HeadFormatError(f"{path}: {TREE_KEY!r} is {entry!r}; {want}")
    return steps, topk, n


def save_head_tree(folder: str | Path, tree: tuple[int, int, int], chosen_on: dict) -> Path:
    """Record `tree` as the head's default in its specheads.json, with how it was chosen."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise HeadFormatError(f"{folder}: no {META_FILE} to record the tree in (a head folder written by specheads)")
    meta = json.loads(path.read_text())
    meta[TREE_KEY] = {**dict(zip(TREE_FIELDS, (int(v) for v in tree))), "chosen_on": chosen_on}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    tmp.replace(path)
    head_tree(folder)  # what was written reads back
    return path
