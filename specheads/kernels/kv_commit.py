"""Commit an accepted tree path: move its KV entries into consecutive slots.

Verification writes the tree's tokens at slots base, base+1, ..., base+N (node order).
The accepted path is nodes src[0]=0, src[1], ..., src[n-1]; afterwards entry i must sit
at slot base+i. Sources can be destinations of other path entries (src[j] = i for some
i < n), so every program loads all its sources, then waits at a barrier for all its
threads, before it stores anything.

cache: [layers, batch, kv_heads, max_len, head_dim] (the target's KVCache layout).
"""

from __future__ import annotations

import torch

from specheads.kernels import ahead
from specheads.kernels.fused import _kernel, gdc_launch_dependents, gdc_wait, pdl_options, triton, use_triton

if triton is not None:
    import triton.language as tl


def commit_kv_reference(cache: torch.Tensor, base: torch.Tensor, src: torch.Tensor, n_accept: torch.Tensor) -> None:
    """base [B] (int64), src [B, M] node indices (src[:, 0] == 0), n_accept [B] (1..M)."""
    b_size, m = src.shape
    for b in range(b_size):
        n = int(n_accept[b])
        slots_from = int(base[b]) + src[b, :n]
        slots_to = int(base[b]) + torch.arange(n, device=src.device)
        cache[:, b, :, slots_to] = cache[:, b, :, slots_from].clone()


if triton is not None:

    def _commit_kernel(
        cache_ptr, base_ptr, src_ptr, n_ptr,
        stride_l, stride_b, stride_h, stride_s, s_src,
        n_heads, max_accept: tl.constexpr, head_dim: tl.constexpr, block_d: tl.constexpr, PDL: tl.constexpr,
    ):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        # 64-bit program indices: layer * stride_l passes 2^31 elements once the cache holds
        # more than ~48 rows of SmolLM2's 4k context (an illegal address at batch 48 and up)
        pid = tl.program_id(0).to(tl.int64)  # one program per (layer, kv head) x batch row
        h = pid % n_heads
        layer = pid // n_heads
        b = tl.program_id(1).to(tl.int64)
        base = tl.load(base_ptr + b)
        n = tl.load(n_ptr + b)
        rows = tl.arange(0, max_accept)
        cols = tl.arange(0, block_d)
        row_ok = rows < n
        col_ok = cols < head_dim
        src = tl.load(src_ptr + b * s_src + rows, mask=row_ok, other=0)  # n <= the path's width
        head_ptr = cache_ptr + layer * stride_l + b * stride_b + h * stride_h
        mask = row_ok[:, None] & col_ok[None, :]
        vals = tl.load(head_ptr + (base + src)[:, None] * stride_s + cols[None, :], mask=mask)
        # the rows of this tile live in different warps: without a barrier one warp may store
        # into a slot that another has yet to load (seen on an H100 as corrupted KV in trees
        # whose accepted path skips nodes)
        tl.debug_barrier()
        tl.store(head_ptr + (base + rows)[:, None] * stride_s + cols[None, :], vals, mask=mask)


def commit_kv_triton(cache: torch.Tensor, base: torch.Tensor, src: torch.Tensor, n_accept: torch.Tensor) -> None:
    layers, b_size, heads, _, head_dim = cache.shape
    assert cache.stride(-1) == 1, "head_dim must be contiguous"
    m = src.shape[1]
    max_accept = triton.next_power_of_2(m)
    assert src.stride(-1) == 1 and src.dtype == torch.int64
    _kernel(_commit_kernel)[(layers * heads, b_size)](
        cache, base.to(torch.int64), src, n_accept.to(torch.int64),
        cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3), src.stride(0),
        heads, max_accept=max_accept, head_dim=head_dim, block_d=triton.next_power_of_2(head_dim),
        **pdl_options(cache, "kv_commit"),
    )


@ahead.op
def commit_kv(cache: torch.Tensor, base: torch.Tensor, src: torch.Tensor, n_accept: torch.Tensor) -> None:
    """In place on `cache`; Triton on GPU (or under TRITON_INTERPRET=1), torch elsewhere."""
    if use_triton(cache):
        commit_kv_triton(cache, base, src, n_accept)
    else:
        commit_kv_reference(cache, base, src, n_accept)
