"""The adaptive policy of an older commit against the current one, replayed on the same traces
(evaluation/policy_sim.py) under the static cost model's parameters given: tokens per cost over
plain decoding for each tier as a fixed tree, the old policy and the current one. CPU, seconds.

    python3 gpu_runs/policy_old_new.py --traces docs/results/policy-sim-cpu/validation_traces.json \
        --old fd145ed --batch-sizes 1 4 --out docs/results/policy-sim-cpu/old_new_validation.json

--old COMMIT: the commit whose specheads/runtime/policy.py is the old policy (`git show`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from older import module_at  # noqa: E402

COSTS = {"static128": [], "static64": ["saturation_tokens=64", "draft_depth_cost=0.07"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="a policy_sim --traces file")
    ap.add_argument("--old", required=True, help="the older commit")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from specheads.evaluation.policy_sim import simulate, static_cost
    from specheads.runtime.policy import AdaptivePolicy, FixedPolicy, parse_tiers

    old = module_at(args.old, "specheads/runtime/policy.py", "old_policy")
    data = json.loads(Path(args.traces).read_text())
    tiers = sorted(parse_tiers(";".join(data["traces"])), key=lambda t: (t.num_draft, t.steps, t.topk))
    traces = {t: data["traces"][str(t)] for t in tiers}
    most = data["key"]["max_new_tokens"]
    lens = [len(p) for p in data["prompts"]]
    new = [max(min(len(a), most), 1) for a in data["answers"]]
    rows = []
    for name, params in COSTS.items():
        cost = static_cost(params)
        for b in args.batch_sizes:
            base = simulate(None, traces, lens, new, b, cost).tokens_per_cost
            fixed = {str(t): simulate(FixedPolicy(t), traces, lens, new, b, cost).tokens_per_cost / base for t in tiers}
            was = simulate(old.AdaptivePolicy(list(tiers), cost), traces, lens, new, b, cost).tokens_per_cost / base
            now = simulate(AdaptivePolicy(list(tiers), cost), traces, lens, new, b, cost).tokens_per_cost / base
            best = max(fixed.values())
            rows.append({"cost": name, "cost_params": params, "batch": b, "fixed_x_ar": fixed,
                         f"adaptive_{args.old}_x_ar": was, "adaptive_now_x_ar": now,
                         f"adaptive_{args.old}_of_best_fixed": was / best, "adaptive_now_of_best_fixed": now / best})
            print(f"{name:>9} b{b}: fixed {' '.join(f'{k} {v:.3f}' for k, v in fixed.items())} | adaptive {args.old} "
                  f"{was:.3f} ({was / best:.3f} of the best fixed), now {now:.3f} ({now / best:.3f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"traces": args.traces, "old": args.old, "prompts": len(lens),
                                          "max_new_tokens": most, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
