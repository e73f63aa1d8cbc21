"""Compare bench.py runs of two or more code versions: median tokens/s per cell over repeats.

    python gpu_runs/compare_runs.py old=run_old_*.json new=run_new_*.json --out bench/old_new

Each argument is LABEL=FILE[,FILE...] (repeats of one version); the first label is the
baseline. Prints a table (median tok/s of each label and its ratio to the baseline, with the
repeats' spread), writes <out>.json and, where matplotlib is installed, <out>.png (each
version's ratio to the baseline by cell, --goal drawing a dashed line, e.g. 0.95).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=FILE[,FILE...]")
    ap.add_argument("--out", default=None)
    ap.add_argument("--goal", type=float, nargs="*", default=[], help="ratios drawn as dashed lines on the plot")
    args = ap.parse_args()
    versions: dict[str, dict] = {}
    card = None
    for spec in args.runs:
        label, files = spec.split("=", 1)
        cells: dict = {}
        for f in files.split(","):
            report = json.loads(Path(f).read_text())
            card = card or report.get("card")
            for r in report["rows"]:
                cells.setdefault((r["prompts"], r["batch"], r["method"]), []).append(r["tokens_per_s"])
        versions[label] = cells
    labels = list(versions)
    base = versions[labels[0]]
    rows = []
    print(f"card {card}; median tokens/s over repeats (min-max), ratio to {labels[0]}")
    print(f"{'prompts':>10} {'batch':>5} {'method':>14} " + " ".join(f"{lab:>24}" for lab in labels))
    for key in sorted(base):
        row = {"prompts": key[0], "batch": key[1], "method": key[2]}
        cols = []
        for lab in labels:
            vals = versions[lab].get(key)
            if not vals:
                cols.append(f"{'-':>24}")
                continue
            med = statistics.median(vals)
            ratio = med / statistics.median(base[key])
            row[lab] = {"median": med, "runs": vals, "ratio": ratio}
            cols.append(f"{med:>8.0f} ({min(vals):.0f}-{max(vals):.0f}) {ratio:>5.3f}")
        rows.append(row)
        print(f"{key[0]:>10} {key[1]:>5} {key[2]:>14} " + " ".join(cols))
    if args.out:
        out = Path(args.out).with_suffix(".json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"card": card, "baseline": labels[0], "rows": rows}, indent=1))
        plot(rows, labels, card, args.goal, out.with_suffix(".png"))


def plot(rows: list[dict], labels: list[str], card, goals, png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the device machine has no matplotlib: the JSON is the record
        return
    names = [f"{r['prompts']} b{r['batch']} {r['method']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(rows)), 4.5))
    width = 0.8 / max(1, len(labels) - 1)
    for i, lab in enumerate(labels[1:]):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r.get(lab, {}).get("ratio", 0.0) for r in rows], width, label=lab)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for g in goals:
        ax.axhline(g, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], names, fontsize=7, rotation=35, ha="right")
    ax.set_ylabel(f"tokens/s / {labels[0]}")
    ax.set_ylim(min(0.8, min((r.get(lab, {}).get("ratio", 1.0) for r in rows for lab in labels[1:]), default=1.0) - 0.02),
                max(1.1, max((r.get(lab, {}).get("ratio", 1.0) for r in rows for lab in labels[1:]), default=1.0) + 0.02))
    ax.set_title(f"{card}: median tokens/s against {labels[0]}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
