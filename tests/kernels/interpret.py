"""Running the Triton kernels on CPU through Triton's interpreter."""

from __future__ import annotations

import importlib.util

import pytest


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def interpret_triton(monkeypatch) -> None:
    """TRITON_INTERPRET=1 for this test. triton.jit picks the interpreter when it wraps a
    function, so kernels are wrapped per mode (see fused._kernel); triton's own library
    functions (tl.sum, tl.max, tl.min, tl.zeros) were wrapped at import, for the GPU: re-wrap those."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from specheads.kernels import fused

    if fused.triton is None:
        pytest.skip("triton did not import")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    for name in ("sum", "max", "min", "zeros"):
        fn = getattr(tl, name)
        if not isinstance(fn, InterpretedFunction):
            monkeypatch.setattr(tl, name, InterpretedFunction(fn.fn))
    # our jitted helpers a kernel calls (attention._chunk_turn, fused.order_key, ...), likewise, in
    # every kernel module that holds them (an imported helper is that module's own binding)
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    from specheads import kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"specheads.kernels.{info.name}")
        for name, fn in list(vars(module).items()):
            if isinstance(fn, JITFunction) and fn.fn.__module__.startswith("specheads.") and not name.endswith("_kernel"):
                monkeypatch.setattr(module, name, InterpretedFunction(fn.fn))


def interpreted_commit_kernel(monkeypatch) -> list:
    """Sets TRITON_INTERPRET=1 for the calling test (so `commit_kv` dispatches CPU tensors to
    the Triton kernel, run by Triton's interpreter); returns a list that records the `src`
    and `n_accept` of every commit_kv_triton call.

    kv_commit wraps the kernel with `triton.jit` per interpreter mode when it launches (a
    kernel jitted once at import would stay a GPU kernel, see
    test_kv_commit.py::test_interpret_env_set_after_import_is_honoured); a kernel that is
    already a GPU JITFunction is re-wrapped for the interpreter here."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    interpret_triton(monkeypatch)  # the other kernels of a step run interpreted too
    from specheads.kernels import kv_commit

    if kv_commit.triton is None:
        pytest.skip("triton did not import")
    from triton.runtime.interpreter import InterpretedFunction

    kernel = kv_commit._commit_kernel
    if hasattr(kernel, "fn") and not isinstance(kernel, InterpretedFunction):  # jitted at import
        monkeypatch.setattr(kv_commit, "_commit_kernel", InterpretedFunction(kernel.fn))
    calls = []
    original = kv_commit.commit_kv_triton

    def recording(cache, base, src, n_accept):
        calls.append((src.detach().cpu().clone(), n_accept.detach().cpu().clone()))
        return original(cache, base, src, n_accept)

    monkeypatch.setattr(kv_commit, "commit_kv_triton", recording)
    return calls


def row_independent_dots(monkeypatch) -> None:
    """tl.dot under the interpreter computed a row at a time. numpy's matmul may round a row
    differently by where it sits in the block (its BLAS blocks rows); a GPU MMA gives a row the
    same bits wherever it sits (checked on the card by gpu_runs/bit_check.py). Tests of which
    bits a kernel's arithmetic gives a row need the GPU's behaviour."""
    import numpy as np
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.ndim == 3:  # a batch of dots, each a row at a time
            rows = np.stack([np.stack([np.matmul(a.data[z, i], b.data[z], dtype=d.data.dtype)
                                       for i in range(a.data.shape[1])]) for z in range(a.data.shape[0])])
        else:
            rows = np.stack([np.matmul(a.data[i], b.data, dtype=d.data.dtype) for i in range(a.data.shape[0])])
        return interpreter.TensorHandle(rows + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
