"""The adaptive policy's own host time a step, on a fixed sequence of calls: per batch size, a
policy (the default tiers with the ladder's 63-deep full tier, priced by a measured H100 profile)
chooses, is told what each row accepted (drafts drawn geometrically, fixed seed), and sees a row
leave and another join every 7 steps. Prints ms a step for `choose` and `observe` (the best of
--repeats) and a digest of the choices: two commits' digests must be equal where a change is
meant to change speed only.

    python3 gpu_runs/policy_host.py [--batch-sizes 1 8 32 64] [--steps 3000] [--repeats 5]
        [--old COMMIT] [--out FILE.json]

--old: the policy module of that commit (gpu_runs/older.py) in place of this checkout's: old and new
on the same machine, one run after the other."""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from older import module_at  # noqa: E402

# the H100 step costs measured on 2026-12-05 (the policy prices its choices with them)
PROFILE = (Path(__file__).resolve().parent.parent
           / "docs/results/policy-h100-2026-12-05/profile/eagle3_ngram-tree_6-4-15.json")


def load_policy(commit: str | None):
    """This checkout's policy module, or that commit's."""
    if not commit:
        import specheads.runtime.policy as module
        return module
    return module_at(commit, "specheads/runtime/policy.py", "old_policy")


def run(pol_mod, batch: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = pol_mod.TreeShape
    tiers = [shape(1, 1, 1), shape(2, 1, 2), shape(4, 1, 4), shape(63, 4, 15)]
    policy = pol_mod.AdaptivePolicy(tiers, pol_mod.SpeculationProfile.load(PROFILE))
    slots = [policy.new_row() for _ in range(batch)]
    lengths = rng.integers(20, 400, batch)
    choices, chose_s, observed_s = [], 0.0, 0.0
    cap = 15 if batch > 1 else 63  # (a wider batch's full tier is weighed at the tree's draft count)
    for step in range(steps):
        if step % 7 == 3:  # a row leaves, another joins
            i = int(rng.integers(batch))
            policy.release(slots[i])
            slots[i] = policy.new_row()
            lengths[i] = rng.integers(20, 200)
            policy.prime([slots[i]], [cap])
        kv = 512 if lengths.max() < 500 else 1024
        t0 = time.perf_counter()
        tier = policy.choose([(s, cap) for s in slots], batch, [kv] * (1 + len(tiers)), 0.0,
                             context=pol_mod.context_hint(float(lengths.mean()), kv))
        chose_s += time.perf_counter() - t0
        policy.launched(tier)
        choices.append(tier)
        if tier:
            depth = min(tiers[tier - 1].steps, cap)
            accepted = np.minimum(rng.geometric(0.3, batch) - 1, depth).tolist()
            t0 = time.perf_counter()
            policy.observe(slots, tier, [depth] * batch, accepted)
            observed_s += time.perf_counter() - t0
            lengths += np.asarray(accepted) + 1
        else:
            lengths += 1
        lengths = np.where(lengths > 900, 30, lengths)
    return choices, chose_s, observed_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--old", default=None, help="the older commit whose policy runs instead")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    module = load_policy(args.old)
    rows = []
    print(f"{'batch':>5} {'choose ms':>9} {'observe ms':>10} {'total ms':>8}  tiers chosen (plain, then each)  digest")
    for batch in args.batch_sizes:
        best = None
        for _ in range(args.repeats):
            choices, chose, observed = run(module, batch, args.steps)
            if best is None or chose + observed < best[1] + best[2]:
                best = (choices, chose, observed)
        choices, chose, observed = best
        row = {"batch": batch, "choose_ms": round(1e3 * chose / args.steps, 4),
               "observe_ms": round(1e3 * observed / args.steps, 4),
               "total_ms": round(1e3 * (chose + observed) / args.steps, 4),
               "tiers": np.bincount(choices, minlength=5).tolist(),
               "digest": hashlib.sha1(bytes(choices)).hexdigest()[:12]}
        rows.append(row)
        print(f"{batch:5d} {row['choose_ms']:9.4f} {row['observe_ms']:10.4f} {row['total_ms']:8.4f}  {row['tiers']}  "
              f"{row['digest']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.processor() or platform.machine(), "steps": args.steps,
                       "old": args.old, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
