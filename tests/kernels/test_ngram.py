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
@pytest.mark.parametrize("max_ngram", [1, 2, 3, 4])
@pytest.mark.parametrize("vocab", [3, 7, 50])
def test_ngram_kernel_equals_reference(interpret, max_ngram, vocab):
    g = torch.Generator().manual_seed(max_ngram * 100 + vocab)
    for w, cols in ((37, [0, 1, 2, 3, 4, 5, 6, 7]), (300, [0]), (9, [0, 1, 2])):
        h, length, roots = _rows(g, 6, w, vocab)
        draft_cols = torch.tensor(cols)
        assert ngram.use_triton(h)  # the kernel, interpreted
        drafts, found = ngram.ngram_lookup(h, length, roots, draft_cols, max_ngram)
        ref_drafts, ref_found = ngram.ngram_lookup_reference(h, length, roots, draft_cols, max_ngram)
        assert torch.equal(found, ref_found), (w, found, ref_found)
        assert torch.equal(drafts[found], ref_drafts[found])
        assert not found[0]  # an empty row matches nothing


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
