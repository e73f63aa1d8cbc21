"""A compile process of `kernels/ahead.py`: `python -m specheads.kernels.compile_worker`.

Its first message names the card (Triton's target: backend, arch, warp size); each later one is a
kernel variant, (module, kernel function name, args, kwargs) with every tensor a `_Mock` of its dtype
and alignment, which it compiles for that card into Triton's cache on disk (TRITON_CACHE_DIR, set by
the process that started it) and answers with True, or with the error's text. Messages are pickles,
each after its length (8 bytes, little-endian), on stdin and stdout; anything else the process
prints goes to stderr. A process of its own, started by `subprocess` rather than `multiprocessing`,
so that it never imports the starting program's main module (a script without a main guard would
run again in it)."""

from __future__ import annotations

import os
import sys

from specheads.kernels.ahead import read_message, write_message


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the answers' own channel; the library's prints go to stderr
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    target = read_message(requests)
    if target is None:
        return
    from importlib import import_module

    from specheads.kernels import fused, offline

    with offline.for_card(target[1], backend=target[0], warp_size=target[2]):
        while (job := read_message(requests)) is not None:
            module, name, args, kwargs = job
            try:
                fused._kernel(getattr(import_module(module), name)).run(*args, grid=(1,), warmup=True, **kwargs)
                write_message(answers, True)
            except Exception as e:  # answered: the starting process compiles this one itself
                write_message(answers, f"{name}: {type(e).__name__}: {e}"[:500])


if __name__ == "__main__":
    main()
