"""Prepared data for training: load, length-grouped deterministic batches, collate.

Batch order is a pure function of (seed, epoch, rank, world), so a resumed run at
optimizer step s replays exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from specheads.data.prepare import REPORT_FILE
from specheads.data.vocab import VOCAB_FILE, load_vocab_map


class PreparedDataError(ValueError):
    pass


@dataclass
class PreparedData:
    train_ids: list[torch.Tensor]
    train_mask: list[torch.Tensor]
    eval_ids: list[torch.Tensor]
    eval_mask: list[torch.Tensor]
    d2t: torch.Tensor
    t2d: torch.Tensor
    report: dict


def load_prepared(path: str | Path, max_length: int | None = None) -> PreparedData:
    from datasets import load_from_disk

    folder = Path(path)
    if not folder.is_dir():
        raise PreparedDataError(
            f"data folder {str(folder)!r} does not exist; run `specheads prepare --output {folder}` first"
        )
    if not (folder / VOCAB_FILE).is_file():
        raise PreparedDataError(f"data folder {str(folder)!r} has no {VOCAB_FILE}; was it written by `specheads prepare`?")
    ds = load_from_disk(str(folder))
    report = json.loads((folder / REPORT_FILE).read_text()) if (folder / REPORT_FILE).is_file() else {}

    def split(name):
        if name not in ds:
            return [], []
        cut = slice(0, max_length)
        rows = ds[name].with_format("numpy")
        ids = [torch.as_tensor(r[cut], dtype=torch.int64) for r in rows["input_ids"]]
        mask = [torch.as_tensor(r[cut], dtype=torch.int64) for r in rows["loss_mask"]]
        return ids, mask

    train_ids, train_mask = split("train")
    eval_ids, eval_mask = split("eval")
    if not train_ids:
        raise PreparedDataError(f"data folder {str(folder)!r} has an empty train split")
    d2t, t2d = load_vocab_map(folder / VOCAB_FILE)
    return PreparedData(train_ids, train_mask, eval_ids, eval_mask, d2t, t2d, report)


def epoch_batches(lengths: list[int], batch_size: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
                  per_step: int | None = None) -> list[list[int]]:
    """Shuffled, length-grouped batches of indices for one rank; every rank gets as many. The
    epoch's batches are one list whatever the number of ranks (rank r takes every world-th from
    r), so optimizer step s, of per_step micro-batches over all ranks (world x grad_accum),
    takes batches s * per_step ... whichever ranks and accumulation share them; the epoch's tail
    short of a whole step is dropped (per_step None: world)."""
    rng = random.Random(seed * 1000003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    group = batch_size * 64
    batches = []
    for g in range(0, len(order), group):
        chunk = sorted(order[g : g + group], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    per_step = per_step or world
    if per_step % world:
        raise ValueError(f"epoch_batches: per_step {per_step} is not a multiple of world {world}")
    per_rank = max(len(batches) // per_step * per_step // world, 1)
    mine = batches[rank::world][:per_rank]
    while len(mine) < per_rank:  # fewer batches than ranks: reuse
        mine.append(batches[len(mine) % len(batches)])
    return mine


def collate(ids: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest row; padding has loss_mask 0."""
    width = max(len(x) for x in ids)
    out_ids = torch.zeros(len(ids), width, dtype=torch.int64)
    out_mask = torch.zeros(len(ids), width, dtype=torch.int64)
    for i, (x, m) in enumerate(zip(ids, masks)):
        out_ids[i, : len(x)] = x
        out_mask[i, : len(m)] = m
    return out_ids, out_mask
