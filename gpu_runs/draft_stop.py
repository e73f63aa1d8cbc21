"""Stopping the head's draft early, replayed from teacher-forced traces (CPU is fine). The engine has
it since: the EAGLE-3 drafter's option draft_stop (drafters/eagle.py; 0.05 by default under the
adaptive policy, chosen with this replay on the validation answers).

A step of an S,K,N tree drafts all S depths. Where the best path's cumulative probability has fallen
low after depth d, the deeper depths add nodes the answer rarely accepts; a draft that stopped there
would save their cost. For every step root of the target's greedy answers in a policy_sim traces file
(its prompts and answers), this records, with the head's own EAGLE-2 pool:
- the best cumulative log-probability among the pool's nodes of each depth d = 1..S;
- the drafts the answer accepts from the tree a draft stopped after depth d selects (the best N
  nodes of the pool's depths <= d: the pool up to depth d is the same whether or not deeper depths
  are drafted).
Walking each answer as the engine does, a rule "stop after the first depth whose best path is below
exp(t)" then gives the steps, the tokens and the depths drafted, and so tokens per unit of cost for a
step costing `--step-ms` at full depth less `--depth-ms` per depth not drafted.

    python3 gpu_runs/draft_stop.py --traces docs/results/policy-sim-cpu/validation_coding_l40_t256_traces.json.gz \
        --draft .dev/head --tree 6,4,15 --limit 16 --out docs/results/draft-stop-cpu/coding16

Under the n-gram assist's gate (`--assist TIER`, a traces file of `eagle3+ngram`): a root where the
lookup matches (its suffix of MIN_NGRAM tokens occurred before, as the assist's device lookup finds it)
takes a gated step instead, which drafts no tree: it accepts what that tier's trace says and costs
`--gate-ms`; the stop rule applies to the other roots only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specheads.evaluation.estimate import following, prefilled_roots, scoring_drafter, walk_with  # noqa: E402
from specheads.files import read_text  # noqa: E402
from specheads.kernels.draft import select_tree_reference  # noqa: E402
from specheads.kernels.verify import accept, ancestors_reference  # noqa: E402


@contextmanager
def recorded_pools():
    """While open, every tree the EAGLE drafter selects leaves its candidate pool (tok, score, parent,
    depth [rows, pool]) in the yielded dict."""
    import specheads.drafters.eagle as eagle_mod

    pools = {}
    original = eagle_mod.select_tree

    def recording(roots, pool_tok, pool_score, pool_parent, pool_depth, n):
        pools.update(tok=pool_tok.clone(), score=pool_score.clone(), parent=pool_parent.clone(), depth=pool_depth.clone())
        return original(roots, pool_tok, pool_score, pool_parent, pool_depth, n)

    eagle_mod.select_tree = recording
    try:
        yield pools
    finally:
        eagle_mod.select_tree = original


def accepted(ctx, pools, seq, chunk, score, n: int, steps: int) -> torch.Tensor:
    """[rows] the drafts the answer accepts from the best n nodes of the pool (scored by `score`)."""
    tokens, parents, depths, _ = select_tree_reference(ctx.roots, pools["tok"], score, pools["parent"],
                                                       pools["depth"], n)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    y = following(seq, chunk[:, None] + depths + 1)
    anc = ancestors_reference(parents, steps).contiguous()
    _, length, _, _ = accept(tokens.contiguous(), parents.contiguous(), valid, depths.contiguous(), anc, y, steps)
    return length - 1


def positions(drafter, target, sequence: list[int], start: int, rows: int = 64) -> list[dict]:
    """Per step root: {"best": [best log-probability at depth d], "acc": [accepted drafts, stopped after d]}."""
    out = []
    with recorded_pools() as pools, torch.no_grad():
        for chunk, seq, ctx in prefilled_roots(drafter, target, sequence, start, rows):
            drafter.propose(ctx)
            steps, n = drafter.steps, drafter.num_draft
            score, depth = pools["score"], pools["depth"]
            best = torch.stack([score.masked_fill(depth != d, -math.inf).amax(1) for d in range(1, steps + 1)], 1)
            acc = torch.stack([accepted(ctx, pools, seq, chunk, score.masked_fill(depth > d, -math.inf),
                                        min(n, int((depth[0] <= d).sum())), d) for d in range(1, steps + 1)], 1)
            out += [{"best": best[r].tolist(), "acc": acc[r].tolist()} for r in range(len(chunk))]
    return out


def matched_roots(prompt: list[int], answer: list[int]) -> list[bool]:
    """Per step root j (after the answer's (j + 1)-th token): whether the assist's lookup matches there
    (a suffix of MIN_NGRAM tokens or more ending at the root occurred before; `ngram_lookup_reference`
    at the assist's MAX_NGRAM and MIN_NGRAM), i.e. whether the gate takes the step at batch 1. Never at the
    first root: the engine gates a step behind a drafting one, and the prefill drafts none."""
    from specheads.drafters.assist import MAX_NGRAM, MIN_NGRAM
    from specheads.kernels.ngram import ngram_lookup_reference

    seq = torch.tensor(prompt + answer)
    cols = torch.zeros(1, dtype=torch.long)
    out = []
    for j in range(len(answer) - 1):
        root = len(prompt) + j  # the root's index; the lookup reads the tokens before it
        _, found = ngram_lookup_reference(seq[None, :root], torch.tensor([root]), seq[root: root + 1], cols,
                                          MAX_NGRAM, MIN_NGRAM)
        out.append(bool(found[0]) and j > 0)
    return out


def walk(pos: list[dict], n: int, threshold: float | None, first: int | None = None,
         gated: list | None = None) -> tuple[int, int, int, int]:
    """(steps, tokens, depths drafted, gated steps) serving n tokens (the first from the prefill), each
    step stopping after the first depth whose best path is below `threshold` (None: never); with `first`
    D, a step whose first depth's best path is below `threshold` drafts D depths, any other all of them (a
    choice made from the first depth alone, as a host could read it before the step's later depths).
    gated[i]: the drafts a gated step rooted at i accepts where the assist's lookup matches there, None
    where it does not (a step drafting the head's tree); such a step drafts no depth."""
    full = len(pos[0]["acc"])
    count = [0]

    def pick(i):
        if gated is not None and gated[i] is not None:
            count[0] += 1
            return gated[i], 0
        p, d = pos[i], full
        if threshold is not None and first is None:
            d = next((j + 1 for j, b in enumerate(p["best"]) if b < threshold), full)
        elif threshold is not None and p["best"][0] < threshold:
            d = first
        return p["acc"][d - 1], d

    steps, _, depths = walk_with(n, pick)
    return steps, n - 1, depths, count[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="a policy_sim traces file: its prompts and the target's answers")
    ap.add_argument("--positions", default=None, help="a _positions.json.gz this script wrote (no model run)")
    ap.add_argument("--draft", default=None, help="the head (EAGLE-3)")
    ap.add_argument("--tree", default="6,4,15")
    ap.add_argument("--limit", type=int, default=None, help="the first N answers only")
    ap.add_argument("--step-ms", type=float, default=1.013, help="a full-depth step (H200, batch 1, context 512)")
    ap.add_argument("--depth-ms", type=float, nargs="+", default=[0.033, 0.015],
                    help="what each depth not drafted saves (0.033: the profile's draft depth)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.3],
                    help="stop after the first depth whose best path's probability is below this")
    ap.add_argument("--first-depth", type=int, default=None,
                    help="D: the rule reads the first depth only (below the threshold: draft D depths, else all)")
    ap.add_argument("--assist", default=None, metavar="TIER",
                    help="a tier of the traces file (from eagle3+ngram, e.g. 31,4,15): where the lookup matches, a "
                         "gated step accepts what that tier's trace says, costs --gate-ms and drafts no tree")
    ap.add_argument("--gate-ms", type=float, default=0.85,
                    help="a gated step (the lookup's chain verified, no tree drafted); an assumed price, not profiled")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data = json.loads(read_text(args.traces))
    prompts, answers = data["prompts"][: args.limit], data["answers"][: args.limit]
    gated = [None] * len(prompts)
    if args.assist:
        if args.assist not in data["traces"]:
            ap.error(f"--assist {args.assist}: the traces file has the tiers {sorted(data['traces'])}")
        trace = data["traces"][args.assist]
        gated = [[t if m else None for t, m in zip(trace[i], matched_roots(p, a))]
                 for i, (p, a) in enumerate(zip(prompts, answers))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.positions:
        rows = json.loads(read_text(args.positions))["positions"]
    else:
        from specheads.heads.format import load_head
        from specheads.target.loader import load_target

        target, _, _ = load_target(data["key"]["target"], dtype=torch.float32, device="cpu")
        head = load_head(args.draft, device="cpu", dtype=torch.float32)
        s, k, n = (int(x) for x in args.tree.split(","))
        drafter = scoring_drafter(target, head, "eagle3", {"num_steps": s, "topk": k, "num_draft_tokens": n},
                                  prompts, answers)
        rows = []
        for i, (p, a) in enumerate(zip(prompts, answers)):
            rows.append(positions(drafter, target, p + a, len(p)))
            print(f"{i + 1}/{len(prompts)}", flush=True)
        with gzip.open(out.with_name(out.name + "_positions.json.gz"), "wt") as f:
            json.dump({"traces": args.traces, "tree": args.tree, "positions": rows}, f)
    new = [len(a) for a in answers]
    full = len(rows[0][0]["acc"])
    report = {"traces": args.traces, "tree": args.tree, "prompts": len(rows), "step_ms": args.step_ms,
              "first_depth": args.first_depth, "assist": args.assist,
              "gate_ms": args.gate_ms if args.assist else None, "rules": []}
    base = None  # tokens per ms of the full draft: the first rule
    for t in [None] + args.thresholds:
        w = [walk(pos, n, None if t is None else math.log(t), args.first_depth, g)
             for pos, n, g in zip(rows, new, gated)]
        steps, tokens, depths, gates = (sum(x[i] for x in w) for i in range(4))
        trees = steps - gates  # the steps that draft the head's tree
        rule = {"threshold": t, "steps": steps, "gated_steps": gates, "accept": 1 + (tokens - steps) / steps,
                "mean_depth": depths / trees if trees else None, "vs_full": {}}
        rates = {}
        for c in args.depth_ms:
            cost = trees * args.step_ms - (trees * full - depths) * c + gates * args.gate_ms
            rates[str(c)] = tokens / cost
        base = base or rates
        rule["vs_full"] = {c: r / base[c] for c, r in rates.items()}
        report["rules"].append(rule)
        print(f"stop below {t if t is not None else '-':>5}: accept {rule['accept']:.3f}, gated steps {gates} of "
              f"{steps}, mean depth {rule['mean_depth'] or 0:.2f}, tokens/ms against the full draft: "
              + ", ".join(f"{v:.3f} (a depth {c} ms)" for c, v in rule["vs_full"].items()), flush=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
