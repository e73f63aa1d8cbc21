"""The MTP drafter's window inputs in one launch equal the torch construction they replace."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels.mtp_window import mtp_window, mtp_window_reference
from tests.kernels.interpret import interpret_triton, needs_triton


@needs_triton
@pytest.mark.parametrize("modules, k, kv", [(3, 1, 16), (5, 4, 40), (2, 3, 8)])
def test_kernel_equals_reference(monkeypatch, modules, k, kv):
    interpret_triton(monkeypatch)
    window = 2 * modules + 2
    ring = window + 2
    g = torch.Generator().manual_seed(modules)
    # lengths before, at and past the window (short prompts read positions below 0)
    length = torch.tensor([0, 1, 3, window, kv - 1])
    ring_tokens = torch.randint(0, 1000, (5, ring + 1), generator=g)
    width = kv + k + 1
    got = mtp_window(length, ring_tokens, window, ring, modules, kv, width, k)
    want = mtp_window_reference(length, ring_tokens, window, ring, modules, kv, width, k)
    for name, a, b in zip(("tokens", "rows", "positions", "slots", "mask"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.equal(a, b), name


def test_reference_masks_read_as_the_drafter_documents():
    """Module 1 of a row 6 long, window 4, one frontier node at slot kv: the window's entry at
    position p is known once p + 2 <= 6; the frontier sees entries up to 6 - 1 - 1 = 4."""
    tokens, rows, positions, slots, mask = mtp_window_reference(
        torch.tensor([6]), torch.arange(8)[None], window=4, ring=8, modules=2, kv=10, width=12, k=1)
    assert positions.tolist() == [[2, 3, 4, 5, 5]]
    assert slots[1].tolist() == [[2, 3, 4, 11, 10]]  # position 5 needs token 7: not known, discard slot
    assert tokens[1].tolist() == [[4, 5, 6, 7, 0]]  # token p + 2; the frontier's, written by the expansion
    assert rows[0].tolist() == [[2, 3, 4, 5, 0]]  # module 0 reads the feature ring at p mod 8
    assert rows[1].tolist() == [[0, 1, 2, 3, 0]]  # module 1 reads module 0's output rows
    m = mask[1, 0, 0]
    assert m[0].nonzero().flatten().tolist() == [0, 1, 2]  # earlier entries and itself
    assert m[3].nonzero().flatten().tolist() == [11]  # unknown: itself only
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 10]  # the frontier
