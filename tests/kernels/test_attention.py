"""The tree-attention kernel (Triton, through the CPU interpreter) against SDPA: query heads
of a group stacked, split-K chunks merged, blocks the mask hides skipped, strided cache views."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import attention
from tests.kernels.interpret import interpret_triton, needs_triton


@pytest.fixture
def interpret(monkeypatch):
    interpret_triton(monkeypatch)


def _mask(b, t, s, seed, hidden_block=False):
    g = torch.Generator().manual_seed(seed)
    committed = torch.randint(1, s - t + 1, (b,), generator=g)
    keys = torch.arange(s)
    mask = keys[None, None, :] < committed[:, None, None]  # the prefix
    tree = torch.rand(b, t, t, generator=g) < 0.5  # random ancestor sets, each node sees itself
    tree |= torch.eye(t, dtype=torch.bool)
    slots = committed[:, None] + torch.arange(t)
    mask = mask.expand(b, t, s).clone()
    mask.scatter_(2, slots[:, None, :].expand(b, t, t), tree)
    if hidden_block:
        mask[:, :, :64] = False  # the first key block hidden from every query
        mask[:, :, 64] = True
    return mask[:, None]


@needs_triton
@pytest.mark.parametrize("b, h, kv, t, s, d", [
    (1, 3, 3, 1, 40, 16),  # one token, one chunk (direct output)
    (2, 6, 2, 5, 300, 32),  # groups of 3 query heads, 3 chunks merged
    (2, 9, 3, 17, 140, 64),  # a 17-node tree, 2 chunks
    (2, 9, 3, 33, 200, 64),  # 99 stacked rows: two row blocks
    (1, 4, 1, 70, 90, 16),  # 280 stacked rows: beyond MAX_ROWS, SDPA
])
def test_tree_attention_equals_sdpa(interpret, b, h, kv, t, s, d):
    g = torch.Generator().manual_seed(b * 1000 + t)
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)  # strided, as a projection's view
    cache_k = torch.randn(b + 1, kv, s + 8, d, generator=g)  # a cache view: more rows and slots
    cache_v = torch.randn(b + 1, kv, s + 8, d, generator=g)
    k, v = cache_k[:b, :, :s], cache_v[:b, :, :s]
    mask = _mask(b, t, s, seed=t)
    out = attention.tree_attention(q, k, v, mask)
    torch.testing.assert_close(out, attention.attention_reference(q, k, v, mask), rtol=1e-4, atol=1e-5)


@needs_triton
def test_tree_attention_skips_hidden_blocks_and_broadcasts_the_mask(interpret):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 3, 16, generator=g)
    k, v = torch.randn(2, 2, 200, 16, generator=g), torch.randn(2, 2, 200, 16, generator=g)
    mask = _mask(1, 3, 200, seed=4, hidden_block=True)  # one mask for both rows
    out = attention.tree_attention(q, k, v, mask)
    torch.testing.assert_close(out, attention.attention_reference(q, k, v, mask), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="bool mask"):
        attention.tree_attention(q, k, v, mask.float())
