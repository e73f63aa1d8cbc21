"""Compiling a start-up's Triton kernels ahead, on every host core at once.

A server's start-up captures a CUDA graph for every batch bucket, context bucket and tree
shape, and the first capture of each kernel variant (its constexprs, argument types and
alignments) compiles it: on a fresh machine one variant after another, 0.2-0.6 s each on one
host core, for a few hundred variants. Triton's compiler releases the GIL for most of its
work, so variants compile side by side in threads (Triton's `AsyncCompileMode`).

`compile_ahead()` finds the variants without running them: inside it, every kernel op (a
function of this package decorated with `op`) runs twice. First its Triton path, whose
launches only compile (`run(..., warmup=True)`: the binding and specialization of a real
launch, the compile handed to the pool, nothing launched); then its torch reference
(`use_triton` is false for that pass), whose numbers are written into the Triton path's
outputs (`_adopt`). So the ops downstream read real numbers, never an unwritten buffer, in the
layouts the real path gives them (strides and alignments decide their variants too), and a
dry run of every captured step (the engine's `capture_common`) meets every variant its
capture will launch, while the pool compiles them, each with its
launcher (a small C module built with the host's compiler, one per argument signature, which
Triton would otherwise build at the kernel's first real launch). When the block ends the
compiles are waited for and every kernel is in Triton's in-memory cache: the capture that
follows compiles nothing it was shown.

A repeated launch (the same kernel, argument types, alignments and values: a layer's ops in
every layer) is let through once; Triton would hash its source again for each (68 us a
launch on this project's CPU with Triton 3.6, tens of thousands of launches a start).

Failures cost speed, never output: a Triton path that raises in the dry run is counted and
skipped (its reference still runs), a variant the dry run did not meet compiles at its
capture as before, and a compile that fails here is compiled again where the capture
launches it, and raises its error there."""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

OFF, DISCOVER, REFERENCE = 0, 1, 2
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
    end (the rest of the compiling overlapped the dry run)."""
    workers: int = 0
    ops: int = 0
    launches: int = 0
    variants: int = 0
    failed_ops: int = 0
    first_error: str = ""
    wait_seconds: float = 0.0
    seconds: float = 0.0
    _futures: set = field(default_factory=set, repr=False)
    _seen: set = field(default_factory=set, repr=False)

    def to_dict(self) -> dict:
        return {"workers": self.workers, "ops": self.ops, "launches": self.launches, "variants": self.variants,
                "failed_ops": self.failed_ops, "first_error": self.first_error,
                "wait_seconds": round(self.wait_seconds, 2), "seconds": round(self.seconds, 2)}


def op(fn):
    """A kernel op: a function that takes its Triton path where `use_triton` says so and its
    torch reference elsewhere, each giving the same results (outputs and in-place writes).
    Inside compile_ahead it runs both, Triton first (see the module docstring); elsewhere it
    is `fn` itself."""
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
            return _adopt(laid_out, fn(*args, **kwargs))
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
            kernel = self.jitted.run(*args, grid=grid, warmup=True, **kwargs)
            if kernel is not None and hasattr(kernel, "result") and id(kernel) not in report._futures:
                report._futures.add(id(kernel))
                report.variants += 1
            return kernel
        return launch


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


def default_workers() -> int:
    """Threads to compile in: SPECHEADS_COMPILE_THREADS, else the host's cores (up to 32)."""
    given = os.environ.get("SPECHEADS_COMPILE_THREADS")
    if given:
        try:
            n = int(given)
        except ValueError:
            raise ValueError(f"SPECHEADS_COMPILE_THREADS={given!r}: expected a whole number of threads") from None
        if n < 1:
            raise ValueError(f"SPECHEADS_COMPILE_THREADS={given!r}: expected at least 1 thread")
        return n
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(32, cores))


@contextmanager
def compile_ahead(workers: int | None = None):
    """Run the block as a dry run whose kernel variants compile in `workers` threads (see the
    module docstring); yields an AheadReport, complete when the block ends, by which time every
    variant met has compiled. Not reentrant."""
    global _report
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    if _mode != OFF:
        raise RuntimeError("compile_ahead() is already active")
    report = AheadReport(workers=workers or default_workers())
    t0 = time.perf_counter()
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
        finally:
            if _async_compile.active_mode.get() is async_mode:  # (Triton 3.6 leaves it set if a result raises)
                _async_compile.active_mode.set(None)
        report.wait_seconds = time.perf_counter() - t1
    finally:
        _report = None
        pool.shutdown(wait=True)
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
