"""The adaptive policy's predictions set against what its steps gave, from a `policy_steps.py
--trace` run: per tier chosen, the tokens the policy expected a step to emit (its rate times the
tier's cost, summed over the rows) against the tokens the step emitted, and the cost it priced the
step at against the time between that step's result and the one before (the median, same tier
only). A tier whose tokens are overestimated, or whose steps take longer than priced, is chosen
more often than it earns.

    python3 gpu_runs/choice_audit.py POLICY_STEPS.json[.gz] [--method adaptive] [--out AUDIT.json]

Prints one table a traced cell (method, batch), then its steps by tier and batch bucket, and writes them
all as JSON."""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from specheads.files import read_text


def audit(cell: dict) -> list[dict]:
    """Rows of the table for one traced cell: one per tier chosen (0: plain)."""
    steps = {s["i"]: s for s in cell.get("steps", []) if "i" in s}
    by_tier = defaultdict(lambda: {"steps": 0, "expected": [], "emitted": [], "priced": [], "gaps": []})
    # a plan made behind a step in flight and dropped (a host drafter's) is chosen again at launch:
    # the last choice of a launch is the one it ran
    last = {c["i"]: c for c in cell.get("choices", []) if "i" in c}
    for c in last.values():
        s = steps.get(c["i"])
        if s is None or "costs" not in c or s["tier"] != c["tier"]:
            continue  # (a dropped plan whose launch the policy was not asked about: nothing drafted)
        t = c["tier"]
        row = by_tier[t]
        row["steps"] += 1
        row["expected"].append(c["rates"][t] * c["costs"][t])
        row["emitted"].append(s["tokens"])
        row["priced"].append(c["costs"][t])
        before = steps.get(s["i"] - 1)
        if before is not None and before["tier"] == t:
            row["gaps"].append(s["t_ms"] - before["t_ms"])
    out = []
    for t, row in sorted(by_tier.items()):
        expected, emitted = statistics.fmean(row["expected"]), statistics.fmean(row["emitted"])
        out.append({"tier": t, "steps": row["steps"], "expected_tokens": round(expected, 3),
                    "emitted_tokens": round(emitted, 3), "emitted_over_expected": round(emitted / expected, 3),
                    "priced_ms": round(statistics.median(row["priced"]), 4),
                    "gap_ms": round(statistics.median(row["gaps"]), 4) if row["gaps"] else None})
    return out


def by_bucket(cell: dict) -> dict:
    """Steps by tier (0: plain) and batch bucket, every step of the traced run: where a stream's
    steps went (its tail, where the batch shrinks, is where a dearer tier pays)."""
    counts = defaultdict(lambda: defaultdict(int))
    for s in cell.get("steps", []):
        counts[s["tier"]][s["b"]] += 1
    return {t: dict(sorted(b.items())) for t, b in sorted(counts.items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--method", default=None, help="only this method's cells (default: every traced cell)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    data = json.loads(read_text(args.trace))  # (gzip-compressed where the name ends in .gz)
    report = []
    for cell in data["cells"]:
        if not cell.get("choices") or (args.method and cell["method"] != args.method):
            continue
        names = cell.get("tier_names")
        rows = audit(cell)
        for r in rows:
            r["tree"] = names[r["tier"]] if names else str(r["tier"])
        buckets = by_bucket(cell)
        report.append({"method": cell["method"], "batch": cell["batch"], "run": cell["run"], "tiers": rows,
                       "steps_by_bucket": {(names[t] if names else str(t)): b for t, b in buckets.items()}})
        print(f"{cell['method']} batch {cell['batch']} (run {cell['run']})")
        print(f"{'tier':>8} {'steps':>6} {'expected':>9} {'emitted':>8} {'ratio':>6} {'priced ms':>10} {'gap ms':>7}")
        for r in rows:
            gap = f"{r['gap_ms']:.3f}" if r["gap_ms"] is not None else "-"
            print(f"{r['tree']:>8} {r['steps']:>6} {r['expected_tokens']:>9.2f} {r['emitted_tokens']:>8.2f} "
                  f"{r['emitted_over_expected']:>6.2f} {r['priced_ms']:>10.3f} {gap:>7}")
        print("steps by batch bucket: " + "; ".join(
            f"{names[t] if names else t}: " + ", ".join(f"b{b} {n}" for b, n in per.items()) for t, per in buckets.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
