"""Compiling a start-up's Triton kernels ahead, on every host core at once.

A server's start-up captures a CUDA graph for every batch bucket, context bucket and tree
shape, and the first capture of each kernel variant (its constexprs, argument types and
alignments) compiles it: on a fresh machine one variant after another, 0.2-0.6 s each on one
host core, for a few hundred variants. Much of Triton's compiling holds the GIL (on an H100's
16-core host a pool of 16 threads compiled no faster than 4), so the variants compile in
processes (`kernels/compile_worker.py`), each compiling for the card into Triton's cache on disk,
and then in threads in this process, which find them there and build their launchers (Triton's
`AsyncCompileMode`).

`compile_ahead()` finds the variants without running them: inside it, every kernel op (a
function of this package decorated with `op`) runs twice. First its Triton path, whose
launches only compile (`run(..., warmup=True)`: the binding and specialization of a real
launch, the compile handed to the pool, nothing launched); then its torch reference
(`use_triton` is false for that pass; the attention ops give zeros there instead, `op`'s `dry`),
whose numbers are written into the Triton path's outputs (`_adopt`). So the ops downstream
read real numbers, never an unwritten buffer, in the layouts the real path gives them
(strides and alignments decide their variants too), and a dry run of every captured step
(the engine's `capture_common`) meets every variant its capture will launch, while the
processes compile them. When the block ends each variant is
loaded here, with its launcher (a small C module built with the host's compiler, one per
argument signature, which Triton would otherwise build at the kernel's first real launch), and
every kernel is in Triton's in-memory cache: the capture that follows compiles nothing it was
shown. Without processes (SPECHEADS_COMPILE_PROCESSES=0, or a host of fewer than 4 cores) the
threads compile too, during the dry run.

A repeated launch (the same kernel, argument types, alignments and values: a layer's ops in
every layer) is let through once; Triton would hash its source again for each (68 us a
launch on this project's CPU with Triton 3.6, tens of thousands of launches a start).

Failures cost speed, never output: a Triton path that raises in the dry run is counted and
skipped (its reference still runs), a variant the dry run did not meet compiles at its
capture as before, a variant a process failed to compile compiles in the threads, and a
compile that fails there is compiled again where the capture launches it, and raises its
error there."""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

OFF, DISCOVER, REFERENCE = 0, 1, 2
PROCESS_WAIT_S = 600.0  # after the dry run, at most this long for the processes (the rest compile in threads)
_mode = OFF
_report: "AheadReport | None" = None


def mode() -> int:
    """OFF (kernels launch as usual), DISCOVER (a Triton path's launches compile only) or
    REFERENCE (an op's reference pass inside compile_ahead: torch everywhere)."""
    return _mode


@dataclass
class AheadReport:
    """What a compile_ahead block did: ops run twice, compile-only launches, distinct variants
    handed to the pool (kernels already compiled are not), Triton paths that raised in the dry
    run (the first error kept), the threads, and the seconds spent waiting for the pool at the
    end (the rest of the compiling overlapped the dry run). With compile processes, where the
    seconds went: the dry run's (`dry_seconds`, from the block's start), and the processes' first
    and last answers (`first_compiled_seconds`: their start-up and one compile; `compiled_seconds`:
    the compiling done), each from the block's start; None without processes."""
    workers: int = 0
    processes: int = 0
    ops: int = 0
    launches: int = 0
    variants: int = 0
    failed_ops: int = 0
    first_error: str = ""
    process_failures: int = 0
    wait_seconds: float = 0.0
    seconds: float = 0.0
    dry_seconds: float = 0.0
    first_compiled_seconds: float | None = None
    compiled_seconds: float | None = None
    by_kernel: dict = field(default_factory=dict)  # variants a kernel (its function's name)
    _futures: set = field(default_factory=set, repr=False)
    _seen: set = field(default_factory=set, repr=False)
    _pool: object = field(default=None, repr=False)  # the compile processes (`_Processes`), while they work
    _sent: list = field(default_factory=list, repr=False)  # (jitted, args, kwargs, grid, future) sent to it

    def to_dict(self) -> dict:
        return {"workers": self.workers, "processes": self.processes, "ops": self.ops, "launches": self.launches,
                "variants": self.variants, "failed_ops": self.failed_ops, "first_error": self.first_error,
                "process_failures": self.process_failures, "wait_seconds": round(self.wait_seconds, 2),
                "seconds": round(self.seconds, 2), "dry_seconds": round(self.dry_seconds, 2),
                "first_compiled_seconds": _rounded(self.first_compiled_seconds),
                "compiled_seconds": _rounded(self.compiled_seconds),
                "by_kernel": dict(sorted(self.by_kernel.items(), key=lambda kv: (-kv[1], kv[0])))}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)


def op(fn=None, *, dry=None):
    """A kernel op: a function that takes its Triton path where `use_triton` says so and its
    torch reference elsewhere, each giving the same results (outputs and in-place writes).
    Inside compile_ahead it runs both, Triton first (see the module docstring); elsewhere it
    is `fn` itself.

    dry: what the second pass runs in place of the reference, for an op whose output's numbers
    decide nothing downstream but numbers (an attention's output feeds only projections): a
    function of the op's arguments giving outputs of the reference's shapes, dtypes and devices
    (e.g. zeros) that costs next to nothing. A dry run of every captured step at max batch 64
    called torch's attention about 2,200 times, 17 ms a call on an H100 host under the profiler
    (38 s of its 58; 2026-12-06)."""
    if fn is None:
        return lambda f: op(f, dry=dry)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _mode != DISCOVER:
            return fn(*args, **kwargs)
        report = _report
        report.ops += 1
        laid_out = None
        try:
            laid_out = fn(*args, **kwargs)
        except Exception as e:  # only speed is at stake: the capture compiles what this missed
            report.failed_ops += 1
            if not report.first_error:
                report.first_error = f"{fn.__name__}: {type(e).__name__}: {e}"[:500]
        with _set_mode(REFERENCE):
            return _adopt(laid_out, (dry or fn)(*args, **kwargs))
    return run


def _adopt(laid_out, numbers):
    """The reference's results (numbers) in the Triton path's output tensors (laid_out, unwritten),
    where their shapes agree: the ops downstream then see the layouts the real path gives them
    (strides, alignment), which decide their kernels' variants too."""
    if isinstance(numbers, torch.Tensor):
        if isinstance(laid_out, torch.Tensor) and laid_out is not numbers and laid_out.shape == numbers.shape:
            try:
                return laid_out.copy_(numbers)
            except RuntimeError:  # (an output whose elements overlap)
                return numbers
        return numbers
    if isinstance(numbers, tuple) and isinstance(laid_out, tuple) and len(numbers) == len(laid_out):
        parts = [_adopt(a, b) for a, b in zip(laid_out, numbers)]
        return type(numbers)(*parts) if hasattr(numbers, "_fields") else type(numbers)(parts)
    return numbers


class _CompileOnly:
    """A jitted kernel whose launches compile (in the pool) and run nothing."""

    def __init__(self, jitted):
        self.jitted = jitted

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            report = _report
            report.launches += 1
            seen = (id(self.jitted), _launch_key(args, kwargs))
            if seen in report._seen:  # met before: nothing new to compile
                return None
            report._seen.add(seen)
            if report._pool is not None:  # compiled in a process now, loaded here when the block ends
                job = _job(self.jitted, args, kwargs)
                if job is not None:
                    try:
                        future = report._pool.submit(job)
                    except Exception:  # a broken pool: the rest compile in the threads
                        report._pool = None
                    else:
                        report._sent.append((self.jitted, job[2], job[3], grid, future))
                        return None
            return _warm(self.jitted, args, kwargs, grid)
        return launch


def _warm(jitted, args, kwargs, grid):
    """A compile-only launch: its variant handed to the threads (or found compiled), counted once."""
    report = _report
    kernel = jitted.run(*args, grid=grid, warmup=True, **kwargs)
    if kernel is not None and hasattr(kernel, "result") and id(kernel) not in report._futures:
        report._futures.add(id(kernel))
        report.variants += 1
        name = jitted.fn.__name__
        report.by_kernel[name] = report.by_kernel.get(name, 0) + 1
    return kernel


class _Mock:
    """A tensor argument as Triton specializes a launch on it (its dtype and whether its address
    is a multiple of 16), which pickles: what a compile process gets in place of the tensor."""

    def __init__(self, dtype, aligned: bool):
        self.dtype, self.aligned = dtype, aligned

    def data_ptr(self) -> int:
        return 0 if self.aligned else 8


def _job(jitted, args, kwargs):
    """(module, function name, args, kwargs) for a compile process, tensors as `_Mock`s; None where
    it would not pickle (that launch compiles in the threads)."""
    import pickle

    def one(a):
        return _Mock(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a
    fn = jitted.fn
    job = (fn.__module__, fn.__name__, tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()})
    try:
        pickle.dumps(job)
    except Exception:
        return None
    return job


def read_message(stream):
    """One message of a compile process's pipes (a pickle after its length, 8 bytes little-endian),
    or None at the stream's end."""
    import pickle
    import struct

    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def write_message(stream, message) -> None:
    import pickle
    import struct

    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


class _Processes:
    """Compile processes (`kernels/compile_worker.py`, each compiling for the card `target`: backend,
    arch, warp size, into the Triton cache `cache_dir`), each fed by a thread of this process from
    one queue: `submit(job)` gives a Future, done when the variant is in the cache (its exception: the
    process's error, or its end)."""

    def __init__(self, n: int, target: tuple, cache_dir: str):
        import queue
        import subprocess
        import sys
        import threading
        from pathlib import Path

        env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir))
        env.pop("TRITON_INTERPRET", None)
        root = str(Path(__file__).resolve().parents[2])  # (where this package is imported from)
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.jobs: queue.Queue = queue.Queue()
        self.answered: list[float] = []  # when each answer came (time.perf_counter)
        self.procs = []
        for _ in range(n):
            proc = subprocess.Popen([sys.executable, "-m", "specheads.kernels.compile_worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            self.procs.append(proc)
            write_message(proc.stdin, tuple(target))
            threading.Thread(target=self._feed, args=(proc,), daemon=True, name="specheads-compile-feed").start()

    def _feed(self, proc) -> None:
        while (item := self.jobs.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                write_message(proc.stdin, job)
                answer = read_message(proc.stdout)
            except Exception as e:  # (its pipe broke: the process ended)
                answer = e
            self.answered.append(time.perf_counter())
            if answer is True:
                future.set_result(True)
            else:
                future.set_exception(answer if isinstance(answer, Exception) else
                                     RuntimeError(answer or "the compile process ended"))

    def submit(self, job):
        from concurrent.futures import Future

        future = Future()
        self.jobs.put((job, future))
        return future

    def shutdown(self) -> None:
        """Cancel what is not started; each process ends after the variant in hand (not waited for
        here: a thread reaps them)."""
        import queue
        import threading

        while True:
            try:
                _, future = self.jobs.get_nowait()
            except queue.Empty:
                break
            future.cancel()
        for proc in self.procs:
            self.jobs.put(None)
            try:
                proc.stdin.close()
            except OSError:
                pass
        threading.Thread(target=lambda: [proc.wait() for proc in self.procs], daemon=True,
                         name="specheads-compile-reap").start()


def _process_pool(processes: int):
    """Compile processes for the card this process compiles for, or None where none can start."""
    import triton.compiler
    from triton import knobs
    from triton.compiler import compiler
    from triton.runtime import driver

    if triton.compiler.compile is not compiler.compile:  # compiles stood in for (a count, a test): none here
        return None
    try:
        t = driver.active.get_current_target()
        return _Processes(processes, (t.backend, t.arch, t.warp_size), knobs.cache.dir)
    except Exception:
        return None


def _load_sent(report: AheadReport) -> None:
    """Each variant sent to the processes, once compiled there, launched compile-only here: it
    comes from the cache on disk (its launcher built in the threads), or, where the process failed,
    compiles in the threads."""
    deadline = time.perf_counter() + PROCESS_WAIT_S
    for jitted, args, kwargs, grid, future in report._sent:
        try:
            future.result(timeout=max(0.0, deadline - time.perf_counter()))
        except Exception as e:  # (its error, its process's end, or out of time: compiled in the threads)
            report.process_failures += 1
            if not report.first_error:
                report.first_error = f"compile process: {type(e).__name__}: {e}"[:500]
        try:
            _warm(jitted, args, kwargs, grid)
        except Exception as e:
            report.failed_ops += 1
            if not report.first_error:
                report.first_error = f"{jitted.fn.__name__}: {type(e).__name__}: {e}"[:500]
    report._sent = []


def _launch_key(args, kwargs) -> tuple:
    """What tells two launches of a kernel apart, at least as finely as Triton's specialization:
    a tensor's dtype and 16-byte alignment, a float's type, every other value itself."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return a.dtype, a.data_ptr() % 16 == 0
        if isinstance(a, float):
            return float
        return a
    return tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items()))


def _build_launcher(kernel) -> None:
    """Build a compiled kernel's launcher now (it lands in Triton's cache, where the kernel's first
    launch finds it); best effort: what fails here is built, or fails, at that launch."""
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:
        pass


def _pool_mode(executor):
    """Triton's AsyncCompileMode, each compile followed by its launcher's build in the same task."""
    from triton.runtime._async_compile import AsyncCompileMode

    class CompileAndLink(AsyncCompileMode):
        def submit(self, key, compile_fn, *rest):
            def compile_and_link():
                kernel = compile_fn()
                _build_launcher(kernel)
                return kernel
            return super().submit(key, compile_and_link, *rest)
    return CompileAndLink(executor, ignore_errors=True)


def launcher(jitted):
    """The jitted kernel as `fused._kernel` hands it out: compile-only while discovering."""
    return _CompileOnly(jitted) if _mode == DISCOVER else jitted


@contextmanager
def _set_mode(m: int):
    global _mode
    before, _mode = _mode, m
    try:
        yield
    finally:
        _mode = before


def available() -> bool:
    """Triton with threaded compiles (AsyncCompileMode, Triton >= 3.4) and a GPU to compile for."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def enabled() -> bool:
    """SPECHEADS_COMPILE_AHEAD: on unless 0, false, off or no."""
    return os.environ.get("SPECHEADS_COMPILE_AHEAD", "1").strip().lower() not in ("0", "false", "off", "no")


def _env_count(name: str, least: int, what: str) -> int | None:
    """The whole number in environment variable `name` (at least `least`), None where it is unset."""
    given = os.environ.get(name)
    if not given:
        return None
    try:
        n = int(given)
    except ValueError:
        raise ValueError(f"{name}={given!r}: expected a whole number of {what}") from None
    if n < least:
        raise ValueError(f"{name}={given!r}: expected {least} or more {what}")
    return n


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_processes(workers: int) -> int:
    """Compile processes: SPECHEADS_COMPILE_PROCESSES (0: compile in threads only), else as many as
    the threads (at most 16, each holds its own torch and Triton) on a host of at least 4 cores (on
    fewer, they take the cores the dry run needs, and cost more than they save: on this project's
    2-core CPU a dry run of 215 variants took 79-91 s with two processes against 62-77 s with two
    threads)."""
    given = _env_count("SPECHEADS_COMPILE_PROCESSES", 0, "processes (0: compile in threads only)")
    if given is not None:
        return given
    return min(workers, 16) if _cores() >= 4 else 0


def default_workers() -> int:
    """Threads to compile in: SPECHEADS_COMPILE_THREADS, else the host's cores (up to 32)."""
    given = _env_count("SPECHEADS_COMPILE_THREADS", 1, "threads")
    return given if given is not None else max(1, min(32, _cores()))


@contextmanager
def compile_ahead(workers: int | None = None, processes: int | None = None):
    """Run the block as a dry run whose kernel variants compile in `processes` processes (default:
    `default_processes`), then load in `workers` threads (see the module docstring); yields an
    AheadReport, complete when the block ends, by which time every variant met has compiled. Not
    reentrant."""
    global _report
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    if _mode != OFF:
        raise RuntimeError("compile_ahead() is already active")
    report = AheadReport(workers=workers or default_workers())
    t0 = time.perf_counter()
    report.processes = default_processes(report.workers) if processes is None else processes
    report._pool = _process_pool(report.processes) if report.processes else None
    if report._pool is None:
        report.processes = 0
    processes_pool = report._pool
    pool = ThreadPoolExecutor(max_workers=report.workers, thread_name_prefix="specheads-compile")
    _report = report
    try:
        # ignore_errors: a compile that fails is dropped here and compiled again where the capture
        # launches it, which raises its error
        async_mode = _pool_mode(pool)
        t1 = None
        try:
            with async_mode:
                with _set_mode(DISCOVER):
                    yield report
                    t1 = time.perf_counter()
                    report.dry_seconds = t1 - t0
                    _load_sent(report)
        finally:
            if _async_compile.active_mode.get() is async_mode:  # (Triton 3.6 leaves it set if a result raises)
                _async_compile.active_mode.set(None)
        report.wait_seconds = time.perf_counter() - t1
    finally:
        _report = None
        pool.shutdown(wait=True)
        if processes_pool is not None:
            answered = list(processes_pool.answered)
            if answered:
                report.first_compiled_seconds = min(answered) - t0
                report.compiled_seconds = max(answered) - t0
            processes_pool.shutdown()
        report.seconds = time.perf_counter() - t0


def _marker(fingerprint: dict):
    """Where a start that compiled an engine's kernels leaves its mark: inside Triton's own cache
    (so a cleared cache clears it too), named by a hash of the engine's fingerprint, the versions
    of torch and Triton, the card and this package's kernel sources."""
    import hashlib
    import json
    from pathlib import Path

    import triton
    from triton import knobs

    sources = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        sources.update(path.read_bytes())
    card = [torch.cuda.get_device_name(), list(torch.cuda.get_device_capability())] if torch.cuda.is_available() \
        else ["cpu"]
    key = json.dumps({"engine": fingerprint, "torch": torch.__version__, "triton": triton.__version__, "card": card,
                      "kernels": sources.hexdigest()}, sort_keys=True, default=str)
    return Path(knobs.cache.dir) / "specheads-compiled" / hashlib.sha256(key.encode()).hexdigest()


def compiled_before(fingerprint, *args) -> bool:
    """Whether a start on this machine compiled the kernels of an engine of this fingerprint (a
    dict, or a function of args giving it) into the Triton cache (mark_compiled)."""
    try:
        return _marker(fingerprint(*args) if callable(fingerprint) else fingerprint).exists()
    except Exception:  # no fingerprint, no cache directory to look in: compile ahead
        return False


def mark_compiled(fingerprint, *args) -> None:
    """Note that this machine's Triton cache holds the kernels of an engine of this fingerprint
    (as compiled_before takes it); best effort: without the mark the next start dry-runs again."""
    try:
        path = _marker(fingerprint(*args) if callable(fingerprint) else fingerprint)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except Exception:
        pass
