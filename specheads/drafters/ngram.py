"""N-gram drafting: prompt lookup, no model."""

from __future__ import annotations

import torch

from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs
from specheads.runtime.tree import Tree, chain_tree


class NgramDrafter(Drafter):
    """Prompt lookup, on the host before each step: the tokens that followed the most recent
    earlier occurrence of the history's longest suffix (n-gram, n <= max_ngram). Each history keeps an index (n-gram ->
    latest start) that grows with it, so a step costs the new tokens, not the whole history."""

    needs = Needs(history=True)
    abilities = Abilities(on_device=False, trees=False, tiers=True)

    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 3):
        if num_draft_tokens < 1 or max_ngram < 1:
            raise ValueError(f"ngram needs num_draft_tokens >= 1 and max_ngram >= 1, got {num_draft_tokens}, {max_ngram}")
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
