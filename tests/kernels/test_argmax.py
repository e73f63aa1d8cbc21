"""The greedy pick's Triton kernel (kernels/argmax.py), interpreted on CPU, against torch's argmax:
the lowest index among equal values (also across chunks), -0.0 tied with 0.0, rows of -inf,
non-contiguous input, bf16 and float32, a vocabulary of one chunk and of many."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels.argmax import BLOCK, argmax_last
from tests.kernels.interpret import interpret_triton, needs_triton

pytestmark = needs_triton


def logits_with_ties(rows: int, vocab: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, vocab, generator=g).to(dtype)
    x[0, [7, vocab - 3]] = 50.0  # a tie in different chunks: the first wins
    x[1] = 0.0
    x[1, 5] = -0.0  # -0.0 equals 0.0: index 0 wins
    x[2] = float("-inf")  # nothing finite: index 0
    x[3, vocab - 1] = 60.0  # the last entry
    x[4, [BLOCK - 1, BLOCK] if vocab > BLOCK else [1, 2]] = 70.0  # a tie across a chunk's edge
    return x


@pytest.mark.parametrize("vocab", [1000, 3 * BLOCK + 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_argmax_kernel_equals_torch(vocab, dtype, monkeypatch):
    interpret_triton(monkeypatch)
    x = logits_with_ties(6, vocab, dtype)
    assert torch.equal(argmax_last(x), x.argmax(-1))
    # [B, N, V] with rows apart by more than V (a slice of a wider buffer), and a transposed copy
    wide = torch.zeros(2, 3, vocab + 7, dtype=dtype)
    wide[..., :vocab] = x.view(2, 3, vocab)
    view = wide[..., :vocab]
    assert torch.equal(argmax_last(view), view.argmax(-1))
    t = x.t().contiguous().t()  # column-major: copied first
    assert torch.equal(argmax_last(t), t.argmax(-1))
    # the counters are back at zero: a second call (a graph replay) picks the same
    assert torch.equal(argmax_last(x), x.argmax(-1))


def test_argmax_off_the_kernel_is_torchs():
    x = logits_with_ties(6, 1000, torch.float32)
    assert torch.equal(argmax_last(x), x.argmax(-1))
    assert argmax_last(torch.empty(0, 5)).shape == (0,)
