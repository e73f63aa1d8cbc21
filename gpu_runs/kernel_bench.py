"""On the GPU: the target's projection and causal-attention kernels at a verify step's shapes,
under launch settings (kernels/tuning.py Speed fields: none changes an output bit), beside
cuBLAS and the mask-based attention the engine used before the bit-exact kernels.

    python3 gpu_runs/kernel_bench.py --out DIR [--model smollm2] [--quick] [--prev FILE]

Each op is captured 20 times in a CUDA graph and replayed (PDL as in the engine); prints the
microseconds a call and the best settings per shape and row count; writes DIR/kernel_bench.json.
  linear:    every projection of a layer (qkv + norm, o + residual, gate_up + norm + silu,
             down + residual, lm_head + norm) at 1..1312 rows: (row block, column block,
             stages) against F.linear alone (cuBLAS, no fused norm / silu / add)
  attention: a tree of T tokens per row (random parents) over L committed tokens at batch B:
             causal_attention's tokens a program (Speed.attention_tree_tokens) and split-K
             threshold and loop stages, against tree_attention under the equivalent mask;
             and a decode (one token a row) over L keys
  --prev FILE: also an earlier attention.py (e.g. `git show REV:specheads/kernels/attention.py`),
             timed beside the current one in the same process, with whether their bits agree
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from specheads.kernels import tuning
from specheads.kernels.attention import causal_attention, causal_mask, tree_attention, tree_plan
from specheads.kernels.linear import linear
from older import module_from_source
from timing import graph_us

MODELS = {  # hidden, heads, kv heads, head dim, intermediate, vocab
    "smollm2": (576, 9, 3, 64, 1536, 49152),
    "qwen05": (896, 14, 2, 64, 4864, 151936),
}


def bench_linear(model, rows_list, sweep_rows) -> list[dict]:
    h, nh, nkv, hd, inter, vocab = MODELS[model]
    dev, dt = "cuda", torch.bfloat16
    w = {"qkv": torch.randn((nh + 2 * nkv) * hd, h, device=dev, dtype=dt) * 0.05,
         "o": torch.randn(h, nh * hd, device=dev, dtype=dt) * 0.05,
         "gate_up": torch.randn(2 * inter, h, device=dev, dtype=dt) * 0.05,
         "down": torch.randn(h, inter, device=dev, dtype=dt) * 0.05,
         "lm_head": torch.randn(vocab, h, device=dev, dtype=dt) * 0.05}
    nw = torch.ones(h, device=dev, dtype=dt)
    out = []
    base = tuning.active()
    for rows in rows_list:
        for name, weight in w.items():
            k = weight.shape[1]
            x = torch.randn(rows, k, device=dev, dtype=dt)
            n_out = weight.shape[0] // 2 if name == "gate_up" else weight.shape[0]
            res = torch.randn(rows, n_out, device=dev, dtype=dt)
            kw = dict(norm_weight=nw, eps=1e-5) if name in ("qkv", "gate_up", "lm_head") else dict(residual=res)
            if name == "gate_up":
                kw["silu"] = True
            call = lambda: linear(x, weight, **kw)  # noqa: E731
            cell = {"model": model, "op": name, "rows": rows, "cublas_us": graph_us(lambda: F.linear(x, weight))}
            cell["default_us"] = graph_us(call)
            if "norm_weight" in kw:  # what the fused norm costs: the same call on normed inputs
                plain = {k_: v_ for k_, v_ in kw.items() if k_ not in ("norm_weight", "eps")}
                cell["without_norm_us"] = graph_us(lambda: linear(x, weight, **plain))
                with tuning.using(base.replace(linear_norm="folded")):  # the norm summed in the dot's loop
                    cell["folded_norm_us"] = graph_us(call)
            tried, same = {}, {}
            if rows in sweep_rows:
                ref = call().clone()
                shape = tuple(weight.shape)
                own = base.numerics.linear_shapes.get(shape)
                if name == "lm_head":
                    grid = itertools.product((64, 128), (128, 256), ((64, 8), (128, 8), (64, 4)), (3, 4))
                else:  # (the stages of a many-row call are Speed.linear_many_stages)
                    grid = itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (None,), (3,))
                for bm, bn, kw_, st in grid:
                    label = f"{bm}x{bn}s{st}" + (f"k{kw_[0]}w{kw_[1]}" if kw_ else "")
                    shapes = dict(base.numerics.linear_shapes)
                    if kw_:
                        shapes[shape] = kw_
                    elif own is None:
                        shapes.pop(shape, None)
                    t = base.replace(linear_many_rows=16, linear_many_row_block=bm, linear_many_n=16, linear_tree_n_scale=1,
                                     linear_many_tiles={},  # the label is the tile (rows x columns a program)
                                     linear_tiles={**base.speed.linear_tiles, shape: (bn, st)}, linear_shapes=shapes)
                    with tuning.using(t):
                        try:
                            same[label] = bool(torch.equal(call(), ref))
                            tried[label] = graph_us(call)
                        except Exception as e:  # out of shared memory, say
                            print("  skip", name, rows, label, type(e).__name__, str(e)[:80])
            cell["same_bits"] = same
            ok = {k_: v for k_, v in tried.items() if v is not None}
            if ok:
                best = min(ok, key=ok.get)
                cell.update(best=best, best_us=ok[best], tried=ok)
            out.append(cell)
            print(f"linear {model:8s} {name:8s} rows {rows:5d}  cublas {cell['cublas_us']:7.2f}  ours {cell['default_us']:7.2f}"
                  + (f" (without the norm {cell['without_norm_us']:6.2f}, folded {cell['folded_norm_us']:6.2f})"
                     if "without_norm_us" in cell else "")
                  + (f"  best {cell['best']:>16s} {cell['best_us']:7.2f}" if ok else "")
                  + (f"  bits differ: {[k_ for k_, v in same.items() if not v]}" if same else ""), flush=True)
            if ok:
                print("      " + " ".join(f"{k_}:{v:.1f}" for k_, v in sorted(ok.items(), key=lambda kv: kv[1])[:8]))
    return out


def random_tree(b, t, gen):
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
    anc = torch.zeros(t, t, dtype=torch.bool)
    depth = torch.zeros(t, dtype=torch.long)
    for n in range(t):
        a = n
        while a >= 0:
            anc[n, a] = True
            a = parent[a]
        depth[n] = int(anc[n].sum()) - 1
    return anc.expand(b, t, t).contiguous(), depth.expand(b, t).contiguous()


def load_prev(path):
    """An earlier attention module from its source file, its kernels renamed (older.module_from_source)."""
    return module_from_source(Path(path).read_text(), "attention_prev",
                              (("_causal_kernel", "_causal_kernel_prev"), ("_split_kernel", "_split_kernel_prev")))


def bench_attention(model, quick, prev=None) -> list[dict]:
    h, nh, nkv, hd, *_ = MODELS[model]
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    out = []
    base = tuning.active()
    contexts = (300, 700) if quick else (300, 700, 1500)
    for b, L in itertools.product((1, 8, 32), contexts):  # a decode: one token a row
        s = L + 64
        k = torch.randn(b, nkv, s, hd, device=dev, dtype=dt)
        v = torch.randn(b, nkv, s, hd, device=dev, dtype=dt)
        q = torch.randn(b, 1, nh, hd, device=dev, dtype=dt).transpose(1, 2)
        positions = torch.full((b, 1), L, device=dev, dtype=torch.long)
        cell = {"model": model, "batch": b, "context": L, "tokens": 1, "decode": True,
                "default_us": graph_us(lambda: causal_attention(q, k, v, positions))}
        if prev is not None:
            cell["prev_us"] = graph_us(lambda: prev.causal_attention(q, k, v, positions))
            cell["prev_same_bits"] = bool(torch.equal(prev.causal_attention(q, k, v, positions),
                                                      causal_attention(q, k, v, positions)))
        out.append(cell)
        print(f"decode    {model:8s} b{b:<3d} L{L:<5d} causal {cell['default_us']:7.2f}"
              + (f"  prev {cell['prev_us']:7.2f} bits {'same' if cell['prev_same_bits'] else 'DIFFER'}"
                 if prev is not None else ""), flush=True)
    t = 16
    for b, L in itertools.product((1, 8, 32), contexts):
        s = L + t + 64
        k = torch.randn(b, nkv, s, hd, device=dev, dtype=dt)
        v = torch.randn(b, nkv, s, hd, device=dev, dtype=dt)
        q = torch.randn(b, t, nh, hd, device=dev, dtype=dt).transpose(1, 2)
        anc, depth = random_tree(b, t, gen)
        anc, depth = anc.to(dev), depth.to(dev)
        committed = torch.full((b,), L, device=dev, dtype=torch.long)
        positions = committed[:, None] + depth
        old_tree = (committed, anc, depth)
        tree = tree_plan(*old_tree)  # as the target's forward passes it: worked out once for all layers
        mask = causal_mask(positions, s, None, old_tree)
        cell = {"model": model, "batch": b, "context": L, "tokens": t,
                "mask_kernel_us": graph_us(lambda: tree_attention(q, k, v, mask))}
        tried, same = {}, {}
        with tuning.using(base.replace(attention_tree_tokens=1, attention_tree_many_batch=1 << 20)):
            ref = causal_attention(q, k, v, positions, tree=tree).clone()
        variants = [(f"tok{n}_split{sb}_st{st}", dict(attention_tree_tokens=1 if n == "all" else n, attention_split_below=sb,
                                                      attention_stages=st,
                                                      attention_tree_many_batch=1 if n == "all" else 1 << 20))
                    for n, sb, st in itertools.product((1, 2, 3, "all"), (0, 1 << 20), (1, 3))]
        for label, change in variants:
            with tuning.using(base.replace(**change)):
                same[label] = bool(torch.equal(causal_attention(q, k, v, positions, tree=tree), ref))
                tried[label] = graph_us(lambda: causal_attention(q, k, v, positions, tree=tree))
        cell["same_bits"] = same
        best = min(tried, key=tried.get)
        with tuning.using(base):
            cell["default_us"] = graph_us(lambda: causal_attention(q, k, v, positions, tree=tree))
            if prev is not None:
                cell["prev_us"] = graph_us(lambda: prev.causal_attention(q, k, v, positions, tree=old_tree))
                cell["prev_same_bits"] = bool(torch.equal(prev.causal_attention(q, k, v, positions, tree=old_tree), ref))
        cell.update(best=best, best_us=tried[best], tried=tried)
        out.append(cell)
        print(f"attention {model:8s} b{b:<3d} L{L:<5d} mask-kernel {cell['mask_kernel_us']:7.2f}  causal {cell['default_us']:7.2f}"
              + (f"  prev {cell['prev_us']:7.2f} bits {'same' if cell['prev_same_bits'] else 'DIFFER'}"
                 if prev is not None else "")
              + f"  best {best} {tried[best]:7.2f}   " + " ".join(f"{k_}:{v_:.1f}" for k_, v_ in tried.items())
              + (f"  bits differ: {[k_ for k_, v_ in same.items() if not v_]}" if not all(same.values()) else "  bits same"),
              flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 41, 128, 256, 512, 1312])
    ap.add_argument("--sweep-rows", type=int, nargs="*", default=[128, 512], help="row counts whose tiles are swept")
    ap.add_argument("--only", choices=["linear", "attention"], default=None)
    ap.add_argument("--prev", default=None, help="an earlier attention.py, timed beside the current one")
    args = ap.parse_args()
    report = {"card": torch.cuda.get_device_name()}
    if args.only != "linear":
        report["attention"] = bench_attention(args.model, args.quick, load_prev(args.prev) if args.prev else None)
    if args.only != "attention":
        report["linear"] = bench_linear(args.model, args.rows, set(args.sweep_rows))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kernel_bench.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
