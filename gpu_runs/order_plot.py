"""Tokens/s of each timed run against its place in one process: what the order of a bench's methods
does to them (docs/history/2026-12-06d-h100-lease.md). Reads scripts/bench.py JSON files (each row's
runs in the order run, sequential: a row's runs follow the row before it) and policy_steps.py JSON
files (each cell a run), and draws one line per file, a marker per method.

    python3 gpu_runs/order_plot.py FILE.json [FILE.json ...] --out order.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def runs_in_order(path: Path) -> list[tuple[str, float]]:
    """(method, tokens/s) of every timed run of the file, in the order they ran (a sequential bench)."""
    data = json.loads(path.read_text())
    if "rows" in data:  # scripts/bench.py
        out = []
        for row in data["rows"]:
            out += [(row["method"], x) for x in row.get("tokens_per_s_runs", [row["tokens_per_s"]])]
        return out
    if "cells" in data:  # gpu_runs/policy_steps.py
        return [(c["method"], c["tokens_per_s"]) for c in data["cells"]]
    raise SystemExit(f"{path}: neither a bench.py report (rows) nor a policy_steps.py one (cells)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    markers = {}
    for k, path in enumerate(args.files):
        runs = runs_in_order(path)
        first = runs[0][1]
        color = f"C{k}"
        ax.plot(range(1, len(runs) + 1), [x / first for _, x in runs], color=color, alpha=0.6,
                label=f"{path.parent.name}/{path.name}" if path.name == "policy_steps.json" else path.name)
        for i, (method, x) in enumerate(runs, 1):
            ax.scatter(i, x / first, marker=markers.setdefault(method, "osD^v<>"[len(markers) % 7]), color=color)
        print(f"{path}: " + ", ".join(f"{m} {x:.0f}" for m, x in runs))
    for method, m in markers.items():  # (the markers' key, in black)
        ax.scatter([], [], marker=m, color="black", label=method)
    ax.set_xlabel("timed run, in the order run in one process")
    ax.set_ylabel("tokens/s over the file's first run")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
