"""What the head drafters share: checking a head against the target and the options given,
and the candidate pool of a dynamic (EAGLE-2-style) tree."""

from __future__ import annotations

import torch

from specheads.drafters import DrafterError, DraftSetup
from specheads.heads.registry import head_kind
from specheads.kernels.draft import select_tree
from specheads.runtime.defaults import tree_pool
from specheads.runtime.tree import Tree


def check_head_setup(setup: DraftSetup, options=("lm_head_int8",), static_trees: bool = False) -> None:
    """The head fits the target, and the setup asks only for what its drafter does."""
    kind = head_kind(setup.head.kind)
    problems = kind.mismatches(setup.head.config, setup.target.spec)
    if problems:
        raise DrafterError("draft head does not match the target: " + "; ".join(problems))
    if setup.static_tree and not static_trees:
        raise DrafterError(f"{kind.title} heads draft dynamic trees or chains (topk 1); static trees are not supported")
    unknown = set(setup.options) - set(options)
    if unknown:
        raise DrafterError(f"unknown {kind.name} drafter options {sorted(unknown)}; known: {sorted(options)}")


class CandidatePool:
    """A dynamic tree's candidates: the root's k children, then k * k children of a depth's k
    frontier nodes per deeper depth; the tree keeps the `num_draft` best by summed
    log-probability (kernels.draft.topk_expand fills the pool, select_tree picks)."""

    def __init__(self, steps: int, topk: int, num_draft_tokens: int | None):
        self.steps, self.topk = steps, topk
        self.size = tree_pool(steps, topk)
        self.num_draft = steps if topk == 1 else min(num_draft_tokens or self.size, self.size)

    def tier(self, shape, rows: int, device) -> "CandidatePool":
        """The pool of a smaller tree (a drafter's tier), allocated for the same rows."""
        pool = CandidatePool(shape.steps, shape.topk, shape.num_draft)
        pool.allocate(rows, device)
        return pool

    def allocate(self, rows: int, device) -> None:
        k = self.topk
        self.depth = torch.tensor([1] * k + [d for d in range(2, self.steps + 1) for _ in range(k * k)], device=device)
        self.zero_score = torch.zeros(rows, 1, dtype=torch.float32, device=device)
        self.no_parent = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.all_valid = torch.ones(rows, self.num_draft + 1, dtype=torch.bool, device=device)

    def buffers(self, b: int, device):
        """(tokens, scores, parents) of the pool for b rows, to be filled depth by depth."""
        return (torch.empty(b, self.size, dtype=torch.long, device=device),
                torch.empty(b, self.size, dtype=torch.float32, device=device),
                torch.empty(b, self.size, dtype=torch.long, device=device))

    def tree(self, roots: torch.Tensor, pool) -> Tree:
        b = roots.shape[0]
        tokens, parents, depths, ranks = select_tree(roots, *pool, self.depth.expand(b, -1), self.num_draft)
        return Tree(tokens, parents, depths, self.all_valid[:b], self.steps, ranks)


class HeadCacheRows:
    """Row state of a drafter that keeps its head's own KV cache (k, v [rows, kv heads, slots, d]),
    the number of committed entries, and the last step's pending entries (features, tokens, how
    many), fed at the start of the next step by the drafter's `_feed(b, kv, masks, width)` (the
    EAGLE-3 and EAGLE-1 drafters)."""

    def state(self) -> list[torch.Tensor]:
        """The small per-row tensors a step changes (the engine snapshots them around graph warm-up)."""
        return [self.committed, self.pending_aux, self.pending_tok, self.pending_n]

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.k[dst, :, :length] = self.k[src, :, :length]
        self.v[dst, :, :length] = self.v[src, :, :length]
        for t in self.state():
            t[dst] = t[src]

    def park_rows(self, start: int, stop: int) -> None:
        self.committed[start:stop] = 0

    def accept_depth(self, depth: int) -> None:
        """Room for a path `depth` deep among the pending entries (before `allocate`)."""
        self.width = max(self.width, depth + 1)

    def fed(self, ctx) -> int:
        """How many pending entries a row a step feeds: the engine's bound (`DraftContext.feed`)
        where it is narrower than the room `accept_depth` made (e.g. the n-gram assist's gated chain,
        which runs only in small batches), else that room."""
        return min(ctx.feed, self.width) if ctx.feed else self.width

    def keep_up(self, ctx, wide: bool = True) -> None:
        """A plain step: the pending entries fed (as a step's draft starts: `_feed`), no tree; after
        a plain step or a prefill only the first column (one entry a row)."""
        self._feed(ctx.rows, ctx.kv, width=self.fed(ctx) if wide else 1)

    def clear_row(self, row: int) -> None:
        # an idle row computes harmlessly inside a padded batch: one entry of its own to attend to
        # (fill_: `t[row] = number` copies a host scalar to the card and waits for the step in flight)
        for t, v in ((self.committed, 0), (self.pending_aux, 0), (self.pending_tok, 0), (self.pending_n, 1)):
            t[row].fill_(v)
