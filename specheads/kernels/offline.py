"""A CUDA card this machine lacks, for Triton's launcher: kernels launched for it compile (Triton
compiles for a card without one) or are only counted. Planning a start-up on a CPU
(`gpu_runs/startup_time.py --count`) and the compile-ahead tests use it (`for_card`)."""

from __future__ import annotations

from contextlib import contextmanager


class _AbsentCardDriver:
    """What Triton's launcher asks a driver for before it compiles (device, stream, target), for a
    card this machine lacks."""

    def __init__(self, capability: int, backend: str = "cuda", warp_size: int = 32):
        self.capability, self.backend, self.warp_size = capability, backend, warp_size

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.capability, self.warp_size)


@contextmanager
def for_card(capability: int | str = 90, compile: bool = True, backend: str = "cuda", warp_size: int = 32):
    """Kernels launched for a CUDA card of this capability on a machine without one (Triton
    compiles without a GPU): inside, compile_ahead compiles the variants it meets for that card,
    or, with compile=False, only counts them (planning a start-up on a CPU). The kernels are
    jitted afresh inside and forgotten after."""
    import triton.compiler
    from triton.runtime import driver

    from specheads.kernels import fused

    saved = (driver._active, fused._jitted, triton.compiler.compile)
    driver._active, fused._jitted = _AbsentCardDriver(capability, backend, warp_size), {}
    if not compile:
        triton.compiler.compile = lambda src, target=None, options=None, **kw: object()
    try:
        yield
    finally:
        driver._active, fused._jitted, triton.compiler.compile = saved
