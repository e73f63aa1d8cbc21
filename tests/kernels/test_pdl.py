"""Programmatic dependent launch (kernels/fused.py pdl_options): which launches take it, and
that every kernel that can be launched with it waits for its predecessor before anything else
(a kernel launched early that read first would see stale data)."""
import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from specheads.kernels import attention, draft, fused, kv_commit, linear, tuning, verify

triton = pytest.importorskip("triton")


def _kernels():
    for mod in (attention, draft, fused, kv_commit, linear, verify):
        for name, fn in vars(mod).items():
            if (name.startswith("_") and name.endswith("_kernel") and name != "_kernel" and inspect.isfunction(fn)
                    and fn.__module__ == mod.__name__):
                yield f"{mod.__name__}.{name}", fn


def test_every_kernel_takes_pdl_and_waits_first():
    """Under `if PDL:` a kernel waits, then (`if PDL == 1:`, a grid that fits the card) lets the
    next launch; nothing before the wait may touch memory another kernel writes (an L2 prefetch
    of a weight is allowed)."""
    names = []
    for name, fn in _kernels():
        names.append(name)
        assert "PDL" in inspect.signature(fn).parameters, f"{name} has no PDL parameter"
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        gate = [i for i, s in enumerate(body) if isinstance(s, ast.If) and ast.unparse(s.test) == "PDL"]
        assert len(gate) == 1, f"{name} has no top-level `if PDL:`"
        block = body[gate[0]]
        tail = [ast.unparse(s) for s in block.body[-2:]]
        assert tail == ["gdc_wait()", "if PDL == 1:\n    gdc_launch_dependents()"], f"{name}: {tail}"
        before = body[: gate[0]] + block.body[:-2]
        text = "\n".join(ast.unparse(s) for s in before)
        for op in ("tl.load", "tl.store", "tl.atomic"):
            assert op not in text, f"{name} uses {op} before gdc_wait"
    assert len(names) >= 11, names  # the kernels of the decode chain, the drafter and the verifier


def _fake_cuda(index=0):
    return SimpleNamespace(is_cuda=True, device=torch.device("cuda", index))


def test_pdl_options(monkeypatch, tune):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fused, "_pdl_devices", {})
    assert fused.pdl_options(torch.zeros(1), "linear") == {"PDL": False}  # CPU
    caps = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: caps[d.index])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132))
    if fused.gdc_wait is None:  # a Triton without grid dependency control: never
        assert fused.pdl_options(_fake_cuda(), "linear") == {"PDL": False}
        return
    assert fused.pdl_options(_fake_cuda(0), "linear") == {"PDL": True, "launch_pdl": True}  # Hopper
    assert fused.pdl_options(_fake_cuda(1), "linear") == {"PDL": False}  # Ampere: no PDL
    assert fused.pdl_options(_fake_cuda(0), "topk_expand") == {"PDL": False}  # not in the default set
    tune(pdl_kernels=tuning.PDL_KERNEL_NAMES)  # every kernel
    assert fused.pdl_options(_fake_cuda(0), "topk_expand") == {"PDL": True, "launch_pdl": True}
    with tuning.using(tuning.active().replace(pdl_kernels=frozenset())):  # none
        assert fused.pdl_options(_fake_cuda(0), "linear") == {"PDL": False}
    assert fused.pdl_options(_fake_cuda(0), "linear", 132) == {"PDL": 1, "launch_pdl": True}  # fits the SMs
    assert fused.pdl_options(_fake_cuda(0), "linear", 133) == {"PDL": 2, "launch_pdl": True}  # waits, no early launch
    with tuning.using(tuning.active().replace(pdl_early_programs=1000)):
        assert fused.pdl_options(_fake_cuda(0), "linear", 999)["PDL"] == 1
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter has no grid dependency control
    assert fused.pdl_options(_fake_cuda(0), "linear") == {"PDL": False}


@pytest.mark.parametrize("n,k,elem", [(960, 576, 2), (3072, 576, 2), (576, 1536, 2), (6144, 4096, 2),
                                      (28672, 4096, 2), (128256, 4096, 2), (49152, 576, 2), (960, 576, 4)])
def test_prefetch_columns(n, k, elem):
    cols = linear.prefetch_columns(n, k, elem)
    if cols == 0:  # the budget does not reach one 128-byte line of every row
        assert tuning.active().speed.linear_prefetch_bytes // (n * elem) < 128 // elem
        return
    assert cols & (cols - 1) == 0 and cols >= 128 // elem  # tl.arange needs a power of two
    assert cols < 2 * k  # no further than k rounded up
    assert n * cols * elem <= max(tuning.active().speed.linear_prefetch_bytes, n * 128)  # within the budget


def test_prefetch_covers_a_small_models_weights():
    # SmolLM2-135M's projections are prefetched whole: 576 and 1536 inputs
    assert linear.prefetch_columns(960, 576, 2) >= 576
    assert linear.prefetch_columns(576, 1536, 2) >= 1536
