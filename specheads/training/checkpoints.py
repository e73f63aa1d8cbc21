"""Checkpoint folders on disk: the checksum manifest, the `done` marker, the choice of the
newest intact checkpoint, and loading state files without unpickling arbitrary objects.

A checkpoint `checkpoints/step_N/` is finished once `done` exists. `checksums.json`, written
last before `done`, lists every other file of the folder (ours, or DeepSpeed's own) with its
size and sha256: a file that was cut short, overwritten or swapped after the save is found
before anything reads it.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from specheads.files import sha256_file

MANIFEST = "checksums.json"
DONE = "done"
REJECTED_PREFIX = "rejected_"  # a checkpoint that failed verification, kept for inspection


def finished_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint that was written to the end, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        (int(p.name.split("_")[1]), p) for p in ckpt_dir.iterdir() if p.name.startswith("step_") and (p / DONE).exists()
    )


def prune_checkpoints(ckpt_dir: Path, keep: int) -> None:
    for _, p in finished_checkpoints(ckpt_dir)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def write_done(folder: Path, step: int) -> None:
    (folder / DONE).write_text(str(step))


def _checkpoint_files(folder: Path) -> list[str]:
    """Relative paths of the files the manifest covers: all but itself, its temp file and `done`."""
    skip = {MANIFEST, MANIFEST + ".tmp", DONE}
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name not in skip)


def write_manifest(folder: Path) -> None:
    """checksums.json over every file of the folder; tmp + rename, so a manifest is whole or absent."""
    files = {rel: {"sha256": sha256_file(folder / rel), "size": (folder / rel).stat().st_size}
             for rel in _checkpoint_files(folder)}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


def checkpoint_problem(folder: Path, safe_globals: list | None = None) -> str | None:
    """Why the checkpoint folder cannot be resumed from (naming the file), or None if it is intact:
    every file of its manifest present with the recorded size and sha256, no file the manifest does
    not list, and no pickled object in a .pt file that a weights_only load would refuse."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"it has no {MANIFEST} (written by an older specheads, or its save was cut short)"
    try:
        listed = json.loads(manifest.read_text())["files"]
        entries = {rel: (int(e["size"]), str(e["sha256"])) for rel, e in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__}: {e})"
    for rel, (size, digest) in entries.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return f"{MANIFEST} lists {rel!r}, a path outside the checkpoint"
        path = folder / rel
        if not path.is_file():
            return f"file {rel} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"file {rel} has {actual} bytes, {MANIFEST} says {size} (truncated or rewritten)"
        if sha256_file(path) != digest:
            return f"file {rel} does not match its sha256 in {MANIFEST} (overwritten or corrupted)"
    unlisted = [rel for rel in _checkpoint_files(folder) if rel not in entries]
    if unlisted:
        return f"file {unlisted[0]} is not listed in {MANIFEST}"
    for rel in entries:
        if rel.endswith(".pt"):
            with allowed_globals(safe_globals):
                refused = torch.serialization.get_unsafe_globals_in_checkpoint(str(folder / rel))
            if refused:
                return f"file {rel} pickles {refused}, which a weights_only load refuses"
    return None


def reject_checkpoint(folder: Path) -> Path:
    """Move a checkpoint that failed verification out of the resume order (and out of pruning's
    count, which would otherwise keep it in place of an intact one); it stays on disk."""
    target = folder.with_name(REJECTED_PREFIX + folder.name)
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{REJECTED_PREFIX}{folder.name}.{n}")
    os.replace(folder, target)
    return target


@contextmanager
def allowed_globals(classes: list | None):
    if classes:
        with torch.serialization.safe_globals(classes):
            yield
    else:
        yield


def load_state(path: Path, map_location="cpu", safe_globals: list | None = None):
    """torch.load with weights_only=True: tensors and plain containers, plus the given classes."""
    with allowed_globals(safe_globals):
        return torch.load(path, map_location=map_location, weights_only=True)


def deepspeed_safe_globals() -> list:
    """The classes DeepSpeed's ZeRO-1/2 optimizer files pickle besides tensors and containers (found
    with torch.serialization.get_unsafe_globals_in_checkpoint on a real save): the stage enum, the
    parameter fragment addresses, and the loss scaler (static, or dynamic with fp16)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, fragment_address, LossScaler, DynamicLossScaler]


def load_deepspeed_weights_only(engine) -> None:
    """DeepSpeed's TorchCheckpointEngine.load calls torch.load(weights_only=False); every file its
    load_checkpoint reads goes through engine.checkpoint_engine.load, so replacing that one method
    makes the whole load weights_only, with DeepSpeed's own classes allowed."""
    classes = deepspeed_safe_globals()

    def load(path, map_location=None):
        return load_state(path, map_location=map_location, safe_globals=classes)

    engine.checkpoint_engine.load = load
