"""Draft vocabulary: the most frequent loss-masked target tokens.

`d2t[i]` is an int64 offset, so target_id = i + d2t[i]; draft ids keep the target's
order (ascending). `t2d` is a bool mask over the target vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB_FILE = "vocab_map.safetensors"


def token_frequencies(rows, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for row in rows:
        ids = torch.as_tensor(row["input_ids"], dtype=torch.int64)
        mask = torch.as_tensor(row["loss_mask"], dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab_size} (the target vocab)")
    # most frequent first; ties (including never-seen tokens) broken by lower id
    order = torch.argsort(counts * vocab_size + (vocab_size - 1 - torch.arange(vocab_size)), descending=True)
    draft_ids = torch.sort(order[:draft_vocab_size]).values
    d2t = draft_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def save_vocab_map(path: Path, d2t: torch.Tensor, t2d: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    from safetensors.torch import save_file

    tensors = {"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}
    if counts is not None:
        tensors["counts"] = counts.contiguous()
    save_file(tensors, str(path))


def load_vocab_map(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file

    t = load_file(str(path))
    return t["d2t"], t["t2d"]
