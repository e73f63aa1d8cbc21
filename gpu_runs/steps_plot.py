"""A bar chart of policy_steps.py runs, old against new code (gpu_runs/steps_old_new.sh): tokens/s
per method, each run a dot over the median's bar, and the prefills' share of the run below.

    python3 gpu_runs/steps_plot.py OLD/policy_steps.json NEW/policy_steps.json --out FILE.png [--title T]
(either file may be gzip-compressed: a name ending in .gz)
"""
from __future__ import annotations

import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specheads.files import read_text  # noqa: E402


def cells(path: str) -> dict:
    """method -> [(tokens/s, prefill share of the run)] over its runs (every batch size pooled)."""
    out: dict = {}
    for c in json.loads(read_text(path))["cells"]:
        out.setdefault(f"{c['method']} b{c['batch']}", []).append(
            (c["tokens_per_s"], c["host_ms"].get("prefill", 0.0) / c["wall_ms"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    old, new = cells(args.old), cells(args.new)
    names = [n for n in new if n in old]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(1.6 * len(names) + 3, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.4]})
    for k, (label, runs, color) in enumerate((("old", old, "#999999"), ("new", new, "#1f77b4"))):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        top.bar(xs, [statistics.median(r[0] for r in runs[n]) for n in names], 0.36, color=color, label=label)
        bottom.bar(xs, [100 * statistics.median(r[1] for r in runs[n]) for n in names], 0.36, color=color)
        for x, n in zip(xs, names):
            top.scatter([x] * len(runs[n]), [r[0] for r in runs[n]], s=10, color="black", zorder=3)
    top.set_ylabel("tokens / s")
    top.legend()
    top.set_title(args.title)
    bottom.set_ylabel("prefill, % of run")
    bottom.set_xticks(range(len(names)), names, rotation=15)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
