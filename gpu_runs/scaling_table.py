"""The table of gpu_runs/scaling.sh from its runs' files: weak scaling (tokens/s per GPU and
efficiency against one card, steps after the first SKIP_PCT% only: the first ones compile and
allocate) and equivalence at a fixed global batch (each step's loss against one card's).

    python3 gpu_runs/scaling_table.py ROOT [--skip-pct 20] --out DIR/scaling

ROOT holds weakN/ and eqN/ run folders (metrics.jsonl, train_summary.json) and regenN/ prepare
outputs (regenerated.jsonl.gz, timing.json). Prints the table,
writes <out>.json and, where matplotlib is installed, <out>.png.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss" in r and "tokens_per_s" in r]


def rate(rows: list[dict], skip_pct: float) -> float | None:
    """Tokens/s over all processes between the first step past skip_pct% and the last (each
    record's tokens_per_s is cumulative since the run's start)."""
    if len(rows) < 3:
        return None
    first = rows[min(len(rows) - 2, int(len(rows) * skip_pct / 100))]
    last = rows[-1]
    tokens = last["tokens_per_s"] * last["elapsed_s"] - first["tokens_per_s"] * first["elapsed_s"]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    return tokens / seconds if seconds > 0 else None


def table(root: Path, skip_pct: float) -> dict:
    cards = sorted({int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"(?:weak|eq)(\d+)", p.name))})
    out = {"weak": [], "equivalence": []}
    base = None
    for n in cards:
        run = root / f"weak{n}"
        r = rate(records(run), skip_pct)
        summary = run / "train_summary.json"
        peak = json.loads(summary.read_text()).get("peak_gpu_mem_gib") if summary.is_file() else None
        per_gpu = r / n if r else None
        if n == 1:
            base = per_gpu
        out["weak"].append({"cards": n, "tokens_per_s": r, "tokens_per_s_per_gpu": per_gpu,
                            "efficiency": per_gpu / base if per_gpu and base else None, "peak_gpu_mem_gib": peak})
    one = {r["step"]: r["loss"] for r in records(root / "eq1")}
    for n in cards:
        if n == 1:
            continue
        mine = {r["step"]: r["loss"] for r in records(root / f"eq{n}")}
        common = sorted(set(one) & set(mine))[:100]
        rel = [abs(mine[s] - one[s]) / max(abs(one[s]), 1e-12) for s in common]
        out["equivalence"].append({"cards": n, "steps": len(common), "max_rel_loss_diff": max(rel) if rel else None,
                                   "within_1e-3": bool(rel) and max(rel) <= 1e-3})
    out["regeneration"] = []
    answers_one = regenerated(root / "regen1")
    for n in sorted(int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"regen(\d+)", p.name))):
        timing = root / f"regen{n}" / "timing.json"
        if not timing.is_file():
            continue
        mine = regenerated(root / f"regen{n}")
        out["regeneration"].append({"cards": n, "seconds": json.loads(timing.read_text())["seconds"],
                                    "conversations": len(mine),
                                    "same_as_one_card": None if n == 1 or answers_one is None else mine == answers_one})
    return out


def regenerated(folder: Path) -> dict | None:
    """The regenerated conversations of a prepare --regenerate output, by id."""
    import gzip

    path = folder / "regenerated.jsonl.gz"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in gzip.open(path, "rt") if line.strip()]
    return {str(r.get("id", i)): r for i, r in enumerate(rows)}


def plot(result: dict, png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in result["weak"] if r["tokens_per_s_per_gpu"]]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["cards"] for r in rows], [r["efficiency"] for r in rows], "o-", label="weak-scaling efficiency")
    ax.axhline(0.9, color="gray", linestyle="--", linewidth=0.8, label="goal 0.9")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s per GPU / 1 GPU")
    ax.set_xticks([r["cards"] for r in rows])
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--skip-pct", type=float, default=20.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = table(Path(args.root), args.skip_pct)
    print(f"{'cards':>5} {'tok/s':>10} {'tok/s/GPU':>10} {'eff':>6} {'peak GiB':>8}")
    for r in result["weak"]:
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{r['cards']:>5} {fmt(r['tokens_per_s'], '10.0f')} {fmt(r['tokens_per_s_per_gpu'], '10.0f')} "
              f"{fmt(r['efficiency'], '6.3f')} {fmt(r['peak_gpu_mem_gib'], '8.2f')}")
    for r in result["regeneration"]:
        print(f"regeneration on {r['cards']} card(s): {r['seconds']} s, {r['conversations']} conversations"
              + ("" if r["same_as_one_card"] is None else f", same as one card: {r['same_as_one_card']}"))
    for r in result["equivalence"]:
        print(f"equivalence {r['cards']} cards vs 1: {r['steps']} steps, max relative loss difference "
              f"{r['max_rel_loss_diff']}" + (" (within 1e-3)" if r["within_1e-3"] else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
