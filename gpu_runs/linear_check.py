"""On the GPU: the fused projection kernel (specheads/kernels/linear.py) at the engine's shapes.

    python3 gpu_runs/linear_check.py [--sweep] [--out DIR]

For each weight shape of SmolLM2-135M (target layer, draft head, lm_heads), of a
Llama-3.1-8B layer and of Qwen2.5-0.5B / -1.5B (`--only q`): the error against the composed torch reference (bf16); whether a row's
bits are the same alone and among 8 / 16 / 33 / 64 rows (the property that keeps bf16
speculation identical to plain decoding); and the time of one call replayed in a CUDA graph,
ours against the composed reference (cuBLAS + the separate norm / silu kernels + add).
`--sweep` also times other tile configs at 1 and 33 rows and prints the best per shape.
Writes linear_check.json under --out."""
import argparse
import itertools
import json
import os
from pathlib import Path

import torch

from specheads.kernels import linear as lin
from timing import graph_us

SHAPES = [  # name, N, K, op
    ("135m qkv", 960, 576, "norm"),
    ("135m o_proj", 576, 576, "res"),
    ("135m gate_up", 3072, 576, "norm_silu"),
    ("135m down", 576, 1536, "res"),
    ("135m lm_head", 49152, 576, "plain"),
    ("head qkv", 960, 1152, "plain"),
    ("head lm_head", 32000, 576, "norm"),
    ("8b qkv", 6144, 4096, "norm"),
    ("8b o_proj", 4096, 4096, "res"),
    ("8b gate_up", 28672, 4096, "norm_silu"),
    ("8b down", 4096, 14336, "res"),
    ("8b lm_head", 128256, 4096, "plain"),
    # Qwen2.5(-Coder)-0.5B and -1.5B, the second target and the standalone-draft pair (their q/k/v
    # biases left out: the bias add does not change what a tile costs). The 1.5B's plain step ran
    # at 2.5 ms on an H100 against about 1 ms of weight reads (gpu_runs/pair_timing.py): --only q
    ("q0.5b qkv", 1152, 896, "norm"),
    ("q0.5b o_proj", 896, 896, "res"),
    ("q0.5b gate_up", 9728, 896, "norm_silu"),
    ("q0.5b down", 896, 4864, "res"),
    ("q0.5b lm_head", 151936, 896, "plain"),
    ("q1.5b qkv", 2048, 1536, "norm"),
    ("q1.5b o_proj", 1536, 1536, "res"),
    ("q1.5b gate_up", 17920, 1536, "norm_silu"),
    ("q1.5b down", 1536, 8960, "res"),
    ("q1.5b lm_head", 151936, 1536, "plain"),
]


def args_for(op, n, k, rows, dev, dt, g):
    x = torch.randn(rows, k, device=dev, dtype=dt, generator=g)
    w = (torch.randn(n, k, device=dev, dtype=dt, generator=g) / k**0.5)
    kw = {}
    if "norm" in op:
        kw.update(norm_weight=torch.rand(k, device=dev, dtype=dt, generator=g) + 0.5, eps=1e-5)
    if "silu" in op:
        kw["silu"] = True
    if op == "res":
        kw["residual"] = torch.randn(rows, n, device=dev, dtype=dt, generator=g)
    return x, w, kw


def first_rows(kw, rows):
    """The call's keyword arguments for the first `rows` rows (the residual is per row)."""
    return {**kw, "residual": kw["residual"][:rows]} if "residual" in kw else kw


def graph_time(fn, reps=50):
    return graph_us(fn, calls=reps, replays=5)  # us per call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="", help="shapes whose name starts with this (e.g. 135m)")
    ap.add_argument("--bn", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--bk", type=int, nargs="+", default=[64, 128], help="may exceed K (masked)")
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    report = {"card": torch.cuda.get_device_name(), "rows": []}
    default_config = lin._config
    print(f"{'shape':14} {'rows':>4} {'err':>8} {'same bits':>9} {'ours us':>8} {'ref us':>8}  config")
    for name, n, k, op in [s for s in SHAPES if s[0].startswith(a.only)]:
        x, w, kw = args_for(op, n, k, 264, dev, dt, g)
        alone = lin.linear(x[:1], w, **first_rows(kw, 1))
        same = {}
        for rows in (8, 16, 33, 64):
            same[rows] = bool(torch.equal(lin.linear(x[:rows], w, **first_rows(kw, rows))[:1], alone))
        for rows in (1, 8, 33) if "8b" in name else (1, 8, 33, 64):
            sub = first_rows(kw, rows)
            xr = x[:rows]
            out = lin.linear(xr, w, **sub).float()
            ref = lin.linear_reference(xr, w, **sub).float()
            err = ((out - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
            t_ours = graph_time(lambda: lin.linear(xr, w, **sub))
            t_ref = graph_time(lambda: lin.linear_reference(xr, w, **sub))
            best = None
            if a.sweep and rows in (1, 33):
                cands = []
                for bn, bk, warps, stages in itertools.product(a.bn, a.bk, a.warps, a.stages):
                    if (bk < k and k % bk) or bk > 2 * k or (n // (2 if "silu" in op else 1)) < bn:
                        continue
                    cfg = (bn, bk, warps, stages)
                    lin._config = lambda n_, k_, cfg=cfg: cfg
                    try:
                        cands.append((graph_time(lambda: lin.linear(xr, w, **sub), reps=20), cfg))
                    except Exception:  # out of shared memory etc.
                        pass
                    finally:
                        lin._config = default_config
                best = min(cands)
            row = {"shape": name, "n": n, "k": k, "op": op, "rows": rows, "rel_err": err, "same_bits": same,
                   "ours_us": t_ours, "ref_us": t_ref, "config": default_config(n, k), "best": best}
            report["rows"].append(row)
            print(f"{name:14} {rows:>4} {err:8.1e} {str(all(same.values())):>9} {t_ours:8.2f} {t_ref:8.2f}  "
                  f"{default_config(n, k)} {'best %.2f us %s' % best if best else ''}", flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "linear_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
