"""The verify mask kernel (Triton, through the CPU interpreter) against its torch reference:
ancestors by walking parents, the committed prefix, the tree at slots committed + node."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import verify as tree_mask
from tests.kernels.interpret import interpret_triton, needs_triton


def _random_parents(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((b, n), -1)
    for i in range(1, n):
        parents[:, i] = (torch.rand(b, generator=g) * i).long()  # any earlier node
    depth = torch.zeros(b, n, dtype=torch.long)
    for i in range(1, n):
        depth[:, i] = depth.gather(1, parents[:, i: i + 1])[:, 0] + 1
    return parents, int(depth.max())


@needs_triton
@pytest.mark.parametrize("b, n, kv, seed", [(1, 1, 16, 0), (2, 9, 40, 1), (3, 33, 1100, 2), (2, 17, 64, 3)])
def test_tree_mask_kernel_equals_reference(monkeypatch, b, n, kv, seed):
    interpret_triton(monkeypatch)
    parents, depth = _random_parents(b, n, seed)
    committed = torch.randint(0, kv - n + 1, (b,), generator=torch.Generator().manual_seed(seed))
    anc, mask = tree_mask.tree_masks(parents, committed, kv, depth)
    ref_anc, ref_mask = tree_mask.tree_masks_reference(parents, committed, kv, depth)
    assert torch.equal(anc, ref_anc) and torch.equal(mask, ref_mask)
    assert mask.shape == (b, n, kv) and anc.diagonal(dim1=1, dim2=2).all()


@needs_triton
def test_tree_mask_kernel_takes_a_broadcast_tree(monkeypatch):
    """A static tree's parents are one row expanded over the batch (stride 0)."""
    interpret_triton(monkeypatch)
    parents = torch.tensor([[-1, 0, 0, 1, 3]]).expand(3, 5)
    committed = torch.tensor([0, 4, 11])
    anc, mask = tree_mask.tree_masks(parents, committed, 20, 3)
    ref_anc, ref_mask = tree_mask.tree_masks_reference(parents, committed, 20, 3)
    assert torch.equal(anc, ref_anc) and torch.equal(mask, ref_mask)
    assert anc[0, 4].tolist() == [True, True, False, True, True]
