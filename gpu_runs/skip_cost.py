"""What a kernel that returns at once still costs inside a captured CUDA graph: the floor under the
saving of a draft stopped early on the device (issue 25's batch-1 lever, `gpu_runs/README.md`, "A lever
for batch 1": each kernel of a depth not drafted would read a device flag and return).

Captures a graph of N back-to-back launches of a Triton kernel that reads a flag and returns where it is
set (else writes one value), with programmatic dependent launch as the draft's kernels take it (wait for
the kernel before, then let the next one launch) and without, replays each graph R times after warm-up
(`timing.graph_us`), and reports the time a skipped launch adds (the slope over N, so the graph's own
launch drops out). With
--depth-ms (what a drafted depth costs, e.g. from `draft_step_times.py --trees 6,4,15 3,4,15`: the two
steps' difference over 3) and --kernels-per-depth K, it also prints what a skipped depth would save:
depth-ms - K x the skipped launch, the --depth-ms figure `draft_stop.py` replays with.

    python3 gpu_runs/skip_cost.py --out $OUT/skip_cost [--launches 9 27 54] [--replays 2000]
        [--depth-ms 0.033 --kernels-per-depth 9]

CPU (tests): `skip_reference` and, under TRITON_INTERPRET=1, the kernel itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py beside it

from specheads.kernels.fused import gdc_launch_dependents, gdc_wait, triton  # noqa: E402

if triton is not None:
    import triton.language as tl

    from specheads.kernels.fused import _kernel  # noqa: E402  (jitted per interpreter mode)

    def _skip_kernel(flag_ptr, out_ptr, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        if tl.load(flag_ptr) != 0:
            return
        tl.store(out_ptr, tl.load(out_ptr) + 1)


def skip_reference(flag: torch.Tensor, out: torch.Tensor) -> None:
    """The kernel's effect: out += 1 unless the flag is set."""
    if int(flag.item()) == 0:
        out += 1


def skip(flag: torch.Tensor, out: torch.Tensor, pdl: bool = False) -> None:
    """One launch of the kernel (Triton on GPU or under TRITON_INTERPRET=1, else the reference)."""
    if triton is None or not (flag.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return skip_reference(flag, out)
    opts = {"launch_pdl": True} if pdl and gdc_wait is not None else {}
    _kernel(_skip_kernel)[(1,)](flag, out, PDL=bool(opts), num_warps=1, **opts)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def graph_us(n: int, pdl: bool, replays: int, flag: torch.Tensor, out: torch.Tensor) -> float:
    """Microseconds a replay of a graph of n skipped launches takes (timing.graph_us, median of 5)."""
    from timing import graph_us as per_call

    return sorted(per_call(lambda: skip(flag, out, pdl), calls=n, replays=replays) * n for _ in range(5))[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="path prefix for the .json")
    ap.add_argument("--launches", type=int, nargs="+", default=[9, 27, 54])
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--depth-ms", type=float, default=None, help="what a drafted depth costs (ms)")
    ap.add_argument("--kernels-per-depth", type=int, default=9,
                    help="launches of one draft depth (EAGLE-3: qkv, rope, attention, o_proj, gate_up, down, "
                         "lm_head, top-k expansion, and a copy)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the CPU tests cover the kernel under TRITON_INTERPRET=1)")
    if len(set(args.launches)) < 2 or min(args.launches) < 1:
        ap.error(f"--launches needs two different counts of 1 or more, got {args.launches}")
    flag = torch.ones(1, dtype=torch.int32, device="cuda")  # set: every launch returns at once
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "replays": args.replays,
              "rows": [], "per_launch_us": {}}
    for pdl in (False, True):
        if pdl and gdc_wait is None:
            continue
        ys = [graph_us(n, pdl, args.replays, flag, out) for n in args.launches]
        report["rows"] += [{"pdl": pdl, "launches": n, "graph_us": y} for n, y in zip(args.launches, ys)]
        per = slope(args.launches, ys)
        report["per_launch_us"]["pdl" if pdl else "plain"] = per
        print(f"{'PDL' if pdl else 'plain'}: " + ", ".join(f"{n} launches {y:.2f} us" for n, y in
                                                             zip(args.launches, ys)) + f"; {per:.3f} us a launch")
    if int(out.item()) != 0:
        raise SystemExit("skip_cost: a launch wrote past its set flag")
    if args.depth_ms is not None:
        per = report["per_launch_us"].get("pdl", report["per_launch_us"]["plain"])
        saved = args.depth_ms - args.kernels_per_depth * per / 1000.0
        report["depth"] = {"depth_ms": args.depth_ms, "kernels": args.kernels_per_depth, "saved_ms": saved}
        print(f"a skipped depth of {args.kernels_per_depth} launches would save {saved:.4f} ms of {args.depth_ms} "
              f"(draft_stop.py --depth-ms {saved:.4f})")
    path = Path(args.out).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
