"""Count the kernels one engine step launches, on CPU, as a stand-in for GPU launches (a small
model's step is bound by them): aten ops that do work, plus Triton kernels (run by the
interpreter; their own tensor work is not counted). Views and metadata ops are not counted.
The step is split into the drafter's propose, the drafter's commit and the rest (the target's
verify forward, acceptance, the KV commit).

    TRITON_INTERPRET=1 python gpu_runs/count_launches.py --method ar eagle3 mtp eagle medusa ngram \
        [--layers 30] [--tree 6,4,15] [--set num_modules=5] [--json out.json]

SmolLM2's shapes with narrow widths (the counts do not depend on widths), random weights.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FREE = {"view", "_unsafe_view", "as_strided", "expand", "slice", "select", "unsqueeze", "squeeze", "permute",
        "transpose", "t", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "reshape", "lift_fresh",
        "_reshape_alias", "empty", "empty_like", "empty_strided", "numpy_T", "unfold", "diagonal", "narrow",
        "is_nonzero", "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}


class Count(TorchDispatchMode):
    """aten ops and Triton launches, by phase."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()  # (phase, name) -> count
        self.depth = 0  # > 0 inside a Triton kernel (the interpreter's own tensor work)
        self.phase = ["step"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE and not self.depth:
            self.ops[(self.phase[-1], name)] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def in_phase(self, name):
        self.phase.append(name)
        try:
            yield
        finally:
            self.phase.pop()


COUNT: Count | None = None


def counting_jit(real_jit):
    """triton.jit whose kernels count each launch (kernel[grid](...)) in COUNT."""
    def jit(fn=None, **kw):
        if fn is None:
            return lambda f: jit(f, **kw)
        kernel = real_jit(fn, **kw)

        class Launcher:
            def __getitem__(self, grid):
                def launch(*a, **k):
                    if COUNT is None:
                        return kernel[grid](*a, **k)
                    COUNT.ops[(COUNT.phase[-1], "triton:" + fn.__name__.strip("_"))] += 1
                    COUNT.depth += 1
                    try:
                        return kernel[grid](*a, **k)
                    finally:
                        COUNT.depth -= 1
                return launch

            def __call__(self, *a, **k):  # a helper called from inside another kernel
                return kernel(*a, **k)

            def __getattr__(self, name):
                return getattr(kernel, name)
        return Launcher()
    return jit


def count_method(method: str, layers: int, tree: tuple[int, int, int], sets: dict) -> dict:
    global COUNT
    from transformers import LlamaConfig

    from specheads.runtime.engine import Request, SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.model import TargetModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=144, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=16, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    target = TargetModel(cfg).eval().requires_grad_(False).fuse_for_inference()  # as on CUDA
    head, kw = None, {}
    if method not in ("ar", "ngram"):
        from specheads.heads.registry import head_kind

        entry = head_kind(method)
        hcfg = entry.config.for_target(target, draft_vocab_size=256,
                                       **{k: v for k, v in sets.items() if k in getattr(entry.config, "SHAPE_OPTIONS", ())})
        head = entry.module(hcfg).eval().requires_grad_(False)
        kw = dict(num_steps=tree[0], topk=tree[1], num_draft_tokens=tree[2])
    elif method == "ngram":
        kw = dict(num_steps=tree[0], topk=1)
    engine = SpecEngine(target, head, method=method, max_batch=1, max_len=256, **kw)
    engine.buckets = True  # the CUDA graphs' shapes
    drafter = engine.drafter
    if drafter is not None:
        drafter.prepare(target.model.embed_tokens.weight.device)  # the fused kernels, as on CUDA
    engine.add(Request(list(range(1, 40)), SamplingParams(max_new_tokens=100)))
    if drafter is not None:
        for name in ("propose", "commit"):
            real = getattr(drafter, name)

            def phased(*a, _real=real, _name=name, **k):
                with (COUNT.in_phase("draft " + _name) if COUNT is not None else contextlib.nullcontext()):
                    return _real(*a, **k)
            setattr(drafter, name, phased)
    engine.step()
    engine.step()
    COUNT = Count()
    with torch.no_grad(), COUNT:
        engine.step()
    ops, COUNT = COUNT.ops, None
    phases = collections.Counter()
    for (phase, _), c in ops.items():
        phases[phase] += c
    return {"method": method, "layers": layers, "total": sum(phases.values()), "phases": dict(phases),
            "by_op": {f"{p} | {n}": c for (p, n), c in ops.most_common()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", nargs="+", default=["ar", "eagle3"])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--tree", default="6,4,15", help="STEPS,TOPK,TOKENS of the drafters' tree")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=INT", help="head shape options, e.g. num_modules=5")
    ap.add_argument("--top", type=int, default=12, help="ops listed per method")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the Triton kernels are what the GPU launches)")
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    for name in ("sum", "max", "min", "zeros"):  # library functions wrapped at import, for the GPU
        setattr(tl, name, InterpretedFunction(getattr(tl, name).fn))
    triton.jit = counting_jit(triton.jit)
    tree = tuple(int(x) for x in args.tree.split(","))
    sets = {k: int(v) for k, v in (s.split("=") for s in args.set)}
    rows = [count_method(m, args.layers, tree, sets) for m in args.method]
    print(f"kernels one step launches ({args.layers} target layers, tree {args.tree}, {sets or 'default shapes'})")
    print(f"{'method':>8} {'total':>6} {'propose':>8} {'commit':>7} {'rest':>6}")
    for r in rows:
        p = r["phases"]
        print(f"{r['method']:>8} {r['total']:>6} {p.get('draft propose', 0):>8} {p.get('draft commit', 0):>7} "
              f"{p.get('step', 0):>6}")
    for r in rows:
        print(f"-- {r['method']}: the most frequent")
        for name, c in list(r["by_op"].items())[:args.top]:
            print(f"  {c:>5}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "tree": args.tree, "sets": sets, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
