"""On the GPU: can the fused projection kernel beat cuBLAS on a Llama-3.1-8B layer at decode?

    python3 gpu_runs/wide_gemm.py [--rows 1] [--quick] [--out DIR]

On cuBLAS an 8B layer at one row costs five small kernels besides the four GEMVs (two RMSNorms
with the residual add, rotary, attention, silu). Our kernel carries the norm, silu and residual
in the GEMM, so it wins wherever it streams the weight about as fast as cuBLAS does; the tiles
that did on an H200 ship as the kernel tuning's defaults (specheads/kernels/tuning.py, WIDE_TILES).

1. For each 8B projection (qkv with its norm, o_proj onto the residual, gate_up with norm and
   silu, down onto the residual, the lm_head): the time of the composed reference (cuBLAS + its separate
   kernels) and of our kernel over a grid of tiles, each call in a CUDA graph, the weight
   rotated over copies larger than L2 together, so every call streams from HBM.
2. `scripts/bench.py`'s verify_cost (one forward over k tokens of a random-weight 8B model) in
   two fresh processes: as shipped (tuning.WIDE_TILES), and with this card's best tiles where
   they beat cuBLAS (null elsewhere), each with the copy-bandwidth floor measured in the same
   process.
Prints a table and the tuned settings as kernel tuning JSON (for --kernel-tuning, or
KernelTuning.from_dict), and writes wide_gemm.json under --out."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from linear_check import SHAPES as ALL_SHAPES, args_for, first_rows, graph_time  # noqa: E402

from specheads.kernels import linear as lin  # noqa: E402
from specheads.kernels import tuning  # noqa: E402

# an 8B layer's projections and its lm_head (on our kernel at decode already: which tile)
SHAPES = [s for s in ALL_SHAPES if s[0].startswith("8b")]
L2_BYTES = 50 * 2**20


def rotated(n, k, copies, dev, dt, g):
    return [torch.randn(n, k, device=dev, dtype=dt, generator=g) / k**0.5 for _ in range(copies)]


def time_op(fn_for_weight, weights, reps=30):
    calls = iter(itertools.cycle(weights))
    return graph_time(lambda: fn_for_weight(next(calls)), reps=reps)


def sweep(rows: int, quick: bool) -> dict:
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    bns, bks = ([16, 32], [128, 256]) if quick else ([16, 32, 64], [128, 256, 512])
    warps, stages = ([4], [3]) if quick else ([4, 8], [3, 4])
    default_config = lin._config
    # every shape on our kernel, the rule's tiles unless swept
    every_shape = tuning.KernelTuning().replace(linear_max_k=16384, linear_shapes={}, linear_tiles={})
    out = {}
    with tuning.using(every_shape):
        for name, n, k, op in SHAPES:
            x, _, kw = args_for(op, n, k, rows, dev, dt, g)
            kw = first_rows(kw, rows)
            copies = max(1, -(-3 * L2_BYTES // (n * k * 2)))
            weights = rotated(n, k, copies, dev, dt, g)
            t_ref = time_op(lambda w: lin.linear_reference(x, w, **kw), weights)
            t_default = time_op(lambda w: lin.linear(x, w, **kw), weights)
            cands = []
            for bn, bk, nw, ns in itertools.product(bns, bks, warps, stages):
                cfg = (bn, bk, nw, ns)
                lin._config = lambda n_, k_, cfg=cfg: cfg
                try:
                    cands.append((time_op(lambda w: lin.linear(x, w, **kw), weights), cfg))
                except Exception as e:  # out of shared memory etc.
                    print(f"  {name} {cfg}: {type(e).__name__}", flush=True)
                finally:
                    lin._config = default_config
            best_us, best_cfg = min(cands)
            gb_s = n * k * 2 / (best_us * 1e-6) / 1e9
            out[name] = {"n": n, "k": k, "op": op, "rows": rows, "weight_copies": copies, "ref_us": t_ref,
                         "ours_default_us": t_default, "best_us": best_us, "best_config": list(best_cfg),
                         "best_gb_s": gb_s, "all": [[t, list(c)] for t, c in sorted(cands)]}
            print(f"{name:12} rows {rows}: cuBLAS+kernels {t_ref:7.2f} us, ours default {t_default:7.2f} us, "
                  f"best {best_us:7.2f} us {best_cfg} ({gb_s:.0f} GB/s)", flush=True)
            del weights
            torch.cuda.empty_cache()
    return out


def tuned(configs: dict) -> dict:
    """Kernel tuning JSON from each shape's best (BLOCK_N, BLOCK_K, warps, stages), or None
    (cuBLAS): K steps and warps in numerics, column blocks and stages in speed."""
    return {"numerics": {"linear_max_k": 16384,
                         "linear_shapes": {s: c and [c[1], c[2]] for s, c in configs.items()}},
            "speed": {"linear_tiles": {s: [c[0], c[3]] for s, c in configs.items() if c}}}


def verify_cost_in_process(kernel_tuning: str | None, out_file: Path) -> dict:
    code = ("import json, sys, torch; sys.path.insert(0, 'scripts'); from bench import verify_cost; "
            "from specheads.kernels import tuning; "
            + (f"tuning.use(tuning.KernelTuning.parse({kernel_tuning!r})); " if kernel_tuning else "")
            + f"json.dump(verify_cost('cuda', torch.bfloat16, ks=(1, 8, 64)), open({str(out_file)!r}, 'w'))")
    subprocess.run([sys.executable, "-c", code], check=True)
    return json.loads(out_file.read_text())


def print_verify_cost(label: str, vc: dict) -> None:
    ks = ", ".join(f"k={r['k']} {r['ms']:.2f} ms" for r in vc["rows"])
    print(f"8B forward, {label:10}: {ks}; floor {vc['floor_ms']:.2f} ms at {vc['copy_bandwidth_tb_s']:.2f} TB/s "
          f"-> k=1 at {vc['k1_share_of_floor']:.1%} of the floor", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a small tile grid")
    ap.add_argument("--verify-only", action="store_true",
                    help="no sweep: time the 8B forward once with the tiles as set (shipped, or --kernel-tuning's)")
    ap.add_argument("--kernel-tuning", default=None, metavar="JSON_OR_FILE",
                    help="with --verify-only: kernel tuning over the defaults (as this script prints)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.verify_only:
        vc = verify_cost_in_process(a.kernel_tuning, out / "verify_cost.json")
        print_verify_cost("as set" + (f" ({a.kernel_tuning})" if a.kernel_tuning else " (shipped)"), vc)
        return
    report = {"card": torch.cuda.get_device_name(), "shapes": sweep(a.rows, a.quick)}
    # each shape's best tile where it beats cuBLAS, else null (cuBLAS): the form of tuning.WIDE_TILES
    configs = {f"{s['n']}x{s['k']}": s["best_config"] if s["best_us"] < s["ref_us"] else None
               for s in report["shapes"].values()}
    tuned_json = json.dumps(tuned(configs))
    tuning.KernelTuning.parse(tuned_json)  # valid before anything runs with it
    runs = {"shipped": None, "ours_tuned": tuned_json}
    report["verify_cost"] = {}
    for label, text in runs.items():
        vc = verify_cost_in_process(text, out / f"verify_cost_{label}.json")
        report["verify_cost"][label] = {"kernel_tuning": json.loads(text) if text else None, **vc}
        print_verify_cost(label, vc)
    (out / "wide_gemm.json").write_text(json.dumps(report, indent=1))
    print(f"--kernel-tuning '{tuned_json}'")


if __name__ == "__main__":
    main()
