"""The verify mask kernel (Triton, through the CPU interpreter) against its torch reference:
ancestors by walking parents, the committed prefix, the tree at slots committed + node."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import verify as tree_mask
from specheads.kernels.path import take_path, take_path_reference
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


def _random_tree(b, n, seed, ranked):
    from specheads.runtime.tree import Tree

    g = torch.Generator().manual_seed(seed)
    parents, max_depth = _random_parents(b, n, seed)
    depth = torch.zeros(b, n, dtype=torch.long)
    for i in range(1, n):
        depth[:, i] = depth.gather(1, parents[:, i: i + 1])[:, 0] + 1
    tokens = torch.randint(0, 3, (b, n), generator=g)  # few tokens: siblings repeat, paths run deep
    valid = torch.rand(b, n, generator=g) < 0.85
    rank = torch.stack([torch.randperm(n, generator=g) for _ in range(b)]) if ranked else None
    return Tree(tokens, parents, depth, valid, max_depth, rank)


@needs_triton
@pytest.mark.parametrize("b, n, kv, ranked, seed", [(1, 1, 16, False, 0), (3, 9, 40, True, 1), (2, 17, 300, False, 2),
                                                     (4, 33, 1100, True, 3)])
def test_step_inputs_kernel_equals_reference(monkeypatch, b, n, kv, ranked, seed):
    """Validity under each row's depth and rank limits (the root always valid), the ancestor
    matrix, positions and slots, from one launch."""
    interpret_triton(monkeypatch)
    tree = _random_tree(b, n, seed, ranked)
    g = torch.Generator().manual_seed(seed + 10)
    committed = torch.randint(0, kv - n + 1, (b,), generator=g)
    depth_limit = torch.randint(0, tree.max_depth + 2, (b,), generator=g)
    draft_limit = torch.randint(1, n + 2, (b,), generator=g)
    got = tree_mask.step_inputs(tree, committed, depth_limit, draft_limit)
    want = tree_mask.step_inputs_reference(tree, committed, depth_limit, draft_limit)
    for name, x, y in zip(("valid", "anc", "positions", "slots"), got, want):
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert got[0][:, 0].all()
    if n > 1:  # the limits cut something in these draws
        assert not torch.equal(got[0], tree.valid | (torch.arange(n) == 0))


@needs_triton
@pytest.mark.parametrize("b, n, seed", [(1, 1, 0), (3, 9, 1), (2, 17, 2), (4, 33, 3)])
def test_finish_step_kernel_equals_reference(monkeypatch, b, n, seed):
    """Accept, then the step's bookkeeping in the same launch: committed, base, root and the
    result rows, as the torch ops do them; then a drafter's take of the path's node outputs."""
    interpret_triton(monkeypatch)
    tree = _random_tree(b, n, seed, False)
    tree.valid[:, 0] = True
    g = torch.Generator().manual_seed(seed + 20)
    cols = tree.max_depth + 1
    # targets that often agree with the drafts: each node's y is a child's token half the time
    y = torch.randint(0, 3, (b, n), generator=g)
    anc = tree.ancestors().contiguous()
    committed = torch.randint(0, 50, (b,), generator=g)
    aux = torch.randn(b, n, 20, generator=g)
    runs = []
    for fn, take in ((tree_mask.finish_step, take_path), (tree_mask.finish_step_reference, take_path_reference)):
        state = {"committed": committed.clone(), "base": torch.full((b,), -7), "root": torch.full((b,), -7),
                 "out": torch.full((b, 4 + cols + 2), -7)}
        path, n_acc = fn(tree.tokens, tree.parents, tree.valid, tree.depth, anc, y, tree.max_depth, state["committed"],
                         state["base"], state["root"], state["out"])
        state.update(path=path, n_acc=n_acc, p_aux=torch.full((b, cols, 20), -7.0), p_tok=torch.full((b, cols), -7),
                     p_n=torch.full((b,), -7))
        take(path, n_acc, aux, y, state["p_aux"], state["p_tok"], state["p_n"])
        runs.append(state)
    got, want = runs
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert torch.equal(got["base"], committed) and torch.equal(got["committed"], committed + got["n_acc"])
    assert torch.equal(got["p_n"], got["n_acc"]) and not (got["p_aux"] == -7).any()
    assert (got["out"][:, 4 + cols:] == -7).all()  # nothing past the path's columns
