"""The target layer's projections as one Triton kernel each, beside their torch reference.

    y = [residual +] act( [rmsnorm](x) @ W.T [+ bias] )

  norm_weight  RMSNorm x first, inside the kernel (a row's norm is a pass over its K values)
  silu         W is a fused gate_up [2I, K]: y = silu(gate) * up, [.., I]
  residual     added after the projection (the decoder's residual stream)

Why our own GEMM, at every number of rows:
- launches: a layer of a small model is bound by kernel launches, not arithmetic; the norm,
  the activation and the residual add ride in the GEMM (a target layer: 10 kernels -> 6,
  with the one-launch attention).
- lossless in bf16, not only in float32: cuBLAS picks a different algorithm for 1 row than
  for a 33-token tree or a prefill, so a token's logits round differently when verified than
  when decoded, and near-ties flip. Here a row's value never depends on how many rows are in
  the call: the warps come from the weight's shape only (`_config`); the row block, the column block
  and the K step vary with the number of rows (Speed), and the tensor cores give a row the
  same bits in each: a K step is a run of the same k16 products accumulated in order
  (gpu_runs/kernel_bench.py compares every swept tile's bits, gpu_runs/bit_check.py a row
  alone against 8 to 2048 rows, on the card).
Where it runs (kernels/tuning.py, Numerics): every weight shape over inputs of up to
linear_max_k (by default every width), wider ones with an entry in linear_shapes; a shape set to
null there takes the reference (cuBLAS) at every row count.
Every step rounds where the eager modules round (to the activation dtype after the norm,
after the projection, after silu, after the add), so the reference is the eager forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specheads.kernels import ahead
from specheads.kernels.fused import (_kernel, gdc_launch_dependents, gdc_wait, pdl_options, rmsnorm, silu_mul, skip_options,
                                     triton, use_triton)
from specheads.kernels.tuning import active

if triton is not None:
    import triton.language as tl

SMEM_BYTES = 200 * 1024  # pipelined tiles a program may hold in shared memory (stages are cut to fit)
# the fused norm sums a row's squares in chunks of this many inputs, whatever the K step: a K step
# may differ between a decode, a tree and a prefill (Speed), the chunks of a sum may not (the
# SmolLM2 target's K steps are 64 at every row count: its bits are the same as before)
NORM_K = 64


def serves(n: int, k: int) -> bool:
    """Whether a weight of n rows over k inputs runs on this kernel (else cuBLAS), at every
    number of rows: the weight's shape decides, never the call."""
    if k <= 0 or k % 16:
        return False
    numerics = active().numerics
    if (n, k) in numerics.linear_shapes:
        return numerics.linear_shapes[(n, k)] is not None
    return k <= numerics.linear_max_k


def linear_reference(x, weight, bias=None, norm_weight=None, eps=0.0, residual=None, silu=False, weight_scale=None):
    """The same op from torch ops (and the fused norm / silu kernels where those run)."""
    h = rmsnorm(x, norm_weight, eps)[0] if norm_weight is not None else x
    if weight_scale is not None:  # int8 weight rows times their float32 scales, summed in float32
        y = F.linear(h.float(), weight.float()) * weight_scale.float()
        y = (y if bias is None else y + bias.float()).to(h.dtype)
    else:
        y = F.linear(h, weight, bias)
    if silu:
        y = silu_mul(y)
    return y if residual is None else residual + y


def _config(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) from the weight's shape alone (never from
    the number of rows: see the module docstring). Enough column blocks to spread the weight
    over the SMs; the longest K step that divides K. The active tuning's per-shape entries
    replace the rule's: Numerics.linear_shapes the K step and warps, Speed.linear_tiles the
    column block and stages."""
    if 1024 <= k <= 2048 and k % 512 == 0:  # an MLP's down_proj: 3.9 vs 4.4 us at K = 1536 (H100)
        block_k, stages = 512, 3
    else:
        block_k, stages = (128 if k % 128 == 0 and k >= 1024 else 64), 4
    block_n = (64 if k >= 2048 else 128) if n >= 8192 else (32 if n >= 2048 else 16)
    # a narrow model's lm_head: 8 warps (SmolLM2's 49152 x 576 over a 41-row tree 21.7 vs 24.4 us,
    # 1 row 15.5 either way; H200, gpu_runs/verify_kernels.py)
    warps = 8 if n >= 8192 and k < 2048 else 4
    t = active()
    own = t.numerics.linear_shapes.get((n, k))
    if own is not None:
        block_k, warps = own
    tile = t.speed.linear_tiles.get((n, k))
    if tile is not None:
        block_n, stages = tile
    return block_n, block_k, warps, stages


if triton is not None:

    @triton.jit
    def _prefetch_l2(ptrs):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)

    def _linear_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, o_ptr, sc_ptr, n_rows, n_out, n_in, eps,
                       s_xm, s_wn, s_rm, s_om,
                       NORM: tl.constexpr, FOLD: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
                       HAS_RES: tl.constexpr,
                       SCALED: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       NORM_K: tl.constexpr, NORM_UNROLL: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
                       PREFETCH_K: tl.constexpr, LINE: tl.constexpr, skip_ptr, SKIP: tl.constexpr):
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < n_rows
        n_ok = rn < n_out
        if PDL:  # fused.pdl_options
            if PREFETCH_K > 0:  # the weight is no kernel's output: its first columns head for L2 while we wait
                lines = tl.arange(0, PREFETCH_K // LINE) * LINE
                rows_w = tl.where(n_ok, rn, 0)
                cols_w = tl.where(lines < n_in, lines, 0)
                _prefetch_l2(w_ptr + rows_w[:, None] * s_wn + cols_w[None, :])
                if SILU:
                    _prefetch_l2(w_ptr + (rows_w + n_out)[:, None] * s_wn + cols_w[None, :])
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        if SKIP:  # a draft depth stopped on the device (fused.skip_stopped)
            if tl.load(skip_ptr) != 0:
                return
        dt = o_ptr.dtype.element_ty
        ss = tl.zeros([BLOCK_M], tl.float32)  # a row's sum of squares (NORM)
        if NORM and not FOLD:  # a first pass for each row's mean square (K is a few thousand at most)
            # in chunks of NORM_K inputs whatever the K step (a row's bits must not depend on the
            # tile), NORM_UNROLL chunks' loads in flight at once: the pass is latency-bound (one L2
            # round trip per chunk), and it delays the weight stream; the sum keeps its chunk order
            nk = tl.arange(0, NORM_K)
            for k0 in range(0, n_in, NORM_UNROLL * NORM_K):
                for u in tl.static_range(NORM_UNROLL):
                    kk = k0 + u * NORM_K + nk
                    xf = tl.load(x_ptr + rm[:, None] * s_xm + kk[None, :],
                                 mask=m_ok[:, None] & (kk < n_in)[None, :], other=0.0).to(tl.float32)
                    ss += tl.sum(xf * xf, 1)
            rstd = 1.0 / tl.sqrt(ss / n_in + eps)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            kk = k0 + rk
            k_ok = kk < n_in
            a = tl.load(x_ptr + rm[:, None] * s_xm + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
                if FOLD:  # the squares from the dot's own loads, in NORM_K steps (BLOCK_K == NORM_K)
                    af = a.to(tl.float32)
                    ss += tl.sum(af * af, 1)
                    a = (nw[None, :] * af).to(dt)
                else:
                    y = (a.to(tl.float32) * rstd[:, None]).to(dt)
                    a = (nw[None, :] * y.to(tl.float32)).to(dt)
            w = tl.load(w_ptr + rn[:, None] * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if SCALED:  # int8 weights: exact in the input's type; the row scales come after the sum
                w = w.to(tl.float32).to(a.dtype)
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
            if SILU:  # the up rows sit n_out rows below the gate rows
                wu = tl.load(w_ptr + (rn + n_out)[:, None] * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                             other=0.0)
                acc_up = tl.dot(a, tl.trans(wu), acc_up, input_precision=PRECISION)
        if NORM and FOLD:  # rms(x) scales every output of the row
            rstd = 1.0 / tl.sqrt(ss / n_in + eps)
            acc = acc * rstd[:, None]
            acc_up = acc_up * rstd[:, None]
        if SCALED:
            acc = acc * tl.load(sc_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if SILU:
                acc_up += tl.load(b_ptr + n_out + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = acc.to(dt)
        if SILU:
            g = out.to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt)
            out = (s.to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)
        ok = m_ok[:, None] & n_ok[None, :]
        if HAS_RES:
            r = tl.load(r_ptr + rm[:, None] * s_rm + rn[None, :], mask=ok, other=0.0)
            out = (r.to(tl.float32) + out.to(tl.float32)).to(dt)
        tl.store(o_ptr + rm[:, None] * s_om + rn[None, :], out, mask=ok)


def prefetch_columns(n: int, k: int, elem_size: int) -> int:
    """How many leading columns of an [n, k] weight a program prefetches into L2 before its PDL
    wait (a power of two, at least one 128-byte line, at most k rounded up; 0: none): as many
    as Speed.linear_prefetch_bytes of the whole weight allows."""
    line = 128 // elem_size
    cols = active().speed.linear_prefetch_bytes // (n * elem_size)
    if cols < line:
        return 0
    return min(1 << (k - 1).bit_length(), 1 << (cols.bit_length() - 1))


def fit_stages(stages: int, block_m: int, cols: int, block_k: int, elem_size: int) -> int:
    """Pipeline stages cut so that a program's input and weight tiles ([block_m + cols, block_k]
    a stage) fit SMEM_BYTES; at least one."""
    return max(1, min(stages, SMEM_BYTES // ((block_m + cols) * block_k * elem_size)))


def plan(rows: int, n: int, k: int, silu: bool, elem_size: int, tile=None,
         fold: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of a call over `rows` rows of a weight of
    n outputs (after silu) and k inputs: the weight shape's tile (`_config`, or `tile`), the row
    block and the many-rows tiles (Speed), then, where even one pipeline stage would not fit
    SMEM_BYTES (a wide MLP's gate_up under the lm_head's many-rows tile: Qwen2.5-1.5B's 2 x 8960
    x 1536 at a 256-token prefill asked 393 KB of an H100's 227), a shorter K step, then a
    narrower column block. None of these changes a row's bits (see the module docstring).
    fold: a normed call under Numerics.linear_norm "folded", whose K steps are NORM_K."""
    width = 2 * n if silu else n
    block_n, block_k, warps, stages = tile or _config(width, k)
    # a row's bits do not depend on the row block either (checked on the H100 at 16, 64, 128:
    # gpu_runs/linear_check.py). Narrow weights want many programs (16-row blocks), an
    # lm_head wants its 50-100 MB read once (one 64-row block). One 64-row block for the 41-row
    # tree verify on SmolLM2 was slower: its forward 0.88 -> 1.05 ms (H200)
    speed = active().speed
    block_m = 16 if rows <= 16 else 64 if n >= 8192 else speed.linear_row_block
    if rows > 16 and n < 8192:
        block_n *= speed.linear_tree_n_scale
    swept = [(m, n_) for above, m, n_ in speed.linear_many_tiles.get((width, k), ()) if rows > above] if n < 8192 else []
    if n >= 8192 and rows > speed.linear_wide_many_rows:  # an lm_head over a batch of trees
        block_m, block_n = speed.linear_wide_many_tile
    elif swept:  # this shape's tile for this many rows, measured
        block_m, block_n = swept[-1]
        if tile is None:
            block_k, stages = min(block_k, speed.linear_many_k), speed.linear_many_stages
    elif rows > speed.linear_many_rows:  # batched trees, prefills: larger tiles, shorter K steps
        block_m, block_n = speed.linear_many_row_block, max(block_n, speed.linear_many_n)
        if tile is None:
            block_k, stages = min(block_k, speed.linear_many_k), speed.linear_many_stages
    cols = 2 if silu else 1
    while (block_m + cols * block_n) * block_k * elem_size > SMEM_BYTES and block_k > 32:
        block_k //= 2  # still divides k: halving a power of two that did
    while (block_m + cols * block_n) * block_k * elem_size > SMEM_BYTES and block_n > 16:
        block_n //= 2
    stages = fit_stages(stages, block_m, cols * block_n, block_k, elem_size)
    if fold and block_k != NORM_K:  # a folded norm sums the squares in NORM_K steps, the dot's K steps
        block_k = NORM_K
        stages = fit_stages(max(stages, 3), block_m, cols * block_n, block_k, elem_size)
    return block_m, block_n, block_k, warps, stages


def _rows(t: torch.Tensor, k: int) -> torch.Tensor:
    """t as [rows, k] with unit column stride (a view where one exists)."""
    t2 = t.reshape(-1, k)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], float32 scales [N]): each row symmetric over its largest
    magnitude (weight ~= int8 * scale), for `linear(..., weight_scale=)`."""
    scale = weight.float().abs().amax(1).clamp(min=1e-12) / 127.0
    q = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


@ahead.op
def linear(x, weight, bias=None, *, norm_weight=None, eps=0.0, residual=None, silu=False,
           tile: tuple[int, int, int, int] | None = None, weight_scale=None, out=None) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] ([..., N / 2] with silu); see the module docstring.
    tile: (BLOCK_N, BLOCK_K, num_warps, num_stages) instead of the weight shape's (`_config`),
    for a caller whose weight only ever meets this kernel at one row count (the draft head).
    weight_scale: float32 [N] with an int8 weight (`quantize_rows`): half the bytes a call
    streams, for a weight whose outputs need not match a reference bit for bit (a draft's lm_head).
    out: where to write the result ([..., N], unit column stride, rows evenly spaced: a slice of
    a wider buffer); returned."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if (weight.dtype == torch.int8) != (weight_scale is not None):
        raise ValueError("an int8 weight takes its row scales (weight_scale), and only an int8 weight does")
    if weight_scale is not None and silu:
        raise ValueError("int8 weights serve plain projections (no silu)")
    n = weight.shape[0] // 2 if silu else weight.shape[0]
    given = out
    if given is not None and (given.shape != (*x.shape[:-1], n) or given.stride(-1) != 1):
        raise ValueError(f"out {tuple(given.shape)} (strides {given.stride()}) must be [..., {n}] with unit "
                         f"column stride for x {tuple(x.shape)}")
    if not use_triton(x) or not serves(weight.shape[0], k) or weight.stride(-1) != 1:
        y = linear_reference(x, weight, bias, norm_weight, eps, residual, silu, weight_scale)
        return y if given is None else given.copy_(y)
    x2 = _rows(x, k)
    if given is not None:
        out = given.view(rows, n)  # a view, or an error: the rows must be evenly spaced
    else:
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    res = _rows(residual, n) if residual is not None else out
    fold = norm_weight is not None and active().numerics.linear_norm == "folded"
    block_m, block_n, block_k, warps, stages = plan(rows, n, k, silu, x.element_size(), tile, fold)
    speed = active().speed
    grid = (triton.cdiv(n, block_n), triton.cdiv(rows, block_m))
    pdl = pdl_options(x, "linear", grid[0] * grid[1])
    line = 128 // weight.element_size()
    prefetch = prefetch_columns(weight.shape[0], k, weight.element_size()) if pdl["PDL"] else 0
    _kernel(_linear_kernel)[grid](
        x2, weight, bias if bias is not None else out, norm_weight if norm_weight is not None else out, res, out,
        weight_scale if weight_scale is not None else out,
        rows, n, k, float(eps), x2.stride(0), weight.stride(0), res.stride(0), out.stride(0),
        NORM=norm_weight is not None, FOLD=fold, SILU=silu, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        SCALED=weight_scale is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        NORM_K=NORM_K, NORM_UNROLL=max(1, min(speed.linear_norm_keys // NORM_K, triton.cdiv(k, NORM_K)))
        if norm_weight is not None else 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # float32 stays float32 (no TF32)
        PREFETCH_K=prefetch, LINE=line, num_warps=warps, num_stages=stages, **pdl, **skip_options(x))
    return given if given is not None else out.view(*x.shape[:-1], n)
