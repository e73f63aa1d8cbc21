"""Attention for decode, verify and draft steps: a few query tokens per row (a tree, a draft
frontier, one token) over a KV cache under an explicit mask, beside its torch reference.

SDPA's memory-efficient kernel serves these shapes poorly: one program per (row, head) walks
the whole cache bucket, and a 16-token tree costs ~24 us per layer on an H200. Here the query
heads of a KV group share a program (their rows stacked, so K and V are read once per group),
the cache is split into chunks handled by separate programs (split-K, as in flash-decoding)
that skip blocks the mask hides. With a single chunk a program writes the output itself;
with several, each program stores its chunk's partial softmax (fp32 accumulator, max, sum)
and bumps a counter of its (row, kv head, row block), and the program that brings the
counter to the number of chunks merges the partials in chunk order and writes the output
(one launch per call: the decode step is launch-bound, and a second merge kernel per layer
cost ~30 launches a target forward).

  q     [B, H, T, D]      (any strides; last dim contiguous)
  k, v  [B, KV, S, D]     (cache views; last dim contiguous)
  mask  bool [B or 1, 1, T, S]  True = attend; every query must see at least one key
  ->    [B, H, T, D] in q's dtype (a view of [B, T, H, D] memory on the Triton path)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from specheads.kernels import ahead
from specheads.kernels.fused import skip_options, triton, use_triton
from specheads.kernels.tuning import active
from specheads.modules import gqa_attention

if triton is not None:
    import triton.language as tl

    from specheads.kernels.fused import _kernel, gdc_launch_dependents, gdc_wait, pdl_options

def chunk_for(n_keys: int, rows: int) -> int:
    """Keys per split-K program: one size for every call (Numerics.attention_chunk). Per-shape
    sizes time up to ~1 us better per call (gpu_runs/attn_chunks.py;
    docs/history/2026-11-benchmark-log.md), but with a fixed size chunk boundaries sit at the
    same keys whatever the cache bucket and the number of query rows, so a token's attention
    sums in the same order in a 1-token decode and in a tree (hidden chunks add nothing), and
    bf16 speculation matches plain decoding more often (per-shape sizes cut chain and ngram
    from 6/6 to 4/6-5/6 identical outputs on the H100)."""
    return active().numerics.attention_chunk


MAX_ROWS = 256  # stacked query rows (heads of a group x tokens) above which SDPA serves better


def attention_reference(q, k, v, mask):
    return gqa_attention(q, k, v, mask)


def _dry_attention(q, *args, **kwargs):
    """The attention ops' stand-in in a compile-ahead dry run (ahead.op's `dry`): zeros of the
    output's shape. Their numbers only feed projections there, and torch's attention over every
    captured shape took most of a profiled dry run on an H100 host."""
    return torch.zeros_like(q)


# Split-K arrival counters, one int32 per (batch row, kv head, row block), per device. The
# program that merges a group's chunks sets its counter back to 0, so a buffer is all zeros
# between launches and needs no memset kernel. CUDA graphs bake in its address, so it must
# outlive every graph that used it: buffers are never freed, only superseded by a bigger one
# (zeros) when a call needs more entries. A first allocation or a growth inside CUDA graph
# capture would put the buffer in the graph's pool and a memset in the graph, so
# split_counters refuses it; it does not happen in the engine, whose captures
# (runtime/graphs.py capture_graph) first run the same step twice, at the same shapes,
# outside capture. MIN_COUNTERS covers batch 32 x 8 kv heads x 16 row blocks (256 rows)
# without any growth. Calls share a device's buffer (draft.topk_expand counts its rows' chunk
# programs in it too), so they must not run at the same time on two streams (the engine runs
# one stream; its capture warm-up waits on the main one).
MIN_COUNTERS = 4096
_counters: dict = {}  # torch.device -> the current int32 buffer
_retired: list = []  # superseded buffers, kept alive for graphs that captured their address


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """An all-zeros int32 buffer of at least n entries on device, the same one call after call."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"tree_attention needs {n} split-K counters during CUDA graph capture; run the "
                "captured step once outside capture first (the buffer is then allocated)")
        if buf is not None:
            _retired.append(buf)
        buf = torch.zeros(max(MIN_COUNTERS, 1 << (n - 1).bit_length()), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


if triton is not None:

    def _split_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, part_ptr, stat_ptr, cnt_ptr,
                      n_kv, n_tok, n_rows, n_keys, n_splits, scale,
                      s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_mb, s_mt, s_ob, s_oh, s_ot,
                      REP: tl.constexpr, D: tl.constexpr, CHUNK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
                      skip_ptr, SKIP: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        if SKIP:  # a draft depth stopped on the device (fused.skip_stopped)
            if tl.load(skip_ptr) != 0:
                return
        bh = tl.program_id(0)  # (batch row, kv head)
        split = tl.program_id(1)
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        b = (bh // n_kv).to(tl.int64)  # row offsets into a cache of many rows pass 2^31 elements
        g = bh % n_kv
        row_ok = rows < n_rows
        head = g * REP + rows // n_tok
        tok = rows % n_tok
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * s_qb + head[:, None] * s_qh + tok[:, None] * s_qt + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        start = split * CHUNK_N
        for off in range(0, CHUNK_N, BLOCK_N):
            cols = start + off + tl.arange(0, BLOCK_N)
            col_ok = cols < n_keys
            allowed = tl.load(m_ptr + b * s_mb + tok[:, None] * s_mt + cols[None, :],
                              mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
            if tl.sum(allowed.to(tl.int32)) > 0:  # a block the mask hides costs its mask load only
                k = tl.load(k_ptr + b * s_kb + g * s_kh + cols[:, None] * s_ks + d[None, :],
                            mask=col_ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
                s = tl.where(allowed, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.exp(s - m_safe[:, None])
                alpha = tl.exp(m_i - m_safe)
                v = tl.load(v_ptr + b * s_vb + g * s_vh + cols[:, None] * s_vs + d[None, :],
                            mask=col_ok[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                l_i = l_i * alpha + tl.sum(p, 1)
                m_i = m_new
        if DIRECT:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_ptr + b * s_ob + head[:, None] * s_oh + tok[:, None] * s_ot + d[None, :],
                     out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            base = (bh * n_splits + split) * n_rows + rows
            tl.store(part_ptr + base[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
            tl.store(stat_ptr + base * 2, m_i, mask=row_ok)
            tl.store(stat_ptr + base * 2 + 1, l_i, mask=row_ok)
            # every thread's stores are issued before the (one-thread) atomic; acq_rel at gpu
            # scope publishes them to, and makes the others' visible to, the program that merges
            tl.debug_barrier()
            cnt = cnt_ptr + bh * tl.num_programs(2) + tl.program_id(2)
            done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:  # the last chunk of this (row, kv head, row block) to finish
                m = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_sum = tl.zeros([BLOCK_M], tl.float32)
                acc_m = tl.zeros([BLOCK_M, D], tl.float32)
                for s_idx in range(0, n_splits):  # in chunk order: the sum is the same whoever merges
                    base_s = (bh * n_splits + s_idx) * n_rows + rows
                    ms = tl.load(stat_ptr + base_s * 2, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
                    ls = tl.load(stat_ptr + base_s * 2 + 1, mask=row_ok, other=0.0, cache_modifier=".cg")
                    part = tl.load(part_ptr + base_s[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0,
                                   cache_modifier=".cg")
                    m_new = tl.maximum(m, ms)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp(m - m_safe)
                    beta = tl.exp(ms - m_safe)
                    acc_m = acc_m * alpha[:, None] + part * beta[:, None]
                    l_sum = l_sum * alpha + ls * beta
                    m = m_new
                out = acc_m / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
                tl.store(o_ptr + b * s_ob + head[:, None] * s_oh + tok[:, None] * s_ot + d[None, :],
                         out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
                tl.store(cnt, 0)  # every chunk has counted: ready for the next launch (or graph replay)


@ahead.op(dry=_dry_attention)
def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   chunk: int | None = None) -> torch.Tensor:
    """Softmax attention of q over k, v under a boolean mask (see the module docstring);
    Triton on GPU (or under TRITON_INTERPRET=1) for up to MAX_ROWS stacked rows, else SDPA
    (everywhere with Numerics.attention "sdpa").
    chunk: keys per program (a power of two >= 64; default: the tuning's, see chunk_for)."""
    b, h, t, d = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    rep = h // n_kv
    rows = rep * t
    tuning = active()
    if (not use_triton(q) or rows > MAX_ROWS or d & (d - 1) or d < 16
            or tuning.numerics.attention == "sdpa"):  # the reference everywhere (a fallback)
        return attention_reference(q, k, v, mask)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if mask.dtype != torch.bool:
        raise TypeError(f"tree_attention takes a bool mask, got {mask.dtype}")
    mask = mask.expand(-1, 1, t, n_keys) if mask.shape[2] == 1 else mask
    if mask.stride(-1) != 1:
        mask = mask.contiguous()
    # written token-major ([B, T, H, D] memory): the output projection then reads it as
    # [B, T, H * D] without a copy (out.transpose(1, 2).reshape(...) is a view)
    out = torch.empty(b, t, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    # a fixed row block: a row's arithmetic is then the same whether it sits in a 1-token
    # decode or a 33-node tree (only its keys differ), so fewer near-ties flip between the two
    block_m = tuning.numerics.attention_row_block
    if chunk is None:
        chunk = chunk_for(n_keys, rows)
    elif chunk < 64 or chunk & (chunk - 1):
        raise ValueError(f"tree_attention chunk {chunk}: expected a power of two >= 64")
    n_splits = triton.cdiv(n_keys, chunk)
    direct = n_splits == 1
    row_blocks = triton.cdiv(rows, block_m)
    if direct:
        part = stat = out  # unused
        counters = out
    else:
        part = torch.empty(b * n_kv * n_splits * rows, d, dtype=torch.float32, device=q.device)
        stat = torch.empty(b * n_kv * n_splits * rows, 2, dtype=torch.float32, device=q.device)
        counters = split_counters(q.device, b * n_kv * row_blocks)
    m_rows = mask.stride(0) if mask.shape[0] > 1 else 0
    grid = (b * n_kv, n_splits, row_blocks)
    _kernel(_split_kernel)[grid](
        q, k, v, mask, out, part, stat, counters, n_kv, t, rows, n_keys, n_splits, 1.0 / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), m_rows, mask.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        REP=rep, D=d, CHUNK_N=chunk, BLOCK_M=block_m, BLOCK_N=64, DIRECT=direct,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # float32 stays float32 (no TF32)
        **pdl_options(q, "attention", grid[0] * grid[1] * grid[2]), **skip_options(q))
    return out


# ---------------------------------------------------------------------------------------------
# Causal attention for the target: the same sums for a token wherever its keys sit
#
# The target's attention takes no mask: a query at position p sees the keys of positions 0..p
# (inside the layer's window), and the kernel sums them in position order, in blocks of
# BLOCK_N keys from position 0 and chunks of Numerics.attention_chunk keys, each chunk's softmax
# folded into the row's running one in chunk order. Where a key sits in the cache only decides
# where it is loaded from:
#   contiguous  (a prefill, plain decode) position c at slot c;
#   tree        (a verify step) positions below `base` (the committed tokens) at their slots;
#               position base + j at the slot of the query's ancestor of depth j, node n of the
#               tree sitting at slot base + n (anc [B, T, T] ancestor-or-self, depth [B, T];
#               the TreePlan, worked out once a forward, lists each node's ancestors by depth).
# So a tree node's attention is computed with the keys in the same places, the same blocks and
# the same order as the plain decode of its path (the cache then holding the path at
# base..base+d): bit for bit the same output. Rows of other tokens in a program change nothing
# for a row (its masked keys contribute exact zeros, a block it cannot see is an exact no-op),
# and neither do the number of rows, the cache bucket, or whether a program takes one chunk
# (split-K, merged in chunk order by the last to finish) or all of them in turn: the fold is
# the same arithmetic (tests/kernels/test_causal_attention.py; gpu_runs/bit_check.py on GPU).
# ---------------------------------------------------------------------------------------------

CAUSAL_BLOCK_N = 64  # keys per block: the unit of the online softmax (a Numerics constant)


def causal_mask(positions: torch.Tensor, n_keys: int, window: int | None = None, tree=None) -> torch.Tensor:
    """The bool [B, 1, T, n_keys] mask that causal_attention's key layout means (its reference)."""
    slots = torch.arange(n_keys, device=positions.device)
    pos = positions[:, None, :, None]
    if tree is None:
        mask = slots <= pos
        if window:
            mask = mask & (slots > pos - window)
        return mask
    base, anc, depth = tree[:3]  # a (base, anc, depth) tuple or a TreePlan
    b, t = positions.shape
    prefix = slots < base[:, None, None, None]
    if window:
        prefix = prefix & (slots > pos - window)
    # node n at slot base + n, seen by the nodes it is an ancestor-or-self of
    node_at = slots[None, :] - base[:, None]  # [B, S]
    in_tree = (node_at >= 0) & (node_at < t)
    seen = anc.gather(2, node_at.clamp(0, t - 1)[:, None, :].expand(b, t, n_keys)) & in_tree[:, None, :]
    if window:
        node_pos = base[:, None] + depth.gather(1, node_at.clamp(0, t - 1))  # [B, S]
        seen = seen & (node_pos[:, None, :] > positions[:, :, None] - window)
    return prefix | seen[:, None]


def causal_attention_reference(q, k, v, positions, window=None, tree=None):
    return gqa_attention(q, k, v, causal_mask(positions, k.shape[2], window, tree))


class TreePlan(NamedTuple):
    """A verify step's tree (base [B], anc [B, T, T] bool, depth [B, T]) and how causal_attention
    deals its tokens, worked out once a forward (tree_plan) and read by every layer:
      order  [B, T] int32  the tree's nodes sorted by (leaf, depth): a node's leaf is the first
                          leaf below it, so the tokens dealt to one program lie on few paths
      leaf   [B, T] int32  the leaf of the node at each place of that order
      path   [B, T, T] int32  path[b, n, j]: node n's ancestor of depth j (-1 deeper than n)"""
    base: torch.Tensor
    anc: torch.Tensor
    depth: torch.Tensor
    order: torch.Tensor
    leaf: torch.Tensor
    path: torch.Tensor


def tree_plan_reference(base, anc, depth) -> TreePlan:
    b, t, _ = anc.shape
    nodes = torch.arange(t, device=anc.device)
    is_leaf = anc.sum(1) == 1  # [B, T]: no other node has it as an ancestor
    # leaf_of[n]: the smallest leaf m with n among its ancestors-or-self
    leaf_of = torch.where(anc.transpose(1, 2) & is_leaf[:, None, :], nodes, t).amin(2)
    order = torch.argsort(leaf_of * t + depth, dim=1)
    at_depth = depth[:, None, :].expand(b, t, t)
    path = torch.full((b, t, t), -1, dtype=torch.long, device=anc.device).scatter_reduce(
        2, at_depth, torch.where(anc, nodes, -1).expand(b, t, t), "amax")
    return TreePlan(base, anc, depth, order.int(), leaf_of.gather(1, order).int(), path.int())


@ahead.op
def tree_plan(base: torch.Tensor, anc: torch.Tensor, depth: torch.Tensor) -> TreePlan:
    """The TreePlan of a tree: one Triton program a row on GPU (or under TRITON_INTERPRET=1),
    else its torch reference (the same numbers)."""
    if anc.dtype != torch.bool or anc.dim() != 3 or anc.shape[1] != anc.shape[2]:
        raise TypeError(f"tree_plan: anc must be bool [B, T, T], got {anc.dtype} {tuple(anc.shape)}")
    if not use_triton(anc):
        return tree_plan_reference(base, anc, depth)
    b, t, _ = anc.shape
    anc, depth = anc.contiguous(), depth.contiguous()
    order = torch.empty(b, t, dtype=torch.int32, device=anc.device)
    leaf = torch.empty_like(order)
    path = torch.empty(b, t, t, dtype=torch.int32, device=anc.device)
    _kernel(_tree_plan_kernel)[(b,)](anc, depth, order, leaf, path, t, anc.stride(0), anc.stride(1),
                                     depth.stride(0), NP=triton.next_power_of_2(t),
                                     **pdl_options(anc, "attention"))  # (launched as the attention is)
    return TreePlan(base.contiguous(), anc, depth, order, leaf, path)


if triton is not None:

    def _tree_plan_kernel(anc_ptr, dep_ptr, order_ptr, leaf_ptr, path_ptr, n_tok, s_ab, s_at, s_db,
                          NP: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        nodes = tl.arange(0, NP)
        on = nodes < n_tok
        dep = tl.load(dep_ptr + b * s_db + nodes, mask=on, other=-1)
        full = tl.load(anc_ptr + b * s_ab + nodes[:, None] * s_at + nodes[None, :],
                       mask=on[:, None] & on[None, :], other=0) != 0  # full[n, m]: m is n's ancestor-or-self
        is_leaf = (tl.sum(full.to(tl.int32), 0) == 1) & on
        leaf_of = tl.min(tl.where(full & is_leaf[:, None], nodes[:, None], NP), 0)  # by node
        key = tl.where(on, leaf_of * NP + dep, NP * NP + nodes)  # unique: a path's depths differ
        place = tl.sum((key[:, None] < key[None, :]).to(tl.int32), 0)
        tl.store(order_ptr + b * n_tok + place, nodes, mask=on)
        tl.store(leaf_ptr + b * n_tok + place, leaf_of, mask=on)
        for j in range(0, n_tok):  # each node's ancestor of depth j
            at = tl.max(tl.where(full & (dep[None, :] == j), nodes[None, :], -1), 1)
            tl.store(path_ptr + (b * n_tok + nodes) * n_tok + j, at, mask=on)


def causal_tiles(n_heads: int, n_kv: int, tree: bool, batch: int = 1, tokens: int = 0,
                 n_keys: int = 0) -> tuple[int, int, int]:
    """(rows a program's dot takes, query rows it fills, tokens it can touch). A call's query
    rows (a token's query heads of one KV group side by side, tokens in order; a tree's tokens
    sorted by path, see _causal_kernel) fill the 16-row dot of a decode (or the next power of
    two above the group's heads) one program after another. A tree's program fills only
    Speed.attention_tree_tokens tokens' rows at batches below Speed.attention_tree_many_batch:
    the program holding the tree positions is the step's slowest; one token where a call of
    `tokens` over `n_keys` keys would launch at most Speed.attention_tree_one_token_programs
    programs that way (its chunks counted). How rows are dealt never
    changes a row's bits: each row's dot is the decode's dot, whatever its neighbours. (Stacking
    2 or 4 such dots a program, sharing each block of keys, was slower on an H200 at batch 1
    to 32 and changed bits at batch 32:
    docs/results/head-kinds-h200/fused-drafting/kernel_bench_attention_subtiles.json.)"""
    rep = n_heads // n_kv
    dot_m = max(16, 1 << (rep - 1).bit_length())
    speed = active().speed
    fill = dot_m
    if tree and batch < speed.attention_tree_many_batch:
        per = max(1, speed.attention_tree_tokens)
        if per > 1 and tokens:
            chunks = -(-max(1, n_keys) // active().numerics.attention_chunk)
            if batch * n_kv * -(-tokens * rep // min(dot_m, per * rep)) * chunks <= speed.attention_tree_one_token_programs:
                per = 1
        fill = min(dot_m, per * rep)
    # a program's rows start at any row of a token, so they can touch one token more
    touch = fill // rep if fill % rep == 0 else (fill - 1 + rep - 1) // rep + 1
    return dot_m, fill, max(1, touch)


@ahead.op(dry=_dry_attention)
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     window: int | None = None, tree=None, split: bool | None = None) -> torch.Tensor:
    """q [B, H, T, D] at positions [B, T] over the cache k, v [B, KV, S, D] (see the section's
    comment); tree = (base [B], anc [B, T, T] bool, depth [B, T]) or None (contiguous).
    split: one chunk per program (split-K) or each program all of its tokens' chunks (None:
    by the number of programs; never changes a bit). -> [B, H, T, D] in q's dtype."""
    b, h, t, d = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    tuning = active()
    if not use_triton(q) or d & (d - 1) or d < 16 or tuning.numerics.attention == "sdpa":
        return causal_attention_reference(q, k, v, positions, window, tree)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and k.stride() == v.stride()
    rep = h // n_kv
    block_m, fill, touch = causal_tiles(h, n_kv, tree is not None, b, t, n_keys)
    n_tiles = triton.cdiv(t * rep, fill)
    chunk = tuning.numerics.attention_chunk
    n_chunks = triton.cdiv(n_keys, chunk)
    if split is None:  # split-K while the tiles alone leave SMs idle
        split = n_chunks > 1 and b * n_kv * n_tiles < tuning.speed.attention_split_below
    per = 1  # chunks a split program sums (each chunk's partial stored apart: the same bits)
    cap = tuning.speed.attention_split_programs
    if split and cap and b * n_kv * n_tiles * n_chunks > cap:
        per = triton.cdiv(b * n_kv * n_tiles * n_chunks, cap)
        split = triton.cdiv(n_chunks, per) > 1  # one program for every chunk: it folds them itself
    out = torch.empty(b, t, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    positions = positions.contiguous()
    if tree is not None:
        if not isinstance(tree, TreePlan):
            if tree[1].dtype != torch.bool or tree[1].shape != (b, t, t):
                raise TypeError(f"causal_attention: anc must be bool [{b}, {t}, {t}], got {tree[1].dtype} "
                                f"{tuple(tree[1].shape)}")
            tree = tree_plan(*tree)
        base, order, leaf, path = tree.base, tree.order, tree.leaf, tree.path
    else:
        base = order = leaf = path = positions  # unused
    n_prog = triton.cdiv(n_chunks, per) if split else 1
    if split:
        part = torch.empty(b * n_kv * n_chunks * n_tiles * block_m, d, dtype=torch.float32, device=q.device)
        stat = torch.empty(b * n_kv * n_chunks * n_tiles * block_m, 2, dtype=torch.float32, device=q.device)
        counters = split_counters(q.device, b * n_kv * n_tiles)
    else:
        part = stat = counters = out  # unused
    _kernel(_causal_kernel)[(b * n_kv, n_prog, n_tiles)](
        q, k, v, positions, base, order, leaf, path, out, part, stat, counters,
        n_kv, t, n_tiles, n_chunks, per, 1.0 / math.sqrt(d), window or 0,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        positions.stride(0), out.stride(0), out.stride(1), out.stride(2),
        REP=rep, D=d, CHUNK_N=chunk, BLOCK_M=block_m, BLOCK_N=CAUSAL_BLOCK_N, FILL=fill, TOUCH=touch,
        TREE=tree is not None, WINDOWED=bool(window), SPLIT=split, MULTI=split and per > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_stages=1 if split else tuning.speed.attention_stages,  # a split program sums one chunk
        **pdl_options(q, "attention", b * n_kv * n_prog * n_tiles))
    return out


if triton is not None:

    @triton.jit
    def _chunk_turn(part_ptr, stat_ptr, slot, n_chunks, k0, start, r, d, m_i, l_i, acc,
                    CHUNK_N: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr):
        """A split program of several chunks at block k0: where a chunk starts there (past the
        program's first block), the last chunk's partial (acc, max, sum) is stored and the sums
        start again; elsewhere they are returned as they are."""
        turn = (k0 % CHUNK_N == 0) & (k0 > start)
        at = (slot * n_chunks + k0 // CHUNK_N - 1) * BLOCK_M + r
        ok = ((r * 0 + k0) % CHUNK_N == 0) & (r * 0 + k0 > start)  # turn, as a row vector
        tl.store(part_ptr + at[:, None] * D + d[None, :], acc, mask=ok[:, None])
        tl.store(stat_ptr + at * 2, m_i, mask=ok)
        tl.store(stat_ptr + at * 2 + 1, l_i, mask=ok)
        return tl.where(turn, float("-inf"), m_i), tl.where(turn, 0.0, l_i), tl.where(turn, 0.0, acc)

    def _causal_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, base_ptr, order_ptr, leaf_ptr, path_ptr, o_ptr, part_ptr,
                       stat_ptr, cnt_ptr, n_kv, n_tok, n_tiles, n_chunks, per, scale, window,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_ks, s_pb, s_ob, s_oh, s_ot,
                       REP: tl.constexpr, D: tl.constexpr, CHUNK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, FILL: tl.constexpr, TOUCH: tl.constexpr, TREE: tl.constexpr,
                       WINDOWED: tl.constexpr, SPLIT: tl.constexpr, MULTI: tl.constexpr, PRECISION: tl.constexpr,
                       PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        bh = tl.program_id(0)  # (batch row, kv head)
        prog = tl.program_id(1)
        tile = tl.program_id(2)
        b = (bh // n_kv).to(tl.int64)
        g = bh % n_kv
        # the program fills FILL of its BLOCK_M rows with the call's query rows tile * FILL ...:
        # query row i is head i % REP of the KV group for the (i // REP)-th token (of a tree: in
        # the plan's order, so a program's tokens lie on few paths and share their passes)
        r = tl.arange(0, BLOCK_M)
        qrow = tile * FILL + r
        row_ok = (r < FILL) & (qrow < n_tok * REP)
        head = g * REP + qrow % REP
        tok = qrow // REP
        d = tl.arange(0, D)
        base = 1 << 40  # contiguous: no block holds tree positions
        own = tok  # the leaf whose path a row's token reads in the blocks that hold tree positions
        if TREE:
            base = tl.load(base_ptr + b)
            own = tl.load(leaf_ptr + b * n_tok + tok, mask=row_ok, other=0)
            own = tl.where(row_ok, own, n_tok)
            tok = tl.load(order_ptr + b * n_tok + tok, mask=row_ok, other=0)
        tok = tl.where(row_ok, tok, 0)
        pos = tl.load(pos_ptr + b * s_pb + tok, mask=row_ok, other=-1)
        q = tl.load(q_ptr + b * s_qb + head[:, None] * s_qh + tok[:, None] * s_qt + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        hi = tl.max(pos, 0)  # the program's last position
        lo = 0
        if WINDOWED:
            lo = tl.maximum(tl.min(tl.where(row_ok, pos - window + 1, hi), 0), 0)
        kv_off = b * s_kb + g * s_kh
        # the blocks this program sums, in position order: from the window's first block (or
        # its chunk's) to the last position; those from the first block holding a tree position
        # on take a pass per path. The chunk being summed (m_i, l_i, acc) is folded into the
        # running softmax (m_run, ...) when the next chunk starts and after the last block.
        start = (lo // BLOCK_N) * BLOCK_N
        stop = hi + 1
        slot = bh * n_tiles + tile  # a split call's partials: [slot, chunk, BLOCK_M]
        if SPLIT:  # chunks prog * per ... (prog + 1) * per - 1
            start = tl.maximum(prog * per * CHUNK_N, start)
            stop = tl.minimum((prog + 1) * per * CHUNK_N, stop)
        tree_from = tl.minimum(tl.maximum((base // BLOCK_N) * BLOCK_N, start), stop)
        m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_run = tl.zeros([BLOCK_M], tl.float32)
        acc_run = tl.zeros([BLOCK_M, D], tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # keys at their positions' slots: one shape of loop (its loads run ahead)
        for k0 in range(start, tree_from, BLOCK_N):
            if not SPLIT:
                turn = (k0 % CHUNK_N == 0) & (k0 > start)  # a chunk starts: fold the last one in
                m_f = tl.maximum(m_run, m_i)
                m_fs = tl.where(m_f == float("-inf"), 0.0, m_f)
                alpha_f = tl.exp(m_run - m_fs)
                beta_f = tl.exp(m_i - m_fs)
                acc_run = tl.where(turn, acc_run * alpha_f[:, None] + acc * beta_f[:, None], acc_run)
                l_run = tl.where(turn, l_run * alpha_f + l_i * beta_f, l_run)
                m_run = tl.where(turn, m_f, m_run)
                acc = tl.where(turn, 0.0, acc)
                l_i = tl.where(turn, 0.0, l_i)
                m_i = tl.where(turn, float("-inf"), m_i)
            if MULTI:  # a chunk starts: the last one's partial goes out, this one sums from scratch
                m_i, l_i, acc = _chunk_turn(part_ptr, stat_ptr, slot, n_chunks, k0, start, r, d, m_i, l_i, acc,
                                            CHUNK_N, BLOCK_M, D)
            cols = k0 + tl.arange(0, BLOCK_N)
            near = cols <= hi
            allowed = (cols[None, :] <= pos[:, None]) & row_ok[:, None]
            if WINDOWED:
                allowed = allowed & (cols[None, :] > pos[:, None] - window)
            kb = tl.load(k_ptr + kv_off + cols[:, None] * s_ks + d[None, :], mask=near[:, None], other=0.0)
            vb = tl.load(v_ptr + kv_off + cols[:, None] * s_ks + d[None, :], mask=near[:, None], other=0.0)
            s = tl.dot(q, tl.trans(kb), input_precision=PRECISION)
            s = s * scale
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            acc = tl.dot(p.to(vb.dtype), vb, acc * alpha[:, None], input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        if TREE:  # the blocks holding tree positions: each path its own keys, the same arithmetic
            for k0 in range(tree_from, stop, BLOCK_N):
                if not SPLIT:
                    turn = (k0 % CHUNK_N == 0) & (k0 > start)
                    m_f = tl.maximum(m_run, m_i)
                    m_fs = tl.where(m_f == float("-inf"), 0.0, m_f)
                    alpha_f = tl.exp(m_run - m_fs)
                    beta_f = tl.exp(m_i - m_fs)
                    acc_run = tl.where(turn, acc_run * alpha_f[:, None] + acc * beta_f[:, None], acc_run)
                    l_run = tl.where(turn, l_run * alpha_f + l_i * beta_f, l_run)
                    m_run = tl.where(turn, m_f, m_run)
                    acc = tl.where(turn, 0.0, acc)
                    l_i = tl.where(turn, 0.0, l_i)
                    m_i = tl.where(turn, float("-inf"), m_i)
                if MULTI:
                    m_i, l_i, acc = _chunk_turn(part_ptr, stat_ptr, slot, n_chunks, k0, start, r, d, m_i, l_i, acc,
                                                CHUNK_N, BLOCK_M, D)
                cols = k0 + tl.arange(0, BLOCK_N)
                near = cols <= hi
                allowed = (cols[None, :] <= pos[:, None]) & row_ok[:, None]
                if WINDOWED:
                    allowed = allowed & (cols[None, :] > pos[:, None] - window)
                m_out, l_out, acc_out = m_i, l_i, acc
                leaf = tl.min(own, 0)  # the program's paths in turn, by leaf
                depth = cols - base
                in_tree = (depth >= 0) & (depth < n_tok) & near
                for _ in tl.static_range(TOUCH):
                    if leaf < n_tok:
                        mine = own == leaf  # the rows whose token takes this leaf's path
                        at = tl.load(path_ptr + (b * n_tok + leaf) * n_tok + depth, mask=in_tree, other=0)
                        slots = tl.where(cols < base, cols, base + tl.maximum(at, 0))  # (-1: no key seen)
                        kj = tl.load(k_ptr + kv_off + slots[:, None] * s_ks + d[None, :], mask=near[:, None],
                                     other=0.0)
                        vj = tl.load(v_ptr + kv_off + slots[:, None] * s_ks + d[None, :], mask=near[:, None],
                                     other=0.0)
                        s = tl.dot(q, tl.trans(kj), input_precision=PRECISION)
                        s = s * scale
                        s = tl.where(allowed, s, float("-inf"))
                        m_new = tl.maximum(m_i, tl.max(s, 1))
                        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                        p = tl.exp(s - m_safe[:, None])
                        alpha = tl.exp(m_i - m_safe)
                        pv = tl.dot(p.to(vj.dtype), vj, acc * alpha[:, None], input_precision=PRECISION)
                        acc_out = tl.where(mine[:, None], pv, acc_out)
                        l_out = tl.where(mine, l_i * alpha + tl.sum(p, 1), l_out)
                        m_out = tl.where(mine, m_new, m_out)
                    leaf = tl.min(tl.where(own > leaf, own, n_tok), 0)
                m_i, l_i, acc = m_out, l_out, acc_out
        if SPLIT:
            m_run, l_run, acc_run = m_i, l_i, acc
        else:  # fold the last chunk in (the merge below, in the same order)
            m_new = tl.maximum(m_run, m_i)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_run - m_safe)
            beta = tl.exp(m_i - m_safe)
            acc_run = acc_run * alpha[:, None] + acc * beta[:, None]
            l_run = l_run * alpha + l_i * beta
            m_run = m_new
        dst = o_ptr + b * s_ob + head[:, None] * s_oh + tok[:, None] * s_ot + d[None, :]
        if SPLIT:
            # the program's last chunk (none if its chunks hold no key the tile sees: the
            # merge skips those, each an exact no-op in the fold)
            p_at = (slot * n_chunks + (stop - 1) // CHUNK_N) * BLOCK_M + r
            ok = r * 0 + start < stop
            tl.store(part_ptr + p_at[:, None] * D + d[None, :], acc_run, mask=ok[:, None])
            tl.store(stat_ptr + p_at * 2, m_run, mask=ok)
            tl.store(stat_ptr + p_at * 2 + 1, l_run, mask=ok)
            tl.debug_barrier()  # see _split_kernel: stores before the one-thread atomic
            cnt = cnt_ptr + slot
            done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if done == tl.num_programs(1) - 1:
                m = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_sum = tl.zeros([BLOCK_M], tl.float32)
                acc_m = tl.zeros([BLOCK_M, D], tl.float32)
                for ci in range(lo // CHUNK_N, hi // CHUNK_N + 1):  # the chunks holding keys the tile sees
                    at = (slot * n_chunks + ci) * BLOCK_M + r
                    ms = tl.load(stat_ptr + at * 2, cache_modifier=".cg")
                    ls = tl.load(stat_ptr + at * 2 + 1, cache_modifier=".cg")
                    part = tl.load(part_ptr + at[:, None] * D + d[None, :], cache_modifier=".cg")
                    m_new = tl.maximum(m, ms)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp(m - m_safe)
                    beta = tl.exp(ms - m_safe)
                    acc_m = acc_m * alpha[:, None] + part * beta[:, None]
                    l_sum = l_sum * alpha + ls * beta
                    m = m_new
                tl.store(dst, (acc_m / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]).to(o_ptr.dtype.element_ty),
                         mask=row_ok[:, None])
                tl.store(cnt, 0)
        else:
            tl.store(dst, (acc_run / tl.where(l_run == 0.0, 1.0, l_run)[:, None]).to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None])
