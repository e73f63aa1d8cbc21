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

from specheads.drafters import DrafterError, DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult
from specheads.heads.registry import head_kind
from specheads.kernels.draft import select_tree, topk_expand
from specheads.runtime.tree import Tree


class MedusaDrafter(Drafter):
    abilities = Abilities(on_device=True, trees=True)

    def __init__(self, head, num_steps: int = 4, topk: int = 1, num_draft_tokens: int | None = None):
        self.head = head
        self.depth = self.steps = min(num_steps, head.config.num_heads)
        self.topk = topk
        n_pool = topk + (self.steps - 1) * topk * topk
        self.num_draft = self.steps if topk == 1 else min(num_draft_tokens or n_pool, n_pool)
        self.needs = Needs(capture_layers=tuple(head.config.target_layer_ids))

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "MedusaDrafter":
        problems = head_kind(setup.head.kind).mismatches(setup.head.config, setup.target.spec)
        if problems:
            raise DrafterError("draft head does not match the target: " + "; ".join(problems))
        if setup.static_tree:
            raise DrafterError("Medusa heads draft dynamic trees or chains (topk 1); static trees are not supported")
        if set(setup.options) - {"lm_head_int8"}:
            raise DrafterError(f"unknown medusa drafter options {sorted(set(setup.options) - {'lm_head_int8'})}")
        return cls(setup.head, setup.num_steps, setup.topk, setup.num_draft_tokens)

    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        return rows * self.head.config.target_hidden_size * elem

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        self.feature = torch.zeros(rows, 1, self.head.config.target_hidden_size, device=device, dtype=dtype)
        k = self.topk
        self.pool_depth = torch.tensor([1] * k + [d for d in range(2, self.steps + 1) for _ in range(k * k)],
                                       device=device)
        self.zero_score = torch.zeros(rows, 1, dtype=torch.float32, device=device)
        self.no_parent = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.all_valid = torch.ones(rows, self.num_draft + 1, dtype=torch.bool, device=device)

    def state(self) -> list[torch.Tensor]:
        return [self.feature]

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.feature[dst] = self.feature[src]

    def clear_row(self, row: int) -> None:
        self.feature[row] = 0

    def prefill(self, batch: PrefillBatch) -> None:
        f = batch.features
        last = (batch.lens - 1)[:, None, None].expand(-1, 1, f.shape[-1])
        self.feature[batch.start: batch.start + f.shape[0]] = f.gather(1, last).to(self.feature.dtype)

    def commit(self, step: StepResult) -> None:
        b, f = step.rows, step.features
        last = step.path.gather(1, (step.accepted - 1)[:, None])  # the path's last node
        self.feature[:b] = f.gather(1, last[:, :, None].expand(-1, 1, f.shape[-1])).to(self.feature.dtype)

    def propose(self, ctx: DraftContext) -> Tree:
        b, roots = ctx.rows, ctx.roots
        head, k = self.head, self.topk
        dev = roots.device
        feats = head.features(self.feature[:b])  # per head [b, 1, H]
        target_ids = head.target_ids()
        n_pool = self.pool_depth.numel()
        pool_tok = torch.empty(b, n_pool, dtype=torch.long, device=dev)
        pool_score = torch.empty(b, n_pool, dtype=torch.float32, device=dev)
        pool_parent = torch.empty(b, n_pool, dtype=torch.long, device=dev)
        front_score, front_pool = self.zero_score[:b], self.no_parent[:b]
        off, width = 0, 1
        for d in range(self.steps):
            # the same logits under every frontier node
            logits = head.logits(feats[d], d).float().expand(b, width, -1).contiguous()
            n = width * k
            _, front_score, _, front_pool = topk_expand(
                logits, front_score, front_pool, k, target_ids, pool_tok[:, off: off + n], pool_score[:, off: off + n],
                pool_parent[:, off: off + n], off, None, None, ctx.kv, 0)[:4]
            off, width = off + n, k
        tokens, parents, depths, ranks = select_tree(roots, pool_tok, pool_score, pool_parent,
                                                     self.pool_depth.expand(b, -1), self.num_draft)
        return Tree(tokens, parents, depths, self.all_valid[:b], self.steps, ranks)
