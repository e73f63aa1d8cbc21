"""What head kinds share: the draft vocabulary (d2t: draft id -> offset to its target id; t2d:
target id -> in the draft vocabulary), its buffers and lookups; and the fit check of heads that
read one target hidden state at the target's width."""

from __future__ import annotations

import torch

from specheads.heads.fused_layer import keep_in_place


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
        if getattr(self, "fused", False):
            self.keep_target_ids()

    def target_rows(self) -> torch.Tensor:
        """Target token id of each draft id, [draft_vocab]."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def keep_target_ids(self) -> None:
        """While the head is fused for drafting (fuse_for_inference calls this): each draft id's
        target id kept, one lookup a drafted depth instead of two launches to work it out."""
        keep_in_place(self, "_target_ids", self.target_rows())

    def target_ids(self) -> torch.Tensor:
        """Target token id of each draft id [draft_vocab]: kept while fused for drafting."""
        return self._target_ids if getattr(self, "fused", False) else self.target_rows()

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.target_ids()[draft_ids]


@torch.no_grad()
def readout_from_target(head, target, lm_heads, norms=()) -> None:
    """Start a head's draft-vocabulary lm_heads as the target's lm_head rows of the draft vocab
    (the head's vocab map set first) and its final norms as the target's final norm."""
    rows = head.target_rows().to(target.lm_head.weight.device)
    weight = target.lm_head.weight[rows]
    for lm_head in lm_heads:
        lm_head.weight.copy_(weight.to(lm_head.weight.device, lm_head.weight.dtype))
    for norm in norms:
        norm.weight.copy_(target.model.norm.weight.to(norm.weight.device, norm.weight.dtype))


def one_feature_mismatches(cfg, spec) -> list[str]:
    """What keeps a head that reads one target hidden state (cfg.target_layer_ids[0], at the
    target's width) from running on a target of spec `spec` (empty: it fits)."""
    problems = []
    if cfg.hidden_size != spec.hidden_size:
        problems.append(f"head hidden size {cfg.hidden_size} differs from the target's {spec.hidden_size}")
    if cfg.vocab_size != spec.vocab_size:
        problems.append(f"head expects vocab {cfg.vocab_size}, target has {spec.vocab_size}")
    if cfg.target_layer_ids[0] > spec.num_hidden_layers:
        problems.append(f"head reads target layer {cfg.target_layer_ids[0]}, target has {spec.num_hidden_layers}")
    return problems
