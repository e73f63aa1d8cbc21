"""The device n-gram lookup's kernel (Triton, through the CPU interpreter) against its torch
reference: repeated phrases, suffixes found at several n, none found, matches at the context's
edges and a row of length 0, in a padded row stride, for each max_ngram the kernel unrolls."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import ngram
from tests.kernels.interpret import interpret_triton, needs_triton


@pytest.fixture
def interpret(monkeypatch):
    interpret_triton(monkeypatch)


def _rows(g, b: int, w: int, vocab: int):
    """Token rows of small vocabularies (so n-grams repeat), lengths from 0 to w - 1, a root each."""
    h = torch.randint(0, vocab, (b, w + 5), generator=g)[:, :w]  # a row stride past w
    length = torch.randint(0, w, (b,), generator=g)
    length[0], length[1] = 0, w - 1
    roots = torch.randint(0, vocab, (b,), generator=g)
    return h, length, roots


@needs_triton
@pytest.mark.parametrize("max_ngram", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("vocab", [3, 7, 50])
def test_ngram_kernel_equals_reference(interpret, max_ngram, vocab):
    g = torch.Generator().manual_seed(max_ngram * 100 + vocab)
    for w, cols in ((37, [0, 1, 2, 3, 4, 5, 6, 7]), (300, [0]), (9, [0, 1, 2])):
        h, length, roots = _rows(g, 6, w, vocab)
        draft_cols = torch.tensor(cols)
        assert ngram.use_triton(h)  # the kernel, interpreted
        for least in range(1, max_ngram + 1):
            drafts, found = ngram.ngram_lookup(h, length, roots, draft_cols, max_ngram, least)
            ref_drafts, ref_found = ngram.ngram_lookup_reference(h, length, roots, draft_cols, max_ngram, least)
            assert torch.equal(found, ref_found), (w, least, found, ref_found)
            assert torch.equal(drafts[found], ref_drafts[found])
            assert not found[0]  # an empty row matches nothing
            assert found.tolist() == [_longest(h[r], int(length[r]), int(roots[r]), max_ngram) >= least
                                      for r in range(h.shape[0])]


def _longest(h, length: int, root: int, max_ngram: int) -> int:
    """The longest n <= max_ngram whose n-gram ending at the root also ends at an earlier position."""
    seq = h[:length].tolist() + [root]
    best = 0
    for n in range(1, min(max_ngram, len(seq) - 1) + 1):
        if any(seq[p - n + 1: p + 1] == seq[-n:] for p in range(n - 1, len(seq) - 1)):
            best = n
    return best


def test_min_ngram_out_of_range():
    h = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="min_ngram"):
        ngram.ngram_lookup(h, torch.tensor([2]), torch.tensor([0]), torch.arange(2), 3, 4)


@needs_triton
def test_ngram_kernel_blocks_and_periods(interpret, monkeypatch):
    """A context longer than the kernel's block (the latest match in a later block wins), and a
    continuation that runs into the suffix (it repeats with the period it found)."""
    seq = [5, 6, 7] + [1] * 1500 + [5, 6, 7, 8, 9] + [2] * 600 + [5, 6]
    h = torch.tensor([seq + [0] * 10])
    length, roots = torch.tensor([len(seq)]), torch.tensor([7])
    drafts, found = ngram.ngram_lookup(h, length, roots, torch.arange(4), 3)
    assert found.item() and drafts.tolist() == [[8, 9, 2, 2]]
    tail = torch.tensor([[4, 3, 4, 3, 4, 0, 0]])  # history 4 3 4 3, root 4: a period of 2
    drafts, _ = ngram.ngram_lookup(tail, torch.tensor([4]), torch.tensor([4]), torch.arange(5), 3)
    assert torch.equal(drafts, ngram.ngram_lookup_reference(tail, torch.tensor([4]), torch.tensor([4]),
                                                            torch.arange(5), 3)[0])
    assert drafts.tolist() == [[3, 4, 3, 4, 3]]
