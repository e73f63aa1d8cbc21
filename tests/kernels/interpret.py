"""Running the Triton KV-commit kernel on CPU through Triton's interpreter."""

from __future__ import annotations

import importlib.util

import pytest


def interpreted_commit_kernel(monkeypatch) -> list:
    """Sets TRITON_INTERPRET=1 for the calling test and makes sure the commit kernel is an
    interpreter kernel; returns a list that records the `src` of every commit_kv_triton call.

    `triton.jit` picks the interpreter when the decorator runs, i.e. when
    specheads.kernels.kv_commit is first imported (at collection time here), not when
    `commit_kv` dispatches; so the kernel is re-wrapped for the interpreter when needed
    (see test_kv_commit.py::test_interpret_env_set_after_import_is_honoured)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from specheads.kernels import kv_commit

    if kv_commit.triton is None:
        pytest.skip("triton did not import")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kv_commit._commit_kernel, InterpretedFunction):
        monkeypatch.setattr(kv_commit, "_commit_kernel", InterpretedFunction(kv_commit._commit_kernel.fn))
    calls = []
    original = kv_commit.commit_kv_triton

    def recording(cache, base, src, n_accept):
        calls.append((src.detach().cpu().clone(), n_accept.detach().cpu().clone()))
        return original(cache, base, src, n_accept)

    monkeypatch.setattr(kv_commit, "commit_kv_triton", recording)
    return calls
