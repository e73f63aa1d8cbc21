"""A bounds checker for Triton kernels run by the interpreter (TRITON_INTERPRET=1, CPU tensors).

On the GPU a load or store outside every buffer a kernel was given is an illegal memory access
that kills the process (and every request it serves); under the interpreter the same access
reads or writes whatever host memory lies there, silently. `checked_bounds()` records, per
kernel launch, the address range of each tensor argument's storage, and fails an access whose
active (unmasked) lanes fall outside all of them, naming the kernel and how far out they were.

    with checked_bounds() as seen:
        ... run kernels under the interpreter ...
    assert seen.launches            # the kernels it checked, by name
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np


class OutOfBounds(AssertionError):
    pass


class _State:
    def __init__(self):
        self.ranges = np.zeros((0, 2), dtype=np.uint64)
        self.kernel = ""
        self.launches: Counter = Counter()
        self.checked = 0


@contextlib.contextmanager
def checked_bounds():
    from triton.runtime import interpreter as it

    state = _State()
    builder = it.interpreter_builder
    init_args = it.GridExecutor._init_args_hst
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def recording_init(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        spans = []

        def add(a):
            if isinstance(a, (tuple, list)):
                for x in a:
                    add(x)
            elif hasattr(a, "untyped_storage"):
                s = a.untyped_storage()
                spans.append((s.data_ptr(), s.data_ptr() + s.nbytes()))

        add(list(args_hst))
        add(list(kwargs_hst.values()))
        state.ranges = np.array(sorted(spans), dtype=np.uint64).reshape(-1, 2)
        state.kernel = getattr(self.fn, "__name__", str(self.fn))
        state.launches[state.kernel] += 1
        return args_hst, kwargs_hst

    def check(ptrs, mask, what: str):
        addr = np.asarray(ptrs.data).astype(np.uint64)
        on = np.ones_like(addr, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask.data, dtype=bool),
                                                                                 addr.shape)
        addr = addr[on]
        if addr.size == 0:
            return
        state.checked += addr.size
        size = np.uint64(max(1, getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8) // 8))
        starts, ends = state.ranges[:, 0], state.ranges[:, 1]
        i = np.searchsorted(starts, addr, side="right") - 1
        ok = (i >= 0) & (addr + size <= ends[np.clip(i, 0, None)])
        if not ok.all():
            bad = addr[~ok]
            near = min((int(abs(int(b) - int(e))) for b in bad[:64] for e in ends), default=-1)
            raise OutOfBounds(f"{state.kernel}: {what} of {bad.size} active lanes outside every argument's "
                              f"storage (the nearest {near} bytes past a buffer's end)")

    def checked_load(ptrs, mask, other, cache_policy, is_volatile):
        check(ptrs, mask, "load")
        return load(ptrs, mask, other, cache_policy, is_volatile)

    def checked_store(ptrs, value, mask, cache_policy):
        check(ptrs, mask, "store")
        return store(ptrs, value, mask, cache_policy)

    def checked_rmw(op, ptr, val, mask, sem, scope):
        check(ptr, mask, "atomic")
        return rmw(op, ptr, val, mask, sem, scope)

    def checked_cas(ptr, cmp, val, sem, scope):
        check(ptr, None, "atomic cas")
        return cas(ptr, cmp, val, sem, scope)

    it.GridExecutor._init_args_hst = recording_init
    builder.create_masked_load, builder.create_masked_store = checked_load, checked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = checked_rmw, checked_cas
    try:
        yield state
    finally:
        it.GridExecutor._init_args_hst = init_args
        builder.create_masked_load, builder.create_masked_store = load, store
        builder.create_atomic_rmw, builder.create_atomic_cas = rmw, cas
