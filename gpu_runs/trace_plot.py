"""Each step of a traced policy_steps.py run (`--trace`), over the run's time: the rows in the batch
and the tree the step verified (a marker a step, coloured by tier), with the tokens each step
produced; one panel a method. Shows where a stream drains and which tiers a policy picks there.

    python3 gpu_runs/trace_plot.py POLICY_STEPS.json[.gz] --out FILE.png [--methods assist-adaptive ...]
"""
from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specheads.files import read_text  # noqa: E402


def traced(path: str, methods: list[str] | None) -> list[dict]:
    """The cells with a step trace, in file order (those of `methods` where given)."""
    cells = [c for c in json.loads(read_text(path))["cells"] if c.get("steps")]
    if methods:
        cells = [c for c in cells if c["method"] in methods]
    if not cells:
        raise SystemExit(f"trace_plot: {path} has no traced cell{' of ' + ', '.join(methods) if methods else ''} "
                         "(run policy_steps.py with --trace)")
    return cells


def tier_name(cell: dict, step: dict) -> str:
    """What a step verified: the cell's tier name (the adaptive engine's list), or its one tree."""
    if step.get("gated"):
        return "gated chain"
    names = cell.get("tier_names")
    if names and step["tier"] < len(names):
        return names[step["tier"]]
    return "plain" if step["tier"] == 0 else next(iter(cell.get("tiers", {"tree": 0})))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", nargs="*", default=None)
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    cells = traced(args.trace, args.methods)
    fig, axes = plt.subplots(len(cells), 1, figsize=(11, 2.8 * len(cells)), sharex=True, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    palette: dict[str, str] = {}
    for ax, cell in zip(axes[:, 0], cells):
        steps = cell["steps"]
        t = [s["t_ms"] for s in steps]
        by_tier: dict[str, list] = {}
        for s in steps:
            by_tier.setdefault(tier_name(cell, s), []).append(s)
        for name, group in sorted(by_tier.items()):
            colour = palette.setdefault(name, colours[len(palette) % len(colours)])
            ax.scatter([s["t_ms"] for s in group], [s["rows"] for s in group], s=9, color=colour,
                       label=f"{name} ({len(group)} steps)", zorder=3)
        tokens = ax.twinx()
        tokens.plot(t, [s["tokens"] for s in steps], color="0.5", lw=0.6, ls="--")
        tokens.set_ylabel("tokens a step (dashed)", fontsize=8)
        ax.set_ylabel("rows (markers: the tree verified)", fontsize=8)
        ax.set_title(f"{cell['method']} b{cell['batch']}: {cell['tokens_per_s']:,.0f} tok/s, "
                     f"{len(steps)} steps", fontsize=9)
        ax.legend(fontsize=7, loc="lower left")
    axes[-1, 0].set_xlabel("ms into the run")
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
