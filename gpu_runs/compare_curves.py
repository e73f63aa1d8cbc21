"""Compare training-loss curves of runs (metrics.jsonl): prints a table, writes JSON and a PNG."""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specheads.training.report import read_metrics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--labels", nargs="+")
    ap.add_argument("--out", required=True, help="path prefix for .json and .png")
    args = ap.parse_args()
    labels = args.labels or args.metrics
    curves = {}
    for path, label in zip(args.metrics, labels):
        rows = [r for r in read_metrics(path) if "loss" in r]
        curves[label] = {r["step"]: r["loss"] for r in rows}
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    print(f"{'step':>6} " + " ".join(f"{l[:28]:>28}" for l in labels))
    for s in steps:
        print(f"{s:>6} " + " ".join(f"{curves[l][s]:>28.4f}" for l in labels))
    base = curves[labels[0]]
    diffs = {l: max(abs(curves[l][s] - base[s]) / abs(base[s]) for s in steps) for l in labels[1:]}
    print("max relative loss difference vs first:", {k: round(v, 4) for k, v in diffs.items()})
    with open(args.out + ".json", "w") as f:
        json.dump({"steps": steps, "loss": {l: [curves[l][s] for s in steps] for l in labels},
                   "max_rel_diff_vs_first": diffs}, f, indent=1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for l in labels:
        ax.plot(steps, [curves[l][s] for s in steps], label=l, alpha=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("weighted TTT loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


if __name__ == "__main__":
    main()
