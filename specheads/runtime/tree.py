"""Draft trees, batched: node 0 is the root (the last accepted token), nodes are ordered so
that every parent comes before its children.

tokens [B, N+1] target token ids; parents [B, N+1] (root: -1); depth [B, N+1];
valid [B, N+1] (padding nodes can never be accepted); anc [B, N+1, N+1] ancestor-or-self.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specheads.kernels.verify import ancestors_reference
from specheads.runtime.sampling import InvalidRequest


@dataclass
class Tree:
    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    max_depth: int  # known on the host: no device sync to read it
    rank: torch.Tensor | None = None  # [B, N+1] order of the nodes by draft score (root 0); None: node order
    # a host drafter's chain: each row's draft tokens before its first padding node, known on the host
    # (None: not known); the policy then weighs only the rows that draft something
    offered: list[int] | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def chain_prefix(self, size: int) -> "Tree":
        """A chain's first `size` nodes (the root included): a shorter chain of the same drafts."""
        if size == self.size:
            return self
        offered = None if self.offered is None else [min(o, size - 1) for o in self.offered]
        return Tree(self.tokens[:, :size], self.parents[:, :size], self.depth[:, :size], self.valid[:, :size],
                    size - 1, None, offered)

    def ranks(self) -> torch.Tensor:
        """Parents always rank before their children, so the nodes of rank <= n form a tree."""
        if self.rank is not None:
            return self.rank
        return torch.arange(self.size, device=self.tokens.device).expand_as(self.tokens)

    def ancestors(self) -> torch.Tensor:
        """[B, N+1, N+1] ancestor-or-self (the verify step builds it in its step_inputs launch)."""
        return ancestors_reference(self.parents, self.max_depth)


def chain_tree(root: torch.Tensor, drafts: torch.Tensor, valid: torch.Tensor) -> Tree:
    """root [B], drafts [B, N] as one path."""
    b, n = drafts.shape
    dev = drafts.device
    tokens = torch.cat([root[:, None], drafts], 1)
    parents = torch.arange(-1, n, device=dev).expand(b, n + 1).clone()
    depth = torch.arange(n + 1, device=dev).expand(b, n + 1).clone()
    ok = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=dev), valid], 1)
    ok = ok.long().cumprod(1).bool()  # a path stops at its first padding node
    return Tree(tokens, parents, depth, ok, n)


def parse_static_tree(spec: str | list) -> list[tuple[int, ...]]:
    """'0;1;0,0;0,1;0,0,0' or [[0],[1],[0,0],...]: each path lists the child ranks from the root."""
    if isinstance(spec, str):
        try:
            paths = [tuple(int(x) for x in p.split(",")) for p in spec.replace(" ", "").split(";") if p]
        except ValueError:
            raise InvalidRequest(f"static tree {spec!r}: expected paths of ranks like '0;1;0,0;0,1'") from None
    else:
        paths = [tuple(int(x) for x in p) for p in spec]
    paths = sorted(set(paths), key=lambda p: (len(p), p))
    have = set(paths)
    for p in paths:
        if any(r < 0 for r in p) or not p:
            raise InvalidRequest(f"static tree path {p} must be a non-empty list of ranks >= 0")
        if len(p) > 1 and p[:-1] not in have:
            raise InvalidRequest(f"static tree path {p} has no parent path {p[:-1]}")
    return paths
