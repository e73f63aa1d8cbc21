"""N-gram drafting: prompt lookup, no model.

Each row drafts the tokens that followed the latest earlier occurrence of its history's longest
suffix (an n-gram, n <= max_ngram) that occurs before; a continuation that runs into the suffix
itself repeats with the period it found. Two drafters propose the same chains:

- `DeviceNgramDrafter` (method `ngram`): the row's tokens live on the device and the lookup is one
  kernel over the context (kernels/ngram.py; its torch reference elsewhere), inside the step, so its steps are captured as one CUDA
  graph and run ahead of the host like a head's. On an H200 the host's lookup (below) cost a
  probe step under the adaptive policy 9-17 ms at batch 64, where a plain step took 1.1 ms: the
  indexes caught up with every token decoded since the last probe, and the step could not run
  ahead.
- `NgramDrafter` (method `ngram-host`): the lookup on the host, over an index per row that grows
  with its history: the reference the device one is tested against, and an example of a host
  drafter (the engine hands it each row's token history before the step).
"""

from __future__ import annotations

import torch

from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult, tier_copy
from specheads.kernels.ngram import ngram_lookup
from specheads.runtime.tree import Tree, chain_tree


def _check(num_draft_tokens: int, max_ngram: int) -> None:
    if num_draft_tokens < 1 or max_ngram < 1:
        raise ValueError(f"ngram needs num_draft_tokens >= 1 and max_ngram >= 1, got {num_draft_tokens}, {max_ngram}")


class DeviceNgramDrafter(Drafter):
    """Prompt lookup on the device. Row state: its tokens (the prompt, then every emitted token;
    the root, the last emitted one, at position L = `length`). A step's lookup: for n = 1..max_ngram
    the positions p <= L-1 where the n tokens ending at p equal the n ending at L (each n's matches
    are those of n-1 that also match one token further back), the latest p of the largest n that
    has one; the drafts are the tokens from p+1 on, position p+1 + (i mod (L-p)) for the i-th (the
    continuation repeats through the suffix). A row without a match drafts nothing."""

    abilities = Abilities(on_device=True, trees=False, tiers=True, first_draft=True)

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 3):
        _check(num_draft_tokens, max_ngram)
        self.num_draft = self.depth = num_draft_tokens
        self.max_ngram = max_ngram

    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        return rows * (cap + self.depth + 2) * 8

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        # room past the cache for a last step's writes (a row's tokens never pass its cache)
        self.tokens = torch.zeros(rows, cap + self.depth + 2, dtype=torch.long, device=device)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        self.cols = torch.arange(self.tokens.shape[1], device=device)
        self.draft_cols = torch.arange(self.num_draft, device=device)

    def tier(self, shape) -> "DeviceNgramDrafter":
        """A shorter chain over the same rows' tokens."""
        tier = tier_copy(self, shape)
        tier.draft_cols = self.draft_cols[: shape.num_draft]
        return tier

    def state(self) -> list[torch.Tensor]:
        return [self.length]  # (tokens past a row's length are never read)

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.tokens[dst] = self.tokens[src]
        self.length[dst] = self.length[src]

    def clear_row(self, row: int) -> None:
        self.length[row].fill_(0)  # (fill_: `= 0` would wait for the step in flight)

    def park_rows(self, start: int, stop: int) -> None:
        self.length[start:stop] = 0

    def prefill(self, batch: PrefillBatch) -> None:
        k, w = batch.ids.shape
        rows = self.tokens[batch.start: batch.start + k]
        rows[:, :w] = batch.ids
        rows.scatter_(1, batch.lens[:, None], batch.first[:, None])
        self.length[batch.start: batch.start + k] = batch.lens

    def commit(self, step: StepResult) -> None:
        """The emitted tokens (the target's after each path node) at L+1..L+accepted."""
        b = step.rows
        at = step.path.clamp(min=0)
        j = self.cols[: at.shape[1]]
        length = self.length[:b]
        discard = self.tokens.shape[1] - 1
        where = torch.where(j[None] < step.accepted[:, None], length[:, None] + 1 + j[None], discard)
        self.tokens[:b].scatter_(1, where, step.target_tokens.gather(1, at))
        length += step.accepted

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        """A plain step: nothing before the verify (its commit writes the token)."""

    def propose(self, ctx: DraftContext) -> Tree:
        drafts, found = self.lookup(ctx, self.draft_cols)
        return chain_tree(ctx.roots, drafts, found[:, None].expand_as(drafts))

    def first_draft(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        drafts, found = self.lookup(ctx, self.draft_cols[:1])
        return drafts[:, 0], found

    def lookup(self, ctx: DraftContext, draft_cols: torch.Tensor, min_ngram: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's drafts at the chain positions `draft_cols` [n] and whether it has any (a match of
        at least `min_ngram` tokens): ([b, n], [b]) (one kernel on the GPU: kernels/ngram.py)."""
        b = ctx.rows
        w = min(ctx.kv + 1, self.tokens.shape[1])  # the root sits inside the step's context bucket
        return ngram_lookup(self.tokens[:b, :w], self.length[:b], ctx.roots, draft_cols, self.max_ngram, min_ngram)


class NgramDrafter(Drafter):
    """Prompt lookup, on the host before each step (the reference of DeviceNgramDrafter): the
    tokens that followed the most recent earlier occurrence of the history's longest suffix
    (n-gram, n <= max_ngram). Each history keeps an index (n-gram -> latest start) that grows
    with it, so a step costs the new tokens, not the whole history."""

    needs = Needs(history=True)
    abilities = Abilities(on_device=False, trees=False, tiers=True)

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 3):
        _check(num_draft_tokens, max_ngram)
        self.num_draft = num_draft_tokens
        self.depth = num_draft_tokens
        self.max_ngram = max_ngram
        self._index: dict[int, _NgramIndex] = {}  # id(history) -> its index (the engine appends in place)

    def tier(self, shape) -> "NgramDrafter":
        """A shorter chain, sharing the histories' indexes."""
        tier = NgramDrafter(shape.num_draft, self.max_ngram)
        tier._index = self._index
        return tier

    def propose(self, ctx: DraftContext) -> Tree:
        histories, roots = ctx.histories, ctx.roots
        b = len(histories)
        drafts = torch.zeros(b, self.num_draft, dtype=torch.long)
        valid = torch.zeros(b, self.num_draft, dtype=torch.bool)
        live = {id(seq) for seq in histories}
        for k in [k for k in self._index if k not in live]:  # finished requests drop theirs (in place: tiers share it)
            del self._index[k]
        offered = []
        for i, seq in enumerate(histories):
            cont = self._lookup(seq)
            drafts[i, : len(cont)] = torch.as_tensor(cont, dtype=torch.long)
            valid[i, : len(cont)] = True
            offered.append(len(cont))
        dev = roots.device
        tree = chain_tree(roots, drafts.to(dev), valid.to(dev))
        tree.offered = offered
        return tree

    def _lookup(self, seq: list[int]) -> list[int]:
        index = self._index.get(id(seq))
        if index is None or index.seq is not seq or index.length > len(seq):
            index = self._index[id(seq)] = _NgramIndex(seq, self.max_ngram)
        index.update()
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            start = index.latest[n - 1].get(tuple(seq[-n:]))
            if start is not None:
                # the continuation may run into the suffix itself: copy forward, overlapping
                cont: list[int] = []
                for i in range(self.num_draft):
                    j = start + n + i
                    cont.append(seq[j] if j < len(seq) else cont[j - len(seq)])
                return cont
        return []


class _NgramIndex:
    """For n = 1..max_ngram: n-gram -> its latest start among those that end before the
    history's last token (so the suffix itself is never its own match)."""

    def __init__(self, seq: list[int], max_ngram: int):
        self.seq = seq
        self.latest: list[dict] = [{} for _ in range(max_ngram)]
        self.done = [0] * max_ngram  # starts indexed so far, per n
        self.length = 0

    def update(self) -> None:
        seq, length = self.seq, len(self.seq)
        for n, table in enumerate(self.latest, start=1):
            for s in range(self.done[n - 1], max(length - n, 0)):
                table[tuple(seq[s: s + n])] = s
            self.done[n - 1] = max(self.done[n - 1], length - n)
        self.length = length
