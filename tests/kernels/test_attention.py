"""The tree-attention kernel (Triton, through the CPU interpreter) against SDPA: query heads
of a group stacked, split-K chunks merged by the last of their programs (one launch, its
counters left at zero), blocks the mask hides skipped, strided cache views."""

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


@pytest.fixture
def small_chunks(tune):
    """64 keys per split-K program: 200 keys make 4 chunks, the last one partial."""
    tune(attention_chunk=64)


def _case(b, h, kv, t, s, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
    k, v = torch.randn(b, kv, s, d, generator=g), torch.randn(b, kv, s, d, generator=g)
    mask = _mask(b, t, s, seed=seed)
    return q, k, v, mask


@needs_triton
@pytest.mark.parametrize("b, h, kv, t, s, hide", [
    (2, 4, 2, 3, 200, "chunks"),  # 4 chunks (the last 8 keys), whole chunks hidden from every query
    (3, 6, 3, 5, 200, "partial"),  # a chunk hidden up to its last key, a partial last chunk
    (1, 2, 1, 9, 130, "none"),  # 3 chunks, an 18-row tree: one row block, rows past n_rows masked
])
def test_one_launch_merges_the_chunks(interpret, small_chunks, monkeypatch, b, h, kv, t, s, hide):
    q, k, v, mask = _case(b, h, kv, t, s, 16, seed=b * 10 + t)
    mask = mask.clone()
    if hide == "chunks":
        mask[..., 64:128] = False  # chunk 1 hidden from every query
        mask[0, ..., :64] = False  # batch row 0: chunk 0 too
        mask[..., s - 1] = True  # every query sees a key (in the partial last chunk)
    elif hide == "partial":
        mask[..., :127] = False  # chunk 0 hidden, chunk 1 all but its last key
        mask[..., 127] = True
    launched = []
    real = attention._kernel

    def recording(fn):
        launched.append(fn.__name__)
        return real(fn)

    monkeypatch.setattr(attention, "_kernel", recording)
    out = attention.tree_attention(q, k, v, mask)
    assert launched == ["_split_kernel"]  # no second (merge) launch
    torch.testing.assert_close(out, attention.attention_reference(q, k, v, mask), rtol=1e-4, atol=1e-5)
    counters = attention._counters[q.device]
    assert counters.numel() >= attention.MIN_COUNTERS and not counters.any()  # reset for the next call
    again = attention.tree_attention(q, k, v, mask)
    assert torch.equal(out, again)
    assert attention._counters[q.device] is counters and not counters.any()


@needs_triton
def test_counters_grow_and_stay_alive(interpret, small_chunks, monkeypatch):
    monkeypatch.setattr(attention, "_counters", {})
    monkeypatch.setattr(attention, "_retired", [])
    monkeypatch.setattr(attention, "MIN_COUNTERS", 4)
    q, k, v, mask = _case(1, 2, 1, 3, 140, 16, seed=5)  # 1 x 1 x 1 row block: 1 counter
    attention.tree_attention(q, k, v, mask)
    first = attention._counters[q.device]
    assert first.numel() == 4
    q, k, v, mask = _case(3, 4, 2, 3, 140, 16, seed=6)  # 3 x 2 x 1 = 6 counters: a bigger buffer
    out = attention.tree_attention(q, k, v, mask)
    torch.testing.assert_close(out, attention.attention_reference(q, k, v, mask), rtol=1e-4, atol=1e-5)
    grown = attention._counters[q.device]
    assert grown.numel() == 8 and not grown.any()
    assert attention._retired == [first]  # a graph may still hold its address
    assert attention.split_counters(q.device, 5) is grown


@needs_triton
def test_a_caller_chunk_size(interpret):
    """The draft head passes its own keys per program (64): the same attention; a size that is
    not a power of two >= 64 is refused by name."""
    q, k, v, mask = _case(2, 4, 2, 3, 200, 16, seed=4)
    want = attention.attention_reference(q, k, v, mask)
    for chunk in (64, 256):
        torch.testing.assert_close(attention.tree_attention(q, k, v, mask, chunk=chunk), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="chunk 96"):
        attention.tree_attention(q, k, v, mask, chunk=96)
