"""Count the operations one engine step launches, on CPU, as a stand-in for GPU kernel
launches (a small model's decode step is bound by launches): aten ops that do work, plus
Triton kernels (run by the interpreter). Views and metadata ops are not counted.

    TRITON_INTERPRET=1 python gpu_runs/count_launches.py [--method eagle3|ar|ngram]
"""
from __future__ import annotations

import argparse
import collections
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FREE = {"view", "_unsafe_view", "as_strided", "expand", "slice", "select", "unsqueeze", "squeeze", "permute",
        "transpose", "t", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "reshape", "lift_fresh",
        "_reshape_alias", "empty", "empty_like", "empty_strided", "numpy_T", "unfold", "diagonal", "narrow",
        "is_nonzero", "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.paused = False  # inside a Triton kernel (the interpreter's own tensor work is not a launch)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE and not self.paused:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    from transformers import LlamaConfig

    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from specheads.kernels import attention, draft, fused, kv_commit, linear, path, verify
    from specheads.runtime.engine import Request, SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.model import TargetModel

    if os.environ.get("TRITON_INTERPRET") == "1":
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        for name in ("sum", "max", "min", "zeros"):  # library functions wrapped at import, for the GPU
            setattr(tl, name, InterpretedFunction(getattr(tl, name).fn))
    # SmolLM2's shape with a small vocab (the count does not depend on the widths)
    cfg = LlamaConfig(vocab_size=512, hidden_size=144, intermediate_size=96, num_hidden_layers=args.layers,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=16, max_position_embeddings=2048)
    target = TargetModel(cfg).eval().requires_grad_(False).fuse_for_inference()
    head = None
    if args.method == "eagle3":
        head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab_size=256)).eval().fuse_for_inference()
    engine = SpecEngine(target, head, method=args.method, max_batch=1, max_len=256)
    engine.buckets = True
    engine.add(Request(list(range(1, 40)), SamplingParams(max_new_tokens=100)))
    engine.step()
    engine.step()
    triton_calls = collections.Counter()
    count = Count()
    for mod, names in ((fused, ["rmsnorm", "rope_cache", "silu_mul", "embedding"]), (kv_commit, ["commit_kv_triton"]),
                       (attention, ["tree_attention"]), (draft, ["head_input", "topk_expand", "select_tree", "feed_inputs"]),
                       (verify, ["tree_masks", "accept", "step_inputs", "finish_step"]), (linear, ["linear"]),
                       (path, ["take_path"])):
        for name in names:
            real = getattr(mod, name)

            def wrapped(*a, _real=real, _name=name, **k):
                triton_calls[_name] += 1
                count.paused = True
                try:
                    return _real(*a, **k)
                finally:
                    count.paused = False
            setattr(mod, name, wrapped)
    import specheads.heads.eagle3 as e3
    import specheads.target.model as tm
    for m in (tm, e3):
        for name in ("rmsnorm", "rope_cache", "silu_mul", "embedding"):
            if hasattr(m, name):
                setattr(m, name, getattr(fused, name))
        m.tree_attention = attention.tree_attention
        m.linear = linear.linear
    import specheads.drafters.eagle as dr
    import specheads.runtime.engine as en
    e3.head_input, dr.topk_expand, dr.select_tree = draft.head_input, draft.topk_expand, draft.select_tree
    dr.feed_inputs, dr.embedding, dr.take_path = draft.feed_inputs, fused.embedding, path.take_path
    en.step_inputs, en.finish_step, en.accept = verify.step_inputs, verify.finish_step, verify.accept
    with torch.no_grad(), count:
        n = len(engine.rows)
        engine._run(1, 128, False, head is not None or args.method == "ngram")
    print(f"{args.method}: {sum(count.ops.values())} aten ops + {sum(triton_calls.values())} Triton launches per step"
          f" (rows {n})")
    for name, c in count.ops.most_common(25):
        print(f"  {c:>5}  {name}")
    print("  triton:", dict(triton_calls))


if __name__ == "__main__":
    main()
