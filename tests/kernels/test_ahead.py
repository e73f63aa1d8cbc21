"""Compiling a start-up's kernels ahead (kernels/ahead.py), on CPU: Triton compiles for an H100/H200
(sm_90) without a GPU, and a stand-in driver tells its launcher which card to compile for."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.kernels.compile_sm90 import record_launches, tiny_target
from tests.kernels.interpret import interpret_triton, needs_triton


@pytest.fixture
def sm90(monkeypatch, tmp_path):
    """Kernels jitted afresh for an sm_90 card this machine lacks (no interpreter), compiled into
    an empty cache."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from specheads.kernels import fused, offline

    if fused.triton is None:
        pytest.skip("triton did not import")
    with offline.for_card(90):
        yield fused


@pytest.fixture
def no_compile(monkeypatch):
    """Compiles that return at once (what is asked for is still counted)."""
    import triton.compiler

    asked = []

    def compile(src, target=None, options=None, **kw):
        asked.append(src.fn.__name__)
        return object()
    monkeypatch.setattr(triton.compiler, "compile", compile)
    return asked


_COMPILE_TWO = """
import torch
from specheads.kernels import ahead, fused, offline
from specheads.kernels.fused import rmsnorm, rmsnorm_reference

x, w, res = torch.randn(3, 64), torch.rand(64) + 0.5, torch.randn(3, 64)
with offline.for_card(90):
    with ahead.compile_ahead(2, processes=0) as report:  # (in threads: compile processes have their own test)
        out, total = rmsnorm(x, w, 1e-5, res)
        rmsnorm(x, w, 1e-5, res)  # the same variant: one compile
        rmsnorm(torch.randn(2, 200), torch.rand(200), 1e-5)  # another BLOCK, no residual: another
        assert ahead.mode() == ahead.DISCOVER
    kernels = list(fused._jitted[("_rmsnorm_kernel", False)].device_caches[0][0].values())
ref_out, ref_total = rmsnorm_reference(x, w, 1e-5, res)
assert torch.equal(out, ref_out) and torch.equal(total, ref_total)
assert ahead.mode() == ahead.OFF
assert (report.ops, report.launches, report.variants, report.failed_ops) == (3, 3, 2, 0), report
assert report.first_compiled_seconds is None and report.compiled_seconds is None, report  # (no processes)
assert report.to_dict()["compiled_seconds"] is None and 0 < report.dry_seconds <= report.seconds, report
assert len(kernels) == 2 and all(k.asm["cubin"] for k in kernels)  # compiled, in the launcher's cache
print("ok")
"""


@needs_triton
def test_an_op_compiles_its_kernel_and_gives_the_references_numbers(tmp_path):
    """In a fresh process: a process that has run the interpreter (other tests) compiles no more."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-c", _COMPILE_TWO], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@needs_triton
def test_a_failing_triton_path_still_gives_the_references_numbers(sm90, no_compile, monkeypatch):
    from specheads.kernels import ahead
    from specheads.kernels import fused

    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(fused, "_kernel", lambda fn: type("G", (), {"__getitem__": lambda self, g: broken})())
    x, w = torch.randn(2, 32), torch.rand(32)
    with ahead.compile_ahead(1) as report:
        out, _ = fused.rmsnorm(x, w, 1e-6)
    assert torch.equal(out, fused.rmsnorm_reference(x, w, 1e-6)[0])
    assert report.failed_ops == 1 and "rmsnorm: RuntimeError: boom" in report.first_error


@needs_triton
def test_the_block_leaves_no_mode_behind(sm90, no_compile):
    from triton.runtime import _async_compile

    from specheads.kernels import ahead

    with pytest.raises(ValueError):
        with ahead.compile_ahead(1):
            raise ValueError("in the block")
    assert ahead.mode() == ahead.OFF and _async_compile.active_mode.get() is None
    with ahead.compile_ahead(1):
        with pytest.raises(RuntimeError, match="already active"):
            with ahead.compile_ahead(1):
                pass
    assert ahead.mode() == ahead.OFF


def test_compile_threads_and_the_switch_from_the_environment(monkeypatch):
    from specheads.kernels import ahead

    for off in ("0", "false", "OFF", " no"):
        monkeypatch.setenv("SPECHEADS_COMPILE_AHEAD", off)
        assert not ahead.enabled()
    monkeypatch.setenv("SPECHEADS_COMPILE_AHEAD", "1")
    assert ahead.enabled()

    monkeypatch.setenv("SPECHEADS_COMPILE_THREADS", "3")
    assert ahead.default_workers() == 3
    for bad in ("x", "0"):
        monkeypatch.setenv("SPECHEADS_COMPILE_THREADS", bad)
        with pytest.raises(ValueError, match="SPECHEADS_COMPILE_THREADS"):
            ahead.default_workers()
    monkeypatch.delenv("SPECHEADS_COMPILE_THREADS")
    assert 1 <= ahead.default_workers() <= 32

    monkeypatch.setenv("SPECHEADS_COMPILE_PROCESSES", "0")
    assert ahead.default_processes(8) == 0
    monkeypatch.setenv("SPECHEADS_COMPILE_PROCESSES", "5")
    assert ahead.default_processes(8) == 5
    for bad in ("x", "-1"):
        monkeypatch.setenv("SPECHEADS_COMPILE_PROCESSES", bad)
        with pytest.raises(ValueError, match="SPECHEADS_COMPILE_PROCESSES"):
            ahead.default_processes(8)
    monkeypatch.delenv("SPECHEADS_COMPILE_PROCESSES")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert ahead.default_processes(16) == 16  # (a host of 16 cores: as many as the threads)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert ahead.default_processes(2) == 0  # (two cores: threads only)


@needs_triton
def test_a_start_marks_what_it_compiled(monkeypatch, tmp_path):
    from specheads.kernels import ahead

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    one, other = {"graphs": [["1", "128"]]}, {"graphs": [["2", "128"]]}
    assert not ahead.compiled_before(one)
    ahead.mark_compiled(one)
    assert ahead.compiled_before(one) and not ahead.compiled_before(other)


def _tiny_engine(layers: int = 2):
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from specheads.runtime.engine import SpecEngine

    _, target = tiny_target(layers)
    torch.manual_seed(1)
    head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab_size=128)).eval().requires_grad_(False)
    head.fuse_for_inference()
    engine = SpecEngine(target, head, method="eagle3+ngram", num_steps=3, topk=2, num_draft_tokens=5, max_batch=2,
                        max_len=128, speculation_policy="adaptive")
    engine._allocate()
    return engine


def _dry_run_keys(engine, batches=(1, 2), contexts=None):
    """capture_common's buckets and prompt widths, as it would capture them for these batches (and
    the first `contexts` context buckets and prompt widths: all by default)."""
    _, kvs, buckets, widths = engine._capture_plan(batches)
    first = set(kvs[:contexts])
    return [bucket for bucket in buckets if bucket[1] in first], widths[:contexts and 2 * contexts]


def _variants(launches) -> set:
    """The kernel variants of recorded launches as Triton's launcher tells them apart for an sm_90
    card: argument types, the alignment and divisibility of pointers and integers, constexprs,
    options."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders, found = {}, set()
    for fn, args, kwargs in launches:
        if fn not in binders:
            jf = JITFunction(fn)
            binders[fn] = create_function_from_signature(jf.signature, jf.params, backend)
        _, spec, options = binders[fn](*args, **kwargs)
        found.add((fn.__name__, repr(spec), repr(options)))
    return found


@needs_triton
def test_the_dry_run_meets_every_variant_the_capture_launches(sm90, no_compile, monkeypatch):
    """Every kernel variant (argument types, alignments, constexprs, options) that the capture's
    warm-ups launch (the kernels interpreted, the real path) is compiled by the dry run, and the
    dry run leaves the engine's state as it found it: its generations equal plain decoding's.
    Batch 1 and the first context bucket (every tier, gate and variant after a gated step):
    the interpreter takes minutes for the rest."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    from specheads.kernels import ahead, attention

    engine = _tiny_engine()
    buckets, widths = _dry_run_keys(engine, batches=(1,), contexts=1)
    dry = record_launches(monkeypatch)
    before = [t.clone() for t in engine._state()]
    attended = Counter()  # torch's attention, by the dry run's pass (the attention ops' stand-in: none there)
    sdpa = attention.gqa_attention
    monkeypatch.setattr(attention, "gqa_attention", lambda *a: attended.update([ahead.mode()]) or sdpa(*a))
    report = engine._compile_ahead(buckets, widths)
    assert report["failed_ops"] == 0 and report["variants"] > 20, report
    assert attended[ahead.REFERENCE] == 0 and report["ops"] > 100, (attended, report)
    assert all(torch.equal(a, b) for a, b in zip(before, engine._state()))
    assert len(no_compile) == report["variants"]
    found = _variants(dry)
    assert report["by_kernel"] == Counter(name for name, _, _ in found)
    assert len(found) == report["variants"]

    real = pytest.MonkeyPatch()
    try:  # the same steps and prefills with the kernels run (interpreted)
        interpret_triton(real)
        launched = record_launches(real)
        restore = engine._restorer()
        with torch.no_grad():
            for _, _, keys in buckets:
                for key in keys:
                    engine._step(*key)
                    restore()
            for width in widths:
                ids = torch.zeros(1, width, dtype=torch.long)
                engine._prefill_forward(engine.staging, ids, torch.ones(1, dtype=torch.long), False, False)
                restore()
        launched = _variants(launched)
        assert launched == found, (launched - found, found - launched)
    finally:
        real.undo()
    prompts = [list(range(3, 20)), [7, 8, 9, 7, 8, 9, 7, 8]]
    params = SamplingParams(max_new_tokens=12)
    out = engine.generate(prompts, params)
    plain = SpecEngine(engine.target, method="ar", max_batch=2, max_len=128).generate(prompts, params)
    assert [r.token_ids for r in out] == [r.token_ids for r in plain]


@needs_triton
def test_every_context_bucket_shares_the_feeds_variants(sm90, no_compile, monkeypatch):
    """The cache's length is a multiple of 16 (its longest context bucket too), and the head's feed
    writes its masks in one block size at every context: the buckets launch the feed kernel in the
    same variants (a start-up compiles each once; before, each bucket and the last one's odd length
    had their own: 71 of the 250 variants of an adaptive server at max batch 64)."""
    from specheads.kernels.draft import _feed_kernel

    engine = _tiny_engine()
    assert engine.cap % 16 == 0 and engine.cap >= engine.max_len + 1 + engine.max_drafts + 2
    _, kvs, _, _ = engine._capture_plan((1,))
    assert len(kvs) >= 2 and all(kv % 16 == 0 for kv in kvs)
    feeds = {}
    for contexts in (1, None):
        for jitted in list(sm90._jitted.values()):
            jitted.device_caches.clear()
        launches = record_launches(monkeypatch)
        buckets, widths = _dry_run_keys(engine, batches=(1,), contexts=contexts)
        assert engine._compile_ahead(buckets, widths)["failed_ops"] == 0
        feeds[contexts] = {v for v in _variants(launches) if v[0] == _feed_kernel.__name__}
    assert feeds[1] and feeds[None] == feeds[1]


@needs_triton
def test_the_dry_run_skips_layers_that_would_meet_no_new_variant(sm90, no_compile, monkeypatch):
    """A deeper target's dry run runs a layer only where its structure (captured or not) and its
    input's layout are new: it meets the same variants as running every layer, in fewer ops (the
    EAGLE-3 features of layers 1, 3 and 4 of 8: layer 4 reads layer 3's slice, as layer 2 reads
    layer 1's, and layers 5 to 7 are layer 0's kind)."""
    import types

    from specheads.kernels import ahead
    from specheads.target import model

    engine = _tiny_engine(layers=8)
    assert engine.layer_ids == (1, 3, 4)
    buckets, widths = _dry_run_keys(engine, batches=(1, 2), contexts=1)
    runs = {}
    for skip in (True, False):
        if not skip:  # every layer, as before the skip
            monkeypatch.setattr(model, "ahead", types.SimpleNamespace(mode=lambda: ahead.OFF, DISCOVER=ahead.DISCOVER))
        for jitted in list(sm90._jitted.values()):
            jitted.device_caches.clear()  # (each run compiles, and so counts, what it meets)
        launches = record_launches(monkeypatch)
        report = engine._compile_ahead(buckets, widths)
        assert report["failed_ops"] == 0, report
        runs[skip] = (_variants(launches), report["ops"])
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] < 0.8 * runs[False][1], (runs[True][1], runs[False][1])


def test_a_dry_run_that_fails_leaves_the_engine_as_it_was(monkeypatch):
    from specheads.kernels import ahead

    engine = _tiny_engine()
    buckets, widths = _dry_run_keys(engine)

    class Fails:
        def __enter__(self):
            return ahead.AheadReport()

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(ahead, "compile_ahead", lambda: Fails())
    real_step = engine._step
    calls = []

    def step(*key):
        calls.append(key)
        real_step(*key)
        if len(calls) == 2:
            raise RuntimeError("mid dry run")
    monkeypatch.setattr(engine, "_step", step)
    before = [t.clone() for t in engine._state()]
    report = engine._compile_ahead(buckets, widths)
    assert report == {"error": "RuntimeError: mid dry run"}
    assert all(torch.equal(a, b) for a, b in zip(before, engine._state()))
    engine.use_graphs = True  # (compile_kernels works for an engine that captures graphs)
    monkeypatch.setattr(engine, "compile_ahead", False)
    assert engine.compile_kernels([1, 2]) is None


def test_the_summary_names_the_compiles():
    from specheads.runtime.engine import SpecEngine

    base = {"graphs": 10, "tiers": [], "batch_buckets": [1], "context_buckets": [128], "prefill_widths": [16],
            "seconds": 12.0, "measure_seconds": 0, "graph_memory_mib": 5}
    engine = SpecEngine.__new__(SpecEngine)
    engine.graph_report = {**base, "compile_ahead": {"variants": 200, "workers": 16, "seconds": 9.5, "failed_ops": 0}}
    assert "200 kernel variants compiled ahead in 16 threads in 9.5 s" in engine.graph_summary()
    engine.graph_report["compile_ahead"]["processes"] = 16
    assert "200 kernel variants compiled ahead in 16 processes in 9.5 s" in engine.graph_summary()
    engine.graph_report["compile_ahead"].update(dry_seconds=3.3, first_compiled_seconds=2.5, compiled_seconds=8.7)
    assert ("in 16 processes in 9.5 s (dry run 3.3 s; the processes' first answer at 2.5 s, last at 8.7 s)"
            in engine.graph_summary())
    engine.graph_report = {**base, "compile_ahead": {"skipped": "..."}}
    assert "from the Triton cache" in engine.graph_summary()
    engine.graph_report = {**base, "compile_ahead": {"error": "RuntimeError: x"}}
    assert "one by one" in engine.graph_summary()


def test_repeated_launches_reach_triton_once(sm90, no_compile):
    """A layer's launches in every layer: let through once (Triton would hash the source again)."""
    from specheads.kernels import ahead
    from specheads.kernels.fused import rmsnorm

    x, w = torch.randn(3, 64), torch.rand(64) + 0.5
    with ahead.compile_ahead(1) as report:
        for _ in range(5):
            rmsnorm(x, w, 1e-5)
        rmsnorm(x, w, 1e-3)  # (a float's value does not make another variant)
        rmsnorm(x[:, :32].contiguous(), w[:32], 1e-5)  # another BLOCK: another
    assert (report.launches, len(report._seen), report.variants, len(no_compile)) == (7, 2, 2, 2)


_MARKER = """
import sys, torch
sys.path.insert(0, ".")
from tests.kernels.test_ahead import _tiny_engine, _dry_run_keys
from specheads.kernels import ahead
engine = _tiny_engine()
print(ahead._marker(engine._kernel_fingerprint(*_dry_run_keys(engine))).name)
"""


@needs_triton
def test_the_starts_marker_is_the_same_in_every_process(tmp_path):
    """The marker's name must not depend on the process (hash seeds order sets and dicts)."""
    import os
    import subprocess
    import sys

    names = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TRITON_CACHE_DIR": str(tmp_path)}
        env.pop("TRITON_INTERPRET", None)
        run = subprocess.run([sys.executable, "-c", _MARKER], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        names.add(run.stdout.strip().splitlines()[-1])
    assert len(names) == 1


@needs_triton
def test_capture_common_dry_runs_marks_and_skips_at_the_next_start(monkeypatch, tmp_path):
    """capture_common's wiring, on the CPU: the dry run before the captures (for an absent sm_90 card, no
    compiles), the mark after them; a second engine of the same shapes skips the dry run, one of
    other shapes does not; SPECHEADS_COMPILE_AHEAD=0 skips it all."""
    from specheads.kernels import ahead, offline

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ahead, "available", lambda: True)

    def start(max_batch=2, compile_ahead=True):
        engine = _tiny_engine()
        engine.max_batch, engine.compile_ahead = max_batch, compile_ahead
        captured = []
        engine.use_graphs = True
        engine._capture = lambda *key: captured.append(key) or key
        engine._prefill_graph = lambda width, sampled: engine.graphs.setdefault(("prefill", width, sampled), None)
        with offline.for_card(90, compile=False):
            engine.capture_common([1, 2][:max_batch])
        return engine.graph_report["compile_ahead"], captured

    first, captured = start()
    assert first["variants"] > 20 and first["failed_ops"] == 0 and captured
    assert list((tmp_path / "specheads-compiled").iterdir())
    again, captured_again = start()
    assert "skipped" in again and captured_again == captured
    assert "variants" in start(max_batch=1)[0]  # other graphs: another fingerprint
    assert start(compile_ahead=False)[0] is None


@needs_triton
def test_compile_kernels_alone_compiles_marks_and_skips(monkeypatch, tmp_path):
    """An engine whose graphs are captured on first use (a benchmark's) compiles them ahead with
    compile_kernels: a dry run, then the mark; the same engine again skips it; none for a busy
    engine or one that captures no graphs."""
    from specheads.kernels import ahead, offline
    from specheads.runtime.engine import EngineError, Request
    from specheads.runtime.sampling import SamplingParams

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ahead, "available", lambda: True)
    engine = _tiny_engine()
    assert engine.compile_kernels([1]) is None  # (a CPU engine captures no graphs)
    engine.use_graphs = True
    with offline.for_card(90, compile=False):
        first = engine.compile_kernels([1])
        assert first["variants"] > 20 and not engine.graphs  # nothing captured
        assert "skipped" in engine.compile_kernels([1])
    engine.use_graphs = False
    engine.add(Request([1, 2, 3], SamplingParams(max_new_tokens=4)))
    engine.use_graphs = True
    with pytest.raises(EngineError, match="idle engine"):
        engine.compile_kernels([1])


@needs_triton
def test_a_compile_process_is_shown_each_variant_as_the_launch_specializes_it(sm90, no_compile, monkeypatch):
    """A compile process gets each tensor as a `_Mock` (dtype, 16-byte alignment): Triton specializes
    a launch on the mocks as on the tensors (the same variant, so the capture finds it compiled),
    over every launch of a tiny engine's dry run, an unaligned tensor among them."""
    import types

    from specheads.kernels import ahead

    engine = _tiny_engine()
    buckets, widths = _dry_run_keys(engine, batches=(1, 2), contexts=1)
    launches = record_launches(monkeypatch)
    engine._compile_ahead(buckets, widths)
    x = torch.zeros(9)[1:]
    launches.append((launches[0][0], (x,) + launches[0][1][1:], launches[0][2]))  # (its first argument unaligned)
    mocked = []
    for fn, args, kwargs in launches:
        job = ahead._job(types.SimpleNamespace(fn=fn), args, kwargs)
        assert job is not None and job[:2] == (fn.__module__, fn.__name__)
        mocked.append((fn, job[2], job[3]))
    real = [_variants([launch]) for launch in launches]
    assert real == [_variants([launch]) for launch in mocked]
    assert real[-1] != real[0]  # (the alignment tells them apart)


_COMPILE_IN_PROCESSES = """
import sys
import torch
from triton.compiler import compiler
from specheads.kernels import ahead, fused, offline
from specheads.kernels.fused import rmsnorm, rmsnorm_reference

with open(sys.argv[1], "a") as runs:  # (no main guard: a compile process must not run this script again)
    runs.write("ran\\n")
made = []  # variants compiled in this process (a cache hit makes no IR)
make_ir = compiler.ASTSource.make_ir
compiler.ASTSource.make_ir = lambda self, *a, **k: made.append(self.fn.__name__) or make_ir(self, *a, **k)

x, w, res = torch.randn(3, 64), torch.rand(64) + 0.5, torch.randn(3, 64)
with offline.for_card(90):
    with ahead.compile_ahead(2, processes=2) as report:
        out, total = rmsnorm(x, w, 1e-5, res)
        rmsnorm(x, w, 1e-5, res)
        rmsnorm(torch.randn(2, 200), torch.rand(200), 1e-5)
    kernels = list(fused._jitted[("_rmsnorm_kernel", False)].device_caches[0][0].values())
ref_out, ref_total = rmsnorm_reference(x, w, 1e-5, res)
assert torch.equal(out, ref_out) and torch.equal(total, ref_total)
assert (report.processes, report.variants, report.process_failures, report.failed_ops) == (2, 2, 0, 0), report
# where the block's time went: its dry run, the processes' first and last answers (each from its start)
assert 0 < report.dry_seconds <= report.seconds, report
assert 0 < report.first_compiled_seconds <= report.compiled_seconds <= report.seconds, report
d = report.to_dict()
assert d["compiled_seconds"] == round(report.compiled_seconds, 2) and d["dry_seconds"] > 0, d
assert made == [], made  # both compiled in the processes, loaded here from the cache on disk
assert len(kernels) == 2 and all(k.asm["cubin"] for k in kernels)

job = ahead._job  # a variant a process fails on (its kernel's module cannot be found there) compiles here
ahead._job = lambda jitted, args, kwargs: ("no_such_module",) + job(jitted, args, kwargs)[1:]
with offline.for_card(90):
    with ahead.compile_ahead(1, processes=1) as report:
        rmsnorm(torch.randn(5, 32), torch.rand(32), 1e-5)
assert (report.variants, report.process_failures, report.failed_ops) == (1, 1, 0), report
assert "no_such_module" in report.first_error and made == ["_rmsnorm_kernel"], (report, made)
print("ok")
"""


@needs_triton
def test_variants_compile_in_processes_and_load_from_the_cache(tmp_path):
    """With compile processes the variants compile there, for the card this process compiles for,
    into its Triton cache; this process finds them there (it compiles none) with their numbers
    the references', and compiles itself a variant a process failed on. The processes do not run
    the starting script again (it has no main guard)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "compile_in_processes.py"
    script.write_text(_COMPILE_IN_PROCESSES)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    env.pop("TRITON_INTERPRET", None)
    runs = tmp_path / "runs.txt"
    run = subprocess.run([sys.executable, str(script), str(runs)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=os.getcwd())
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
    assert runs.read_text() == "ran\n"
