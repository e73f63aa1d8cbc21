"""Kernel tuning (kernels/tuning.py): defaults, validation, the JSON form, and that the kernels
read the active tuning when they are called."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.kernels import attention, fused, linear, tuning
from specheads.kernels.tuning import KernelTuning, Numerics, Speed, TuningError
from tests.kernels.interpret import interpret_triton, needs_triton


def test_defaults():
    t = KernelTuning()
    assert t.numerics.linear_max_k == 65536  # every width: no call's bits depend on its rows
    assert t.numerics.attention_chunk == 128 and t.numerics.attention == "triton"
    assert t.numerics.attention_row_block == 16 and t.speed.attention_split_below == 128
    assert t.speed.linear_row_block == 16 and t.speed.linear_tree_n_scale == 2 and t.speed.draft_warps == 8
    assert t.speed.pdl_kernels == tuning.PDL_DEFAULT
    # the measured wide tiles, split into K step and warps (numerics) and the rest (speed)
    assert t.numerics.linear_shapes[(6144, 4096)] == (256, 4) and t.speed.linear_tiles[(6144, 4096)] == (64, 4)
    assert set(t.numerics.linear_shapes) == set(t.speed.linear_tiles) == set(tuning.WIDE_TILES)
    assert KernelTuning.for_device("cpu") == t
    assert tuning.active() == t  # nothing in the tests changes it for good


def test_groups_do_not_share_a_field():
    speed = {f for f in Speed.__dataclass_fields__}
    numerics = {f for f in Numerics.__dataclass_fields__}
    assert not speed & numerics  # replace() finds a field's group by its name


def test_frozen():
    t = KernelTuning()
    with pytest.raises(AttributeError):
        t.speed.draft_warps = 4
    with pytest.raises(TypeError):
        t.numerics.linear_shapes[(1, 16)] = (16, 4)


@pytest.mark.parametrize("fields, message", [
    (dict(attention_chunk=96), r"numerics.attention_chunk = 96: expected a power of two >= 64"),
    (dict(attention_chunk=32), r"numerics.attention_chunk = 32: expected a power of two >= 64"),
    (dict(attention="flash"), r"numerics.attention = 'flash': expected 'triton' or 'sdpa'"),
    (dict(linear_max_k=-1), r"numerics.linear_max_k = -1"),
    (dict(linear_max_k=8.0), r"numerics.linear_max_k = 8.0: expected an integer"),
    (dict(attention_split_below=-2), r"speed.attention_split_below = -2"),
    (dict(linear_shapes={(96, 64): (24, 4)}), r"numerics.linear_shapes\[\(96, 64\)\] = \(24, 4\): expected "
                                              r"\[BLOCK_K, num_warps\]: BLOCK_K a power of two >= 16"),
    (dict(linear_shapes={(96, 64): (64, 3)}), r"numerics.linear_shapes\[\(96, 64\)\] = \(64, 3\): expected"),
    (dict(linear_shapes={(96, 64): 64}), r"numerics.linear_shapes\[\(96, 64\)\] = 64: expected \[BLOCK_K"),
    (dict(linear_shapes={"96": (64, 4)}), r"numerics.linear_shapes: weight shape '96' is not of the form \"NxK\""),
    (dict(linear_tiles={(96, 64): (12, 2)}), r"speed.linear_tiles\[\(96, 64\)\] = \(12, 2\): expected \[BLOCK_N"),
    (dict(linear_tiles={(96, 64): (16, 4, 2)}), r"speed.linear_tiles\[\(96, 64\)\] = \(16, 4, 2\): expected \[BLOCK_N"),
    (dict(draft_warps=3), r"speed.draft_warps = 3: expected one of \(1, 2, 4, 8, 16, 32\)"),
    (dict(draft_block=1000), r"speed.draft_block = 1000: expected 0 \(the kernel's default\) or a power of two"),
    (dict(draft_block=8), r"speed.draft_block = 8: expected 0"),
    (dict(linear_row_block=128), r"speed.linear_row_block = 128: expected 16, 32 or 64"),
    (dict(attention_row_block=8), r"numerics.attention_row_block = 8"),
    (dict(pdl_kernels={"linear", "gemm"}), r"speed.pdl_kernels: unknown kernel 'gemm'; expected names from accept"),
    (dict(chunk=64), r"unknown kernel tuning field 'chunk'; expected one of linear_tiles, .*attention_chunk"),
])
def test_validation_names_the_field_and_what_is_allowed(fields, message):
    with pytest.raises(TuningError, match=message):
        KernelTuning().replace(**fields)


def test_replace_changes_one_group_and_keeps_the_rest():
    t = KernelTuning().replace(attention_chunk=64, draft_warps=4)
    assert t.numerics.attention_chunk == 64 and t.speed.draft_warps == 4
    assert t.numerics.linear_max_k == 65536 and t.speed.linear_row_block == 16
    assert KernelTuning().numerics.attention_chunk == 128  # the original is unchanged


def test_json_round_trip():
    t = KernelTuning().replace(attention_chunk=256, linear_shapes={(960, 576): None, (96, 64): (32, 2)},
                               linear_tiles={(96, 64): (32, 3)}, pdl_kernels=frozenset())
    d = t.to_dict()
    assert set(d) == {"speed", "numerics"}
    assert d["numerics"]["linear_shapes"] == {"96x64": [32, 2], "960x576": None}
    assert d["speed"]["linear_tiles"] == {"96x64": [32, 3]} and d["speed"]["pdl_kernels"] == []
    back = KernelTuning.from_dict(json.loads(json.dumps(d)))
    assert back == t and back.to_dict() == d
    assert KernelTuning.from_dict(KernelTuning().to_dict()) == KernelTuning()


def test_from_dict_overrides_the_base():
    base = KernelTuning().replace(draft_warps=4)
    t = KernelTuning.from_dict({"numerics": {"attention_chunk": 64}, "speed": {"pdl_kernels": "all"}}, base=base)
    assert t.numerics.attention_chunk == 64 and t.speed.draft_warps == 4  # the base's, where not given
    assert t.speed.pdl_kernels == tuning.PDL_KERNEL_NAMES
    assert KernelTuning.from_dict({"speed": {"pdl_kernels": "none"}}).speed.pdl_kernels == frozenset()
    # a table given replaces the base's whole: shapes it does not list take the rule
    t = KernelTuning.from_dict({"numerics": {"linear_shapes": {"4096x4096": None}}})
    assert dict(t.numerics.linear_shapes) == {(4096, 4096): None}


@pytest.mark.parametrize("data, message", [
    ({"numerics": {"attention_chunk": 100}}, r"numerics.attention_chunk = 100: expected a power of two >= 64"),
    ({"numerics": {"chunk": 64}}, r"unknown kernel tuning field numerics.chunk; expected one of linear_max_k"),
    ({"speed": {"attention_chunk": 64}}, r"unknown kernel tuning field speed.attention_chunk"),
    ({"linear": {}}, r"unknown kernel tuning group 'linear'; expected 'speed' or 'numerics'"),
    ({"speed": {"pdl_kernels": "some"}}, r"speed.pdl_kernels = 'some': expected a list of kernel names"),
    ({"numerics": {"linear_shapes": {"6144": [64, 4]}}}, r"weight shape '6144' is not of the form"),
    ([1, 2], r"kernel tuning must be an object"),
])
def test_from_dict_errors(data, message):
    with pytest.raises(TuningError, match=message):
        KernelTuning.from_dict(data)


def test_parse_text_or_file(tmp_path):
    assert KernelTuning.parse('{"numerics": {"attention_chunk": 64}}').numerics.attention_chunk == 64
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"speed": {"draft_warps": 2}}))
    assert KernelTuning.parse(str(path)).speed.draft_warps == 2
    with pytest.raises(TuningError, match="neither a JSON object nor a JSON file"):
        KernelTuning.parse(str(tmp_path / "missing.json"))
    with pytest.raises(TuningError, match="is not valid JSON"):
        KernelTuning.parse('{"speed": }')


def test_use_and_using_restore():
    before = tuning.active()
    t = before.replace(linear_max_k=4)
    with tuning.using(t) as got:
        assert got is t and tuning.active() is t
        with tuning.using(before.replace(attention_chunk=64)):
            assert tuning.active().numerics.attention_chunk == 64
        assert tuning.active() is t
    assert tuning.active() is before
    with pytest.raises(RuntimeError), tuning.using(t):
        raise RuntimeError  # restored on an error too
    assert tuning.active() is before
    with pytest.raises(TuningError, match="use\\(\\) takes a KernelTuning"):
        tuning.use({"numerics": {}})


def test_using_changes_the_gemm_route():
    """Numerics decides which weight shapes take our projection; restored after."""
    assert linear.serves(960, 576) and linear.serves(576, 1536)
    with tuning.using(tuning.active().replace(linear_max_k=1024)):
        assert linear.serves(960, 576) and not linear.serves(576, 1536)
    with tuning.using(tuning.active().replace(linear_shapes={(960, 576): None})):
        assert not linear.serves(960, 576) and linear.serves(576, 1536)
    assert linear.serves(960, 576) and linear.serves(576, 1536)


@needs_triton
def test_using_decides_which_kernel_serves(monkeypatch):
    """Under the interpreter a call takes our projection kernel or cuBLAS's reference, and our
    attention or SDPA, as the active tuning says (counted by launches of our kernels)."""
    interpret_triton(monkeypatch)
    launched = []
    real = fused._kernel
    monkeypatch.setattr(linear, "_kernel", lambda fn: launched.append(fn.__name__) or real(fn))
    monkeypatch.setattr(attention, "_kernel", lambda fn: launched.append(fn.__name__) or real(fn))
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 32, generator=g), torch.randn(16, 32, generator=g)
    q, k, v = (torch.randn(1, 2, 3, 16, generator=g) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)

    def run():
        launched.clear()
        linear.linear(x, w)
        attention.tree_attention(q, k, v, mask)
        return list(launched)

    assert run() == ["_linear_kernel", "_split_kernel"]
    with tuning.using(tuning.active().replace(linear_max_k=16, attention="sdpa")):
        assert run() == []
    assert run() == ["_linear_kernel", "_split_kernel"]


def test_pdl_set_is_read_at_call_time(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fused, "_pdl_devices", {torch.device("cuda", 0): (True, 132)})
    if fused.gdc_wait is None:
        pytest.skip("this Triton has no grid dependency control")
    t = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    assert fused.pdl_options(t, "linear")["PDL"]
    with tuning.using(tuning.active().replace(pdl_kernels=frozenset({"topk_expand"}))):
        assert not fused.pdl_options(t, "linear")["PDL"] and fused.pdl_options(t, "topk_expand")["PDL"]
    assert fused.pdl_options(t, "linear")["PDL"]


def test_use_given_applies_a_command_lines_tuning_over_the_defaults(tmp_path):
    """--kernel-tuning of `generate`, `serve` and scripts/bench.py: JSON text or a file, over the
    card's defaults; none given leaves the tuning in use as it is."""
    before = tuning.active()
    try:
        assert tuning.use_given(None) is before and tuning.use_given("") is before
        got = tuning.use_given('{"speed": {"draft_block": 512}}')
        assert got is tuning.active() and got.speed.draft_block == 512
        assert got == KernelTuning.for_device().replace(draft_block=512)
        path = tmp_path / "t.json"
        path.write_text('{"speed": {"draft_warps": 4}}')
        got = tuning.use_given(str(path))
        assert got.speed.draft_warps == 4 and got.speed.draft_block == 0  # over the defaults, not the last one
        with pytest.raises(TuningError, match="draft_block = 3"):
            tuning.use_given('{"speed": {"draft_block": 3}}')
    finally:
        tuning.use(before)
