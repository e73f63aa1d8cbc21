"""The fused projection kernel (Triton, through the CPU interpreter) against its torch
reference, and the property it exists for: a row's bits do not depend on the other rows of the
call or their number. On the GPU the tensor cores give a row the same bits wherever it sits
(gpu_runs/bit_check.py); the interpreter's numpy matmul rounds by row position, so that test
computes the interpreter's dots a row at a time (interpret.row_independent_dots) and checks
the rest: tiles, K steps and warps from the weight's shape alone."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import linear as lin
from tests.kernels.interpret import interpret_triton, needs_triton, row_independent_dots


@pytest.fixture
def interpret(monkeypatch):
    interpret_triton(monkeypatch)


def _inputs(rows, k, n, seed=0, silu=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(2 * n if silu else n, k, generator=g) / k**0.5
    return g, x, w


@needs_triton
@pytest.mark.parametrize("norm,silu,bias,residual", [
    (False, False, False, False),
    (True, False, True, False),   # a qkv projection (Qwen2 has biases)
    (False, False, False, True),  # o_proj / down_proj onto the residual stream
    (True, True, False, False),   # gate_up with the post-attention norm
    (True, True, True, True),
])
def test_kernel_equals_reference(interpret, norm, silu, bias, residual):
    rows, k, n = 5, 48, 40  # neither a multiple of the blocks: masked edges
    g, x, w = _inputs(rows, k, n, silu=silu)
    x = x.view(1, rows, k)
    kw = dict(
        bias=torch.randn(w.shape[0], generator=g) if bias else None,
        norm_weight=torch.randn(k, generator=g) if norm else None,
        eps=1e-5,
        residual=torch.randn(1, rows, n, generator=g) if residual else None,
        silu=silu,
    )
    out = lin.linear(x, w, **kw)
    ref = lin.linear_reference(x, w, **kw)
    assert out.shape == ref.shape == (1, rows, n)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@needs_triton
def test_strided_input_rows(interpret):
    """The attention output arrives as a [B, T, H*D] view; a sliced input is copied, not misread."""
    g, x, w = _inputs(6, 80, 32, seed=3)
    wide = x[:, :64]  # row stride 80
    torch.testing.assert_close(lin.linear(wide, w[:, :64].contiguous()), lin.linear_reference(wide, w[:, :64]),
                               rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("silu", [False, True])
def test_a_rows_bits_do_not_depend_on_the_call(interpret, monkeypatch, silu):
    """Row 0 alone, among 7, 40 (a tree: the tree row block) and 130 others (a prefill)."""
    row_independent_dots(monkeypatch)
    g, x, w = _inputs(131, 64, 40, seed=8, silu=silu)
    x, w = x.bfloat16(), w.bfloat16()
    kw = dict(norm_weight=torch.rand(64, generator=g).bfloat16() + 0.5, eps=1e-5, silu=silu,
              residual=torch.randn(131, 40, generator=g).bfloat16())
    alone = lin.linear(x[:1], w, **{**kw, "residual": kw["residual"][:1]})
    for rows in (8, 41, 131):
        crowd = lin.linear(x[:rows], w, **{**kw, "residual": kw["residual"][:rows]})
        assert torch.equal(crowd[:1], alone), rows


def test_null_shapes_take_the_reference(tune):
    """A shape set to null in linear_shapes takes cuBLAS at every row count: the reference path."""
    tune(linear_shapes={(16, 32): None})
    _, x, w = _inputs(6, 32, 16, seed=4)
    torch.testing.assert_close(lin.linear(x, w), x @ w.t())


def test_config_depends_on_the_weight_only():
    assert lin._config(49152, 576) == lin._config(49152, 576)
    for n, k in ((960, 576), (3072, 576), (576, 1536), (49152, 576), (6144, 4096), (28672 * 2, 4096), (4096, 14336)):
        block_n, block_k, _, _ = lin._config(n, k)
        assert k % block_k == 0 and block_n in (16, 32, 64, 128)


def test_the_weight_shape_decides_where_a_call_runs():
    """Every width is served by default (a Qwen2.5-7B layer as much as SmolLM2's), at any number
    of rows; only a shape set to null, or K not a multiple of 16, takes cuBLAS."""
    for n, k in ((960, 576), (3072, 576), (576, 1536), (49152, 576), (6144, 4096), (3584, 3584), (3584, 18944),
                 (128256, 4096)):
        assert lin.serves(n, k)
    assert not lin.serves(100, 100)  # not a multiple of 16


def test_tile_overrides_for_tuning(tune):
    """Kernel tuning sets a shape's K step and warps (null: cuBLAS) and, apart, its column block
    and stages; other shapes keep the rule."""
    tune(linear_shapes={(6144, 4096): (256, 8), (96, 64): (128, 4), (960, 576): None},
         linear_tiles={(6144, 4096): (16, 3), (96, 64): (16, 2)})
    assert lin._config(6144, 4096) == (16, 256, 8, 3) and lin.serves(6144, 4096)
    assert lin._config(1536, 576) != (16, 256, 8, 3)  # other shapes keep the rule
    assert not lin.serves(960, 576)  # null: this shape keeps cuBLAS
    tune(linear_tiles={})
    assert lin._config(6144, 4096)[1:3] == (256, 8)  # without a tile: the rule's column block and stages
    tune(linear_shapes={(128256, 4096): None})
    assert not lin.serves(128256, 4096)  # null holds for a wide lm_head too


@needs_triton
def test_raised_width_limit_and_a_tile_longer_than_k(interpret, tune):
    """With linear_max_k lowered, a listed wide shape is still served; a K step longer than K is
    masked."""
    tune(linear_max_k=2048, linear_shapes={(2 * 24, 4096): (8192, 4)}, linear_tiles={(2 * 24, 4096): (16, 2)})
    assert lin.serves(2 * 24, 4096) and not lin.serves(5000, 4096)  # wider than linear_max_k: listed shapes only
    g, x, w = _inputs(2, 4096, 24, seed=5, silu=True)
    kw = dict(norm_weight=torch.randn(4096, generator=g), eps=1e-5, silu=True)
    torch.testing.assert_close(lin.linear(x, w, **kw), lin.linear_reference(x, w, **kw), rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("norm_keys", [0, 128, 4096])
def test_norm_pass_unrolled_over_a_ragged_k(interpret, tune, norm_keys):
    """The norm's first pass loads several K blocks at once (linear_norm_keys): one at a time,
    two (with a last group past K), all; the result is the reference's."""
    tune(linear_norm_keys=norm_keys, linear_shapes={(48, 1040): (64, 4)},  # 17 blocks of 64 over K = 1040
         linear_tiles={(48, 1040): (16, 2)})
    g, x, w = _inputs(3, 1040, 48, seed=6)
    kw = dict(norm_weight=torch.rand(1040, generator=g) + 0.5, eps=1e-5)
    torch.testing.assert_close(lin.linear(x, w, **kw), lin.linear_reference(x, w, **kw), rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("tile, scale, block", [(None, 2, 16), ((32, 16, 4, 2), 1, 16), (None, 4, 16), (None, 1, 32),
                                                (None, 2, 64)])
def test_tree_rows_and_a_caller_tile(interpret, tune, tile, scale, block):
    """A 41-row call (a tree verify: linear_row_block rows, linear_tree_n_scale x wider columns)
    and a caller's own tile (the draft head's lm_head) compute the reference."""
    tune(linear_tree_n_scale=scale, linear_row_block=block)
    g, x, w = _inputs(41, 48, 72, seed=5, silu=True)
    kw = dict(norm_weight=torch.randn(48, generator=g), eps=1e-5, silu=True,
              residual=torch.randn(41, 72, generator=g))
    torch.testing.assert_close(lin.linear(x, w, tile=tile, **kw), lin.linear_reference(x, w, **kw),
                               rtol=1e-5, atol=1e-5)


def test_stages_fit_shared_memory():
    # a down_proj tile (16 + 16 rows x 512 keys, bf16) keeps its 3 stages; a 64-row block of it
    # (64 + 32 rows) is cut to 2 (3 would need 295 KB); nothing is cut below one
    assert lin.fit_stages(3, 16, 16, 512, 2) == 3
    assert lin.fit_stages(3, 64, 32, 512, 2) == 2
    assert lin.fit_stages(4, 64, 4096, 512, 2) == 1


def test_quantize_rows_bounds_the_error():
    """Each row of an int8 weight times its scale is within half a step of the original."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(37, 48, generator=g) * torch.rand(37, 1, generator=g) * 3
    w[5] = 0  # an all-zero row: scale stays positive, the row stays zero
    q, scale = lin.quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()
    assert (q[5] == 0).all() and scale[5] > 0


@needs_triton
@pytest.mark.parametrize("rows, tile", [(1, None), (8, (256, 64, 8, 3)), (20, None)])
def test_int8_weight_equals_reference(interpret, rows, tile):
    """An int8 weight with row scales (a draft's lm_head): the kernel sums the products in
    float32, then scales each column, as the reference does; with the norm, as the lm_head runs.
    (float32: the interpreter's bfloat16 dot is not the GPU's, for any weight.)"""
    g, x, w = _inputs(rows, 64, 300, seed=4)
    q, scale = lin.quantize_rows(w)
    x, nw = x[None], torch.randn(64, generator=g)
    out = lin.linear(x, q, norm_weight=nw, eps=1e-5, tile=tile, weight_scale=scale)
    ref = lin.linear_reference(x, q, norm_weight=nw, eps=1e-5, weight_scale=scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # and close to the unquantized projection (what the draft scores would have been)
    full = lin.linear_reference(x, w, norm_weight=nw, eps=1e-5)
    assert (out - full).abs().max() < 0.02 * full.abs().max()


def test_int8_weight_needs_its_scales():
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    q, scale = lin.quantize_rows(w)
    with pytest.raises(ValueError, match="weight_scale"):
        lin.linear(x, q)
    with pytest.raises(ValueError, match="weight_scale"):
        lin.linear(x, w, weight_scale=scale)


@needs_triton
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_output_into_a_slice_of_a_wider_buffer(monkeypatch, kernels):
    """out=: the result lands in a column slice of a wider buffer (the target's captured features),
    the rest of the buffer untouched; the slice then serves as a later call's input and residual."""
    if kernels == "triton":
        interpret_triton(monkeypatch)
    g, x, w = _inputs(6, 32, 24, seed=5)
    x = x.view(2, 3, 32)
    res = torch.randn(2, 3, 24, generator=g)
    buf = torch.full((2, 3, 72), 7.0)
    got = lin.linear(x, w, residual=res, out=buf[..., 24:48])
    want = lin.linear_reference(x, w, residual=res)
    assert got.data_ptr() == buf[..., 24:48].data_ptr()
    torch.testing.assert_close(buf[..., 24:48], want, rtol=1e-5, atol=1e-5)
    assert (buf[..., :24] == 7).all() and (buf[..., 48:] == 7).all()
    w2 = torch.randn(24, 24, generator=g)
    torch.testing.assert_close(lin.linear(got, w2, residual=got), lin.linear_reference(want, w2, residual=want),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unit column stride"):
        lin.linear(x, w, out=torch.empty(2, 3, 48)[..., ::2])


@pytest.mark.parametrize("n, k, silu", [
    (8960, 1536, True), (4864, 896, True), (151936, 1536, False), (151936, 896, False),  # Qwen2.5 1.5B, 0.5B
    (14336, 4096, True), (128256, 4096, False), (4096, 14336, False), (6144, 4096, False),  # Llama-3.1-8B
    (1536, 576, True), (49152, 576, False)])  # SmolLM2
def test_every_call_plans_a_tile_within_shared_memory(n, k, silu):
    """A decode, a tree, a batch of trees and a prefill each get a tile whose one pipeline stage
    fits the shared memory budget (a Qwen2.5-1.5B prefill once asked an H100 for 393 KB), with a
    K step that still divides K."""
    for rows in (1, 16, 41, 64, 256, 2048):
        for elem in (2, 4):
            block_m, block_n, block_k, warps, stages = lin.plan(rows, n, k, silu, elem)
            cols = (2 if silu else 1) * block_n
            assert (block_m + cols) * block_k * elem * stages <= lin.SMEM_BYTES, (rows, elem)
            assert k % block_k == 0 and block_k >= 16 and stages >= 1


def test_the_plan_keeps_the_tiles_that_fit():
    """Only a tile that would not fit changes: SmolLM2's lm_head over a batch of trees keeps the
    tuned many-rows tile; the 1.5B's gate_up at a prefill gets a shorter K step."""
    speed = lin.active().speed
    block_m, block_n, _, _, _ = lin.plan(256, 49152, 576, False, 2)
    assert (block_m, block_n) == tuple(speed.linear_wide_many_tile)
    _, _, block_k, _, _ = lin.plan(256, 8960, 1536, True, 2)
    assert block_k < lin._config(2 * 8960, 1536)[1]


@needs_triton
def test_a_normed_rows_bits_do_not_depend_on_the_k_step(interpret):
    """The fused norm's mean square is summed in fixed 64-input chunks, whatever K step the
    projection takes (a decode, a tree and a prefill may take different ones: Qwen2.5-1.5B's qkv
    steps 512 inputs at a decode and 128 over 256 rows), so a row's norm keeps its bits. The
    weight picks one input per output (one-hot rows): the products' sum is exact in any order,
    so what could differ is the norm alone (the GPU's k16 dot chain is checked on the card:
    gpu_runs/bit_check.py). float32: the interpreter's bfloat16 dot is not the GPU's."""
    g = torch.Generator().manual_seed(8)
    k, n = 1536, 24
    x = torch.randn(4, k, generator=g) * 3
    w = torch.zeros(n, k)
    w[torch.arange(n), torch.randint(0, k, (n,), generator=g)] = 1.0
    kw = dict(norm_weight=torch.rand(k, generator=g) + 0.5, eps=1e-6)
    outs = [lin.linear(x, w, tile=(16, block_k, 4, 2), **kw) for block_k in (512, 256, 128, 64)]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    torch.testing.assert_close(outs[0], lin.linear_reference(x, w, **kw), rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("silu", [False, True])
def test_a_shapes_many_row_tiles(interpret, monkeypatch, tune, silu):
    """Speed.linear_many_tiles: a call over more rows than an entry's takes its tile (the last
    entry it exceeds), computes the reference, and gives row 0 the bits it has alone."""
    row_independent_dots(monkeypatch)
    g, x, w = _inputs(80, 64, 40, seed=12, silu=silu)
    shape = tuple(w.shape)
    tune(linear_many_tiles={shape: ((20, 32, 16), (60, 16, 32))})
    n = 40
    assert lin.plan(16, n, 64, silu, 2)[:2] == lin.plan(16, n, 64, silu, 2, None)[:2]  # at most 16 rows: the rule
    assert lin.plan(41, n, 64, silu, 2)[:2] == (32, 16) and lin.plan(80, n, 64, silu, 2)[:2] == (16, 32)
    kw = dict(norm_weight=torch.rand(64, generator=g) + 0.5, eps=1e-5, silu=silu,
              residual=torch.randn(80, n, generator=g))
    for dtype in (torch.float32, torch.bfloat16):
        xt, wt = x.to(dtype), w.to(dtype)
        kwt = {key: v.to(dtype) if torch.is_tensor(v) else v for key, v in kw.items()}
        alone = lin.linear(xt[:1], wt, **{**kwt, "residual": kwt["residual"][:1]})
        for rows in (41, 80):
            part = {**kwt, "residual": kwt["residual"][:rows]}
            crowd = lin.linear(xt[:rows], wt, **part)
            if dtype == torch.float32:
                torch.testing.assert_close(crowd, lin.linear_reference(xt[:rows], wt, **part), rtol=1e-5, atol=1e-5)
            assert torch.equal(crowd[:1], alone), (dtype, rows)


def test_many_row_tiles_are_validated():
    from specheads.kernels import tuning

    with pytest.raises(tuning.TuningError, match="linear_many_tiles"):
        tuning.active().replace(linear_many_tiles={(64, 32): ((60, 16, 32), (20, 32, 16))})  # not ascending
    with pytest.raises(tuning.TuningError, match="linear_many_tiles"):
        tuning.active().replace(linear_many_tiles={(64, 32): ((20, 24, 16),)})  # 24 rows: not a power of two


@needs_triton
@pytest.mark.parametrize("silu, k", [(False, 576), (True, 576), (False, 80), (True, 1536)])
def test_folded_norm(interpret, monkeypatch, tune, silu, k):
    """Numerics.linear_norm "folded": the squares summed from the dot's own loads, the output
    scaled by rstd: the reference's values in float32 (rounding differently), and row 0's bf16
    bits the same alone, in a tree's rows and among many rows."""
    row_independent_dots(monkeypatch)
    tune(linear_norm="folded")
    g, x, w = _inputs(80, k, 24, seed=21, silu=silu)
    kw = dict(norm_weight=torch.rand(k, generator=g) + 0.5, eps=1e-5, silu=silu,
              bias=torch.randn(w.shape[0], generator=g), residual=torch.randn(80, 24, generator=g))
    torch.testing.assert_close(lin.linear(x, w, **kw), lin.linear_reference(x, w, **kw), rtol=1e-4, atol=1e-4)
    xb, wb = x.bfloat16(), w.bfloat16()
    kwb = {key: v.bfloat16() if torch.is_tensor(v) else v for key, v in kw.items()}
    alone = lin.linear(xb[:1], wb, **{**kwb, "residual": kwb["residual"][:1]})
    for rows in (16, 41, 80):
        crowd = lin.linear(xb[:rows], wb, **{**kwb, "residual": kwb["residual"][:rows]})
        assert torch.equal(crowd[:1], alone), rows


def test_linear_norm_is_validated():
    from specheads.kernels import tuning

    with pytest.raises(tuning.TuningError, match="linear_norm"):
        tuning.active().replace(linear_norm="fused")
