"""The interpreter's bounds checker (tests/kernels/bounds.py) and the engine's kernels under it.

On the GPU a load or store past every buffer a kernel was given kills the process; the
interpreter would read or write host memory there silently. The checker fails such an access,
so the engine's whole step (prefill, draft, verify, commit) runs here at shapes where an
off-by-one would leave its buffers: contexts past half the cache (the last context bucket is
the cache's own length, not a power of two), prompts as long as the context allows, rows
joining a batch."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import interpret_triton, needs_triton


@needs_triton
def test_the_checker_fails_a_load_one_past_the_end(monkeypatch):
    interpret_triton(monkeypatch)
    import triton
    import triton.language as tl

    from tests.kernels.bounds import OutOfBounds, checked_bounds

    def copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)

    kernel = triton.jit(copy)
    x, y = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    with checked_bounds() as seen:
        kernel[(1,)](x, y, 8, BLOCK=8)
        assert torch.equal(x, y)
        with pytest.raises(Exception) as e:  # the interpreter wraps what the kernel raised
            kernel[(1,)](x, y, 9, BLOCK=16)
    assert isinstance(e.value, OutOfBounds) or isinstance(e.value.__cause__, OutOfBounds), e.value
    assert "copy" in str(e.value) and seen.launches["copy"] == 2


@needs_triton
@pytest.mark.parametrize("method,max_batch", [("eagle3", 1), ("ar", 4)])
def test_engine_steps_stay_inside_their_buffers(method, max_batch, monkeypatch):
    """Greedy generation with the graphs' shapes (buckets), the fused kernels as on CUDA, prompts
    up to the context's end minus the answer: every access of every kernel inside its buffers,
    and the outputs those of plain decoding on the torch reference path (float32: the Triton
    kernels' sums differ from torch's in the last bits only)."""
    from tests.kernels.bounds import checked_bounds
    from tests.runtime.spec_helpers import make_target, random_head, random_prompts
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    target = make_target(seed=0, vocab=64, layers=2, max_positions=256, hidden=64)
    head = random_head(target, kind="eagle3") if method == "eagle3" else None
    prompts = random_prompts(2, 64, [56, 9], seed=3)  # the first reaches the last context bucket
    params = SamplingParams(max_new_tokens=8)

    buckets = []

    def run(method):
        kw = dict(num_steps=3, topk=2, num_draft_tokens=5) if method != "ar" else {}
        engine = SpecEngine(target, head if method != "ar" else None, method, max_len=64, max_batch=max_batch, **kw)
        engine.buckets = True
        if engine.drafter is not None:
            engine.drafter.prepare(torch.device("cpu"))
        step = engine._run

        def recording(b, kv, *rest, **kw):
            buckets.append((kv, engine.cap))
            return step(b, kv, *rest, **kw)

        engine._run = recording
        return [r.token_ids for r in engine.generate(prompts, params)]

    expected = run("ar")
    interpret_triton(monkeypatch)
    target.fuse_for_inference()
    buckets.clear()
    with checked_bounds() as seen:
        got = run(method)
    kv, cap = max(buckets)
    assert kv == cap and cap & (cap - 1), "steps reached the last context bucket, the cache's own length"
    assert seen.launches["_causal_kernel"] > 0 and seen.checked > 0
    assert [len(g) for g in got] == [8, 8]
    assert got == expected
