"""Compiling the Triton kernels for the GPU (sm_90) on a CPU machine.

The interpreter runs a kernel as numpy code, so it accepts programs the GPU compiler rejects
(a loop-carried variable that changes type, a constexpr branch that mixes types). Triton's
compiler needs no GPU: `record_launches` notes every kernel launch (the function, its
arguments and launch options) while the kernels run interpreted, `describe` keeps what a
compiled kernel depends on (argument types, constexpr values, options), and `compile_all`
compiles those for an H100/H200 target down to a cubin, in a fresh process (the interpreter
leaves triton.language patched in the one it ran in).

    python -m tests.kernels.compile_sm90 DESCRIPTIONS.json   (prints the failures as JSON)"""

from __future__ import annotations

import contextlib
import inspect

import torch

_TYPES = {torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def record_launches(monkeypatch) -> list:
    """Every launch through `fused._kernel` from now on: (function, args, kwargs). The kernels
    still run (interpreted, with TRITON_INTERPRET=1)."""
    import importlib
    import pkgutil

    from specheads import kernels
    from specheads.kernels import fused

    launches = []
    real = fused._kernel

    def recording(fn):
        jitted = real(fn)

        class Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches.append((fn, args, kwargs))
                    return jitted[grid](*args, **kwargs)
                return launch
        return Grid()

    for info in pkgutil.iter_modules(kernels.__path__):  # every kernel module, a new one too
        mod = importlib.import_module(f"specheads.kernels.{info.name}")
        if hasattr(mod, "_kernel"):
            monkeypatch.setattr(mod, "_kernel", recording)
    return launches


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


@contextlib.contextmanager
def recording():
    """Inside: the kernels run interpreted (TRITON_INTERPRET=1) and every launch is recorded into the
    list yielded (`record_launches`); both undone after."""
    import pytest

    from tests.kernels.interpret import interpret_triton

    mp = pytest.MonkeyPatch()
    try:
        interpret_triton(mp)
        yield record_launches(mp)
    finally:
        mp.undo()


def describe(launch) -> dict:
    """What makes a compiled kernel: its module and name, argument types, constexpr values and
    options (JSON-able; equal descriptions compile to the same kernel)."""
    fn, args, kwargs = launch
    names = list(inspect.signature(fn).parameters)
    bound = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
    return {"module": fn.__module__, "name": fn.__name__,
            "signature": {k: ("constexpr" if _is_constexpr(fn, k) else _arg_type(v)) for k, v in bound.items()},
            "constexprs": {k: v for k, v in bound.items() if _is_constexpr(fn, k)},
            "options": {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")}}


def tiny_target(layers: int = 2):
    """(config, fused model) of the tiny Llama target the sm_90 compile tests step (seeded)."""
    from transformers import LlamaConfig

    from specheads.target.model import TargetModel

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    torch.manual_seed(0)
    return cfg, TargetModel(cfg).eval().requires_grad_(False).fuse_for_inference()


def distinct(launches: list) -> list[dict]:
    """The descriptions of the recorded launches, each compiled kernel once (first-seen order)."""
    unique = {}
    for launch in launches:
        desc = describe(launch)
        unique.setdefault(repr(desc), desc)
    return list(unique.values())


def _is_constexpr(fn, name: str) -> bool:
    ann = inspect.signature(fn).parameters[name].annotation
    return "constexpr" in str(ann)


def compile_one(desc: dict, capability: int = 90):
    """Compile one description for cuda:sm_{capability} (ptx and cubin); raises the compiler's error."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = getattr(importlib.import_module(desc["module"]), desc["name"])
    src = ASTSource(JITFunction(fn), signature=desc["signature"], constexprs=desc["constexprs"])
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=desc["options"])


def compile_all(descs: list[dict], timeout: float = 900) -> list[str]:
    """Compile each description in a fresh process; returns one line per failure."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(descs, f)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        run = subprocess.run([sys.executable, "-m", "tests.kernels.compile_sm90", f.name], capture_output=True,
                             text=True, timeout=timeout, env=env)
    finally:
        os.unlink(f.name)
    if run.returncode != 0:
        return [f"the compile process failed ({run.returncode}): {run.stderr[-2000:]}"]
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(path: str) -> None:
    import json

    failed = []
    for desc in json.load(open(path)):
        try:
            assert compile_one(desc).asm["cubin"]
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            failed.append(f"{desc['name']} {desc['constexprs']}: {type(e).__name__}: {str(e)[-600:]}")
    print(json.dumps(failed))


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
