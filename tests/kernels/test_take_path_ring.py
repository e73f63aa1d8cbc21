"""take_path's ring mode (the MTP drafter's commit): the path's features and next tokens go after
each row's committed length, modulo the ring, in one launch; the length advances."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels.path import take_path, take_path_reference
from tests.kernels.interpret import interpret_triton, needs_triton


def case(seed, b=3, cols=4, nodes=9, feat=40, ring=7):
    g = torch.Generator().manual_seed(seed)
    path = torch.randint(0, nodes, (b, cols), generator=g)
    count = torch.tensor([1, cols, 2])[:b]
    path[torch.arange(cols)[None] >= count[:, None]] = -1
    feats = torch.randn(b, nodes, feat, generator=g)
    tokens = torch.randint(0, 100, (b, nodes), generator=g)
    length = torch.tensor([0, 5, 13])[:b]  # a ring that wraps on the second and third rows
    rings = (torch.randn(b, ring + 1, feat, generator=g), torch.randint(0, 100, (b, ring + 1), generator=g))
    return path, count, feats, tokens, length, rings, ring


def expected(path, count, feats, tokens, length, rings, ring):
    f, t = rings[0].clone(), rings[1].clone()
    for i in range(path.shape[0]):
        for j in range(int(count[i])):
            node = int(path[i, j])
            f[i, (int(length[i]) + j) % ring] = feats[i, node]
            t[i, (int(length[i]) + j + 1) % ring] = tokens[i, node]
    return f, t, length + count


@pytest.mark.parametrize("seed", [0, 1])
def test_ring_reference_writes_after_the_length(seed):
    path, count, feats, tokens, length, rings, ring = case(seed)
    want = expected(path, count, feats, tokens, length, rings, ring)
    f, t, n = rings[0].clone(), rings[1].clone(), length.clone()
    take_path_reference(path, count, feats, tokens, f, t, n, ring=ring)
    assert torch.equal(f, want[0]) and torch.equal(t, want[1]) and torch.equal(n, want[2])


@needs_triton
@pytest.mark.parametrize("seed", [0, 1])
def test_ring_kernel_equals_reference(monkeypatch, seed):
    interpret_triton(monkeypatch)
    path, count, feats, tokens, length, rings, ring = case(seed)
    want = expected(path, count, feats, tokens, length, rings, ring)
    f, t, n = rings[0].clone(), rings[1].clone(), length.clone()
    take_path(path, count, feats, tokens, f, t, n, ring=ring)
    assert torch.equal(f, want[0]) and torch.equal(t, want[1]) and torch.equal(n, want[2])


def test_ring_outputs_too_small_are_refused():
    path, count, feats, tokens, length, rings, ring = case(0)
    with pytest.raises(ValueError, match="ring"):
        take_path(path, count, feats, tokens, rings[0][:, :3], rings[1][:, :3], length, ring=ring)
