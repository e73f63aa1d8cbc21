"""Choosing a step's verify width after its draft, replayed from teacher-forced traces (CPU is fine;
nothing is built into the engine).

A step of the S,K,N tree drafts S depths into a pool and verifies its best N nodes. The draft costs the
same for N = 15 and N = 31; the wider verify costs more (H200, batch 1: 0.987 against 1.112 ms a step,
`docs/results/step-width-h200/`). A tree's expected acceptance is the sum of its nodes' probabilities of
lying on the answer's path; where the draft is calibrated, the probability mass of the nodes ranked
N0+1..N1 is what widening the verify would add. A rule "verify N1 nodes where that mass is above m, else
N0" needs the draft's scores on the host before the verify is launched (a wait inside the step), which
`--sync-ms` prices on every step.

For every step root of the target's greedy answers in a policy_sim traces file, this records the drafts
each width accepts and the pool's best path probabilities, then walks each answer as the engine does
under every rule, the oracle (the wider verify only where it accepts more) among them.

    python3 gpu_runs/verify_width.py --traces docs/results/policy-sim-cpu/validation_coding_l40_t256_traces.json.gz \\
        --draft .dev/head --out docs/results/verify-width-cpu/coding40
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specheads.evaluation.estimate import prefilled_roots, scoring_drafter, walk_with  # noqa: E402
from specheads.files import read_text  # noqa: E402

from draft_stop import accepted, recorded_pools  # noqa: E402


def positions(drafter, target, sequence: list[int], start: int, widths: list[int], rows: int = 64) -> list[dict]:
    """Per step root: {"acc": [drafts accepted verifying the best w nodes, for w in widths],
    "p": [the pool's best max(widths) path probabilities, descending]}."""
    out = []
    top = max(widths)
    with recorded_pools() as pools, torch.no_grad():
        for chunk, seq, ctx in prefilled_roots(drafter, target, sequence, start, rows):
            drafter.propose(ctx)
            score = pools["score"]
            acc = torch.stack([accepted(ctx, pools, seq, chunk, score, w, drafter.steps) for w in widths], 1)
            p = score.topk(top, dim=1).values.exp()
            out += [{"acc": acc[r].tolist(), "p": [round(x, 6) for x in p[r].tolist()]} for r in range(len(chunk))]
    return out


def rules(narrow: int, wide: int, margins: list[float]) -> list[tuple[str, object]]:
    """(name, pick) for: always narrow, always wide, the oracle, and widening where the mass of the
    nodes ranked narrow+1..wide is at least m. pick(position) -> (drafts accepted, 1 if wide)."""
    out = [("narrow", lambda p: (p["acc"][0], 0)), ("wide", lambda p: (p["acc"][1], 1)),
           ("oracle", lambda p: (p["acc"][1], 1) if p["acc"][1] > p["acc"][0] else (p["acc"][0], 0))]
    for m in margins:
        out.append((f"mass>={m}", lambda p, m=m: (p["acc"][1], 1) if sum(p["p"][narrow:wide]) >= m
                    else (p["acc"][0], 0)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="a policy_sim traces file: its prompts and the target's answers")
    ap.add_argument("--positions", default=None, help="a _positions.json.gz this script wrote (no model run)")
    ap.add_argument("--draft", default=None, help="the head (EAGLE-3)")
    ap.add_argument("--tree", default="6,4,15", help="S,K,N: the narrow tree")
    ap.add_argument("--wide", type=int, default=31, help="the wider verify's draft nodes")
    ap.add_argument("--limit", type=int, default=None, help="the first N answers only")
    ap.add_argument("--narrow-ms", type=float, default=0.987, help="a narrow step (H200, batch 1)")
    ap.add_argument("--wide-ms", type=float, default=1.112, help="a wide step (H200, batch 1)")
    ap.add_argument("--sync-ms", type=float, nargs="+", default=[0.0, 0.02, 0.04],
                    help="the wait a rule adds to every step (reading the draft's scores back)")
    ap.add_argument("--margins", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data = json.loads(read_text(args.traces))
    prompts, answers = data["prompts"][: args.limit], data["answers"][: args.limit]
    s, k, n = (int(x) for x in args.tree.split(","))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.positions:
        rows = json.loads(read_text(args.positions))["positions"][: args.limit]
    else:
        from specheads.heads.format import load_head
        from specheads.target.loader import load_target

        target, _, _ = load_target(data["key"]["target"], dtype=torch.float32, device="cpu")
        head = load_head(args.draft, device="cpu", dtype=torch.float32)
        drafter = scoring_drafter(target, head, "eagle3", {"num_steps": s, "topk": k, "num_draft_tokens": n},
                                  prompts, answers)
        rows = []
        for i, (p, a) in enumerate(zip(prompts, answers)):
            rows.append(positions(drafter, target, p + a, len(p), [n, args.wide]))
            print(f"{i + 1}/{len(prompts)}", flush=True)
        with gzip.open(out.with_name(out.name + "_positions.json.gz"), "wt") as f:
            json.dump({"traces": args.traces, "tree": args.tree, "wide": args.wide, "positions": rows}, f)
    new = [len(a) for a in answers][: len(rows)]
    report = {"traces": args.traces, "tree": args.tree, "wide": args.wide, "prompts": len(rows),
              "narrow_ms": args.narrow_ms, "wide_ms": args.wide_ms, "rules": []}
    base = None
    for name, pick in rules(n, args.wide, args.margins):
        w = [walk_with(m, lambda i, pos=pos: pick(pos[i])) for pos, m in zip(rows, new)]
        steps, drafts, wide = (sum(x[i] for x in w) for i in range(3))
        tokens = steps + drafts
        cost = (steps - wide) * args.narrow_ms + wide * args.wide_ms
        base = base or tokens / cost
        chosen = name not in ("narrow", "wide")  # a rule that reads the draft back waits on every step
        rule = {"rule": name, "steps": steps, "accept": 1 + (tokens - steps) / steps, "wide_share": wide / steps,
                "vs_narrow": {str(c): (tokens / (cost + chosen * c * steps)) / base for c in args.sync_ms}}
        report["rules"].append(rule)
        print(f"{name:>12}: accept {rule['accept']:.3f}, wide {rule['wide_share']:.2f}, tokens/ms against "
              f"always {n}: " + ", ".join(f"{v:.3f} (wait {c} ms)" for c, v in rule["vs_narrow"].items()), flush=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
