"""The Medusa drafter: each head's top-k tokens from the last committed position's hidden
state, combined into a tree by joint probability.

Row state: the target's feature (final hidden state) at the last committed position L-1,
taken in `commit` (the accepted path's last node) and `prefill` (the prompt's last token).
Depth d+1 candidates are head d's top-k tokens under every depth-d node (the same tokens
under each: Medusa heads do not see earlier drafts); the tree keeps the `num_draft_tokens`
best paths by summed log-probability (EAGLE-2's selection over a frontier of k nodes a depth).
"""

from __future__ import annotations

import torch

from specheads.drafters import DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult, tier_copy
from specheads.drafters.common import CandidatePool, check_head_setup
from specheads.kernels.draft import topk_expand
from specheads.runtime.tree import Tree


class MedusaDrafter(Drafter):
    abilities = Abilities(on_device=True, trees=True, tiers=True)

    def __init__(self, head, num_steps: int = 4, topk: int = 1, num_draft_tokens: int | None = None,
                 lm_head_int8: bool = True):
        self.head = head
        self.lm_head_int8 = lm_head_int8
        self.depth = self.steps = min(num_steps, head.config.num_heads)
        self.topk = topk
        self.pool = CandidatePool(self.steps, topk, num_draft_tokens)
        self.num_draft = self.pool.num_draft
        self.needs = Needs(capture_layers=tuple(head.config.target_layer_ids))

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "MedusaDrafter":
        check_head_setup(setup)
        return cls(setup.head, setup.num_steps, setup.topk, setup.num_draft_tokens, **setup.options)

    def prepare(self, device) -> None:
        """On CUDA: the heads read out on the fused projection kernel, in int8 (lm_head_int8,
        default True: drafts only, the target verifies every token)."""
        self.head.fuse_for_inference(lm_head_int8=self.lm_head_int8)

    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        return rows * self.head.config.target_hidden_size * elem

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        self.feature = torch.zeros(rows, 1, self.head.config.target_hidden_size, device=device, dtype=dtype)
        self.pool.allocate(rows, device)

    def tier(self, shape) -> "MedusaDrafter":
        """Fewer heads deep or a narrower tree from the same feature (its own pool)."""
        tier = tier_copy(self, shape)
        tier.pool = self.pool.tier(shape, self.feature.shape[0], self.feature.device)
        return tier

    def state(self) -> list[torch.Tensor]:
        return [self.feature]

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.feature[dst] = self.feature[src]

    def clear_row(self, row: int) -> None:
        self.feature[row].fill_(0)

    def prefill(self, batch: PrefillBatch) -> None:
        f = batch.features
        last = (batch.lens - 1)[:, None, None].expand(-1, 1, f.shape[-1])
        self.feature[batch.start: batch.start + f.shape[0]] = f.gather(1, last).to(self.feature.dtype)

    def accept_depth(self, depth: int) -> None:
        """Any path: a commit keeps its last node's feature alone."""

    def commit(self, step: StepResult) -> None:
        b, f = step.rows, step.features
        last = step.path.gather(1, (step.accepted - 1)[:, None])  # the path's last node
        self.feature[:b] = f.gather(1, last[:, :, None].expand(-1, 1, f.shape[-1])).to(self.feature.dtype)

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        """A plain step: nothing before the verify (its commit takes the root's feature)."""

    def propose(self, ctx: DraftContext) -> Tree:
        b, roots = ctx.rows, ctx.roots
        head, k = self.head, self.topk
        dev = roots.device
        logits_by_depth = head.draft_logits(self.feature[:b], self.steps)  # per drafted depth [b, 1, Vd]
        target_ids = head.target_ids()
        pool = pool_tok, pool_score, pool_parent = self.pool.buffers(b, dev)
        front_score, front_pool = self.pool.zero_score[:b], self.pool.no_parent[:b]
        off, width = 0, 1
        for d in range(self.steps):
            n = width * k
            # the same logits under every frontier node: read once a row (shared), in the head's dtype
            _, front_score, _, front_pool = topk_expand(
                logits_by_depth[d], front_score, front_pool, k, target_ids, pool_tok[:, off: off + n],
                pool_score[:, off: off + n], pool_parent[:, off: off + n], off, None, None, ctx.kv, 0, shared=True)[:4]
            off, width = off + n, k
        return self.pool.tree(roots, pool)
