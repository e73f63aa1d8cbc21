"""Programmatic dependent launch (kernels/fused.py pdl_options): which launches take it, and
that every kernel that can be launched with it waits for its predecessor before anything else
(a kernel launched early that read first would see stale data)."""
import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from specheads.kernels import attention, draft, fused, kv_commit, linear, verify

triton = pytest.importorskip("triton")


def _kernels():
    for mod in (attention, draft, fused, kv_commit, linear, verify):
        for name, fn in vars(mod).items():
            if (name.startswith("_") and name.endswith("_kernel") and name != "_kernel" and inspect.isfunction(fn)
                    and fn.__module__ == mod.__name__):
                yield f"{mod.__name__}.{name}", fn


def test_every_kernel_takes_pdl_and_waits_first():
    names = []
    for name, fn in _kernels():
        names.append(name)
        assert "PDL" in inspect.signature(fn).parameters, f"{name} has no PDL parameter"
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        first = body[0]
        assert isinstance(first, ast.If) and ast.unparse(first.test) == "PDL", f"{name} does not start with `if PDL:`"
        calls = [ast.unparse(s.value) for s in first.body]
        assert calls == ["gdc_wait()", "gdc_launch_dependents()"], f"{name}: {calls}"
    assert len(names) >= 12, names  # the kernels of the decode chain, the drafter and the verifier


def _fake_cuda(index=0):
    return SimpleNamespace(is_cuda=True, device=torch.device("cuda", index))


def test_pdl_options(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fused, "_pdl_devices", {})
    assert fused.pdl_options(torch.zeros(1)) == {"PDL": False}  # CPU
    caps = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: caps[d.index])
    if fused.gdc_wait is None:  # a Triton without grid dependency control: never
        assert fused.pdl_options(_fake_cuda()) == {"PDL": False}
        return
    assert fused.pdl_options(_fake_cuda(0)) == {"PDL": True, "launch_pdl": True}  # Hopper
    assert fused.pdl_options(_fake_cuda(1)) == {"PDL": False}  # Ampere: no PDL
    monkeypatch.setattr(fused, "PDL_ENABLED", False)  # SPECHEADS_PDL=0
    assert fused.pdl_options(_fake_cuda(0)) == {"PDL": False}
    monkeypatch.setattr(fused, "PDL_ENABLED", True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter has no grid dependency control
    assert fused.pdl_options(_fake_cuda(0)) == {"PDL": False}
