"""Fused kernels for the decode / verify forward, each beside its torch reference.

A small model's decode step is bound by kernel launches, not by arithmetic: the eager
layer runs ~45 kernels (RMSNorm alone is 7). These three cut a layer to ~10:
  rmsnorm      (residual add +) RMSNorm in one pass; also returns the sum
  rope_cache   rotary on q and k of a fused qkv projection, k and v written into the KV
               cache at their slots, q returned in the attention layout
  silu_mul     silu(gate) * up of a fused gate_up projection
Each rounds where the eager modules round (to the activation dtype after every op), so
the fused forward gives the eager forward's numbers.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from specheads.kernels import ahead
from specheads.kernels.tuning import active
from specheads.modules import apply_rotary, rms_norm

try:  # triton is optional on CPU-only installs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
try:  # grid dependency control (Triton >= 3.3); without it every launch waits for the last
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None

# Programmatic dependent launch (Hopper and later): a kernel is launched while its predecessor
# still runs; its programs wait on the GPU (griddepcontrol.wait) for the predecessor's writes,
# then let the next kernel launch. The decode forward is ~185 of our kernels in a row (6 a
# layer); PDL hides the launch and ramp-up gap between them, and a projection asks L2 for its
# weight while it waits (Speed.linear_prefetch_bytes): SmolLM2's 1-token forward 0.87 -> 0.69 ms
# on an H200 (gpu_runs/pdl_check.py). Numbers do not change: every program waits before it
# reads or writes memory another kernel touches (tests/kernels/test_pdl.py). Which kernels take
# it is kernel tuning (kernels/tuning.py: Speed.pdl_kernels, by the names pdl_options is called
# with; by default the target / head forward's kernels).
# A kernel of more programs than the card runs at once (Speed.pdl_early_programs; its SMs) waits
# but does not let the next launch early (PDL 2): the next kernel's programs, launched early, sit
# on SMs waiting while this one's last programs still wait for an SM. On an H200 the engine's
# step jumped ~0.3 ms (SmolLM2, ~10 us a layer) wherever the causal attention took 144 programs
# or more (gpu_runs/bucket_costs.py: gone with the attention off PDL).
_pdl_devices: dict = {}


def pdl_options(t: torch.Tensor, kernel: str, programs: int | None = None) -> dict:
    """Launch options for a kernel (by name) on t's device: the kernel's PDL constexpr (0: off;
    1: wait, then let the next kernel launch; 2: wait only, for a grid of `programs` programs
    past Speed.pdl_early_programs) and, where the GPU and Triton support it, Triton's launch_pdl."""
    speed = active().speed
    if not (gdc_wait is not None and t.is_cuda and kernel in speed.pdl_kernels
            and os.environ.get("TRITON_INTERPRET") != "1"):
        return {"PDL": False}
    on = _pdl_devices.get(t.device)
    if on is None:
        cap = torch.cuda.get_device_capability(t.device)[0] >= 9
        sms = torch.cuda.get_device_properties(t.device).multi_processor_count
        on = _pdl_devices[t.device] = (cap, sms)
    if not on[0]:
        return {"PDL": False}
    early = programs is None or programs <= (speed.pdl_early_programs or on[1])
    return {"PDL": 1 if early else 2, "launch_pdl": True}


# A draft stopped on the device (issue 25's batch-1 lever; drafters/eagle.py, option draft_stop): while
# `skip_stopped(state)` is open, the kernels that take it (a draft depth's projections, rotary and
# attention, and its top-k expansion) read state[0] after their wait and return at once where it is set,
# so a captured step keeps its launches and a depth not drafted costs their launch alone (0.67 us a
# launch with PDL on an H100: gpu_runs/skip_cost.py). Their torch references ignore it (they compute
# every depth; the tree then leaves the deeper nodes out by the same state, so both paths draft the
# same tree).
_skip: "torch.Tensor | None" = None


@contextmanager
def skip_stopped(state: "torch.Tensor | None"):
    """Kernels launched inside return at once where state[0] (int32, on the device) is not 0; None: a
    no-op."""
    global _skip
    old, _skip = _skip, state
    try:
        yield
    finally:
        _skip = old


def skip_state() -> "torch.Tensor | None":
    """The state `skip_stopped` has open, or None."""
    return _skip


def skip_options(t: torch.Tensor) -> dict:
    """A skippable kernel's launch arguments: SKIP (constexpr) and skip_ptr (the state, else t)."""
    return {"SKIP": _skip is not None, "skip_ptr": _skip if _skip is not None else t}


def use_triton(t: torch.Tensor) -> bool:
    """Whether a kernel op takes its Triton path for tensor t: on GPU or under TRITON_INTERPRET=1;
    inside ahead.compile_ahead, in the dry pass (whose launches compile only) and not in the
    reference pass."""
    if triton is None:
        return False
    mode = ahead.mode()
    if mode:
        return mode == ahead.DISCOVER
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------- references
def rmsnorm_reference(x, weight, eps, residual=None):
    """-> (weight * normalized(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
    return rms_norm(x, weight, eps), x


def rope_cache_reference(qkv, cos_table, sin_table, positions, k_cache, v_cache, slots, n_heads, n_kv, head_dim):
    """qkv [B, T, (H + 2 KV) D]; cos/sin tables [P, D] float32; positions, slots [B, T];
    caches [B', KV, S, D]. Writes rotated k and v at their slots; returns rotated q [B, H, T, D]."""
    b, t, _ = qkv.shape
    cos, sin = cos_table[positions], sin_table[positions]
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    c, s = cos[:, None].to(qkv.dtype), sin[:, None].to(qkv.dtype)
    q = apply_rotary(q.view(b, t, n_heads, head_dim).transpose(1, 2), c, s)
    k = apply_rotary(k.view(b, t, n_kv, head_dim).transpose(1, 2), c, s)
    v = v.view(b, t, n_kv, head_dim).transpose(1, 2)
    idx = slots[:, None, :, None].expand(b, n_kv, t, head_dim)
    k_cache[:b].scatter_(2, idx, k)
    v_cache[:b].scatter_(2, idx, v)
    return q.contiguous()


def silu_mul_reference(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------------------- Triton
if triton is not None:

    def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # see pdl_options: the previous kernel's writes are visible after the wait
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: see pid64 in kv_commit
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * n_cols + cols, mask=ok, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            tl.store(sum_ptr + row * n_cols + cols, x, mask=ok)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, axis=0) / n_cols
        y = (xf * (1.0 / tl.sqrt(var + eps))).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        tl.store(out_ptr + row * n_cols + cols, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=ok)

    def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, n_tok,
                           s_pb, s_pt, s_sb, s_st, s_qb, s_qh, s_qt, s_cb, s_ch, s_cs,
                           skip_ptr, N_HEADS: tl.constexpr, N_KV: tl.constexpr, D: tl.constexpr,
                           HALF: tl.constexpr, PDL: tl.constexpr, SKIP: tl.constexpr):
        if PDL:
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        if SKIP:  # a draft depth stopped on the device (skip_stopped)
            if tl.load(skip_ptr) != 0:
                return
        row = tl.program_id(0).to(tl.int64)  # one (batch row, token)
        head = tl.program_id(1)  # q heads, then k heads, then v heads
        b = row // n_tok
        t = row % n_tok
        d = tl.arange(0, HALF)
        src = qkv_ptr + row * (N_HEADS + 2 * N_KV) * D + head * D
        x1 = tl.load(src + d)
        x2 = tl.load(src + HALF + d)
        slot = tl.load(slot_ptr + b * s_sb + t * s_st)
        if head < N_HEADS + N_KV:
            dt = x1.dtype
            pos = tl.load(pos_ptr + b * s_pb + t * s_pt)  # the table row: no gather kernel before this one
            c1 = tl.load(cos_ptr + pos * D + d).to(dt).to(tl.float32)
            c2 = tl.load(cos_ptr + pos * D + HALF + d).to(dt).to(tl.float32)
            s1 = tl.load(sin_ptr + pos * D + d).to(dt).to(tl.float32)
            s2 = tl.load(sin_ptr + pos * D + HALF + d).to(dt).to(tl.float32)
            a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
            # x * cos + rotate_half(x) * sin, rounded after each op as the eager module is
            o1 = ((a1 * c1).to(dt).to(tl.float32) + (-a2 * s1).to(dt).to(tl.float32)).to(dt)
            o2 = ((a2 * c2).to(dt).to(tl.float32) + (a1 * s2).to(dt).to(tl.float32)).to(dt)
            if head < N_HEADS:
                dst = q_ptr + b * s_qb + head * s_qh + t * s_qt
            else:
                dst = kc_ptr + b * s_cb + (head - N_HEADS) * s_ch + slot * s_cs
            tl.store(dst + d, o1)
            tl.store(dst + HALF + d, o2)
        else:
            dst = vc_ptr + b * s_cb + (head - N_HEADS - N_KV) * s_ch + slot * s_cs
            tl.store(dst + d, x1)
            tl.store(dst + HALF + d, x2)

    def _embedding_kernel(ids_ptr, w_ptr, out_ptr, n_cols, s_w, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)  # one token
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        token = tl.load(ids_ptr + row).to(tl.int64)
        tl.store(out_ptr + row * n_cols + cols, tl.load(w_ptr + token * s_w + cols, mask=ok), mask=ok)

    def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n_cols
        g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=ok, other=0.0)
        u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=ok, other=0.0)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
        tl.store(out_ptr + row * n_cols + cols, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=ok)

    # A (value, index) pair packed into one int64 that orders by the float32 value (-0.0 as 0.0),
    # then by the lower index: one max over keys picks the largest value, the first among equals
    # (the top-k expansion, the tree selection, the greedy pick). Ties are torch's.
    @triton.jit
    def order_key(x, idx):
        bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
        return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) + (2147483647 - idx).to(tl.int64)

    @triton.jit
    def key_index(key):
        """The index an order_key holds (int32)."""
        return 2147483647 - (key - ((key >> 32) << 32)).to(tl.int32)

    @triton.jit
    def key_value(key):
        """The value an order_key holds (float32)."""
        hi = (key >> 32).to(tl.int32)
        return (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    _jitted: dict = {}

    def _kernel(fn):
        # wrapped per interpreter mode, so TRITON_INTERPRET=1 set after import is honoured
        key = (fn.__name__, os.environ.get("TRITON_INTERPRET") == "1")
        if key not in _jitted:
            _jitted[key] = triton.jit(fn)
        return ahead.launcher(_jitted[key])  # (inside compile_ahead's dry pass: compile only)


@ahead.op
def rmsnorm(x, weight, eps, residual=None):
    if not use_triton(x):
        return rmsnorm_reference(x, weight, eps, residual)
    n = x.shape[-1]
    # the kernel walks rows n apart: a broadcast (stride-0) or sliced input must be copied first
    x2 = x.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    total = torch.empty_like(x2) if residual is not None else x2
    res = residual.reshape(-1, n).contiguous() if residual is not None else x2
    _kernel(_rmsnorm_kernel)[(x2.shape[0],)](x2, res, weight, out, total, n, eps,
                                             HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n),
                                             **pdl_options(x, "rmsnorm"))
    return out.view(x.shape), total.view(x.shape)


@ahead.op
def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids] ([..., H]): a program per token on GPU (or under TRITON_INTERPRET=1), where
    torch's index_select took 9.3 us for a 16-token tree against 2.2 us for one token (H200)."""
    if not use_triton(weight) or weight.stride(-1) != 1:
        return torch.nn.functional.embedding(ids, weight)
    flat = ids.reshape(-1).contiguous()
    n = weight.shape[1]
    out = torch.empty(flat.numel(), n, dtype=weight.dtype, device=weight.device)
    if flat.numel():
        _kernel(_embedding_kernel)[(flat.numel(),)](flat, weight, out, n, weight.stride(0),
                                                   BLOCK=triton.next_power_of_2(n), **pdl_options(weight, "embedding"))
    return out.view(*ids.shape, n)


@ahead.op
def rope_cache(qkv, cos_table, sin_table, positions, k_cache, v_cache, slots, n_heads, n_kv, head_dim):
    if not use_triton(qkv):
        return rope_cache_reference(qkv, cos_table, sin_table, positions, k_cache, v_cache, slots, n_heads, n_kv,
                                    head_dim)
    b, t, _ = qkv.shape
    assert qkv.is_contiguous() and cos_table.is_contiguous() and sin_table.is_contiguous()
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    q = torch.empty(b, n_heads, t, head_dim, dtype=qkv.dtype, device=qkv.device)
    _kernel(_rope_cache_kernel)[(b * t, n_heads + 2 * n_kv)](
        qkv, cos_table, sin_table, positions, q, k_cache, v_cache, slots, t,
        positions.stride(0), positions.stride(1), slots.stride(0), slots.stride(1),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        N_HEADS=n_heads, N_KV=n_kv, D=head_dim, HALF=head_dim // 2, **pdl_options(qkv, "rope_cache"),
        **skip_options(qkv))
    return q


@ahead.op
def silu_mul(gate_up):
    if not use_triton(gate_up):
        return silu_mul_reference(gate_up)
    n = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * n).contiguous()
    out = torch.empty(gu.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _kernel(_silu_mul_kernel)[(gu.shape[0], triton.cdiv(n, block))](gu, out, n, BLOCK=block, **pdl_options(gu, "silu_mul"))
    return out.view(*gate_up.shape[:-1], n)
