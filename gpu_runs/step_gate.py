"""Old against new draft step times (draft_step_times.py JSONs from two checkouts, same card): print
each row's step relative to `ar` for both, and with --flag PATH write PATH when a kind's step at a
tree shape (batch 1) costs at least --min-gain less relative to `ar` in the new code (and remove it
where not), so a later call on the same warm machine can run only when the change paid.

    python3 gpu_runs/step_gate.py --old $OUT/steps_old_*.json --new $OUT/steps_new_*.json \
        --kind medusa --tree 2,8,12 --flag /tmp/medusa_cheaper
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def x_ar(paths: list[str]) -> dict[tuple, float]:
    """(batch, kind, tree) -> median over the runs of the step's ms divided by the same run's ar step."""
    seen: dict[tuple, list[float]] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["rows"]:
            if "x_ar_step" in r:
                seen.setdefault((r["batch"], r["kind"], r["tree"]), []).append(r["x_ar_step"])
    return {k: statistics.median(v) for k, v in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", nargs="+", required=True)
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--kind", default="medusa")
    ap.add_argument("--tree", default="2,8,12")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--min-gain", type=float, default=0.02)
    ap.add_argument("--flag")
    args = ap.parse_args()
    old, new = x_ar(args.old), x_ar(args.new)
    for key in sorted(set(old) | set(new), key=str):
        o, n = old.get(key), new.get(key)
        ratio = f"{n / o:.3f}" if o and n else "-"
        print(f"b{key[0]} {key[1]:>22} {key[2]:>8}: old {o or 0:.3f} new {n or 0:.3f} x ar  new/old {ratio}")
    o, n = old.get((args.batch, args.kind, args.tree)), new.get((args.batch, args.kind, args.tree))
    paid = bool(o and n and n <= o * (1 - args.min_gain))
    print(f"gate: {args.kind} {args.tree} b{args.batch} new/old {n / o if o and n else float('nan'):.3f} -> {'PAID' if paid else 'not paid'}")
    if args.flag:  # (a flag an earlier gate left on the machine goes where this one did not pay)
        Path(args.flag).write_text("paid\n") if paid else Path(args.flag).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
