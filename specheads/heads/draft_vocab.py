"""The draft vocabulary of a head: d2t (draft id -> offset to its target id) and t2d (target id
-> in the draft vocabulary), the buffers and lookups every head kind with a draft vocabulary shares."""

from __future__ import annotations

import torch


class DraftVocab:
    """Mixin for head modules whose config has vocab_size and draft_vocab_size."""

    def _init_draft_vocab(self, cfg) -> None:
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool) if cfg.draft_vocab_size == cfg.vocab_size
                             else torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(
                f"vocab map shapes d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)} do not match the head's "
                f"draft_vocab_size {self.config.draft_vocab_size} and vocab_size {self.config.vocab_size}")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def target_rows(self) -> torch.Tensor:
        """Target token id of each draft id, [draft_vocab]."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def target_ids(self) -> torch.Tensor:
        return self.target_rows()

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.target_rows()[draft_ids]
