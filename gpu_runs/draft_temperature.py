"""A draft temperature, replayed: the served-acceptance estimate (evaluation/estimate.py,
teacher-forced) of a head's tree with the draft logits divided by T before the tree's scores (the
top-k of each node stays; which nodes the frontier and the tree keep changes). CPU float32 works;
nothing in the engine takes a temperature yet (docs/history/2026-12-04-step-old-new-b64-stream.md).

    python3 gpu_runs/draft_temperature.py TRACES.json[.gz] --temps 0.7,1.0,1.4 --out OUT.json
        [--head .dev/head] [--target T] [--prompts 0:24] [--tree 6,4,15]

TRACES: a policy_sim traces file (its prompts and the target's greedy answers as token ids).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specheads.evaluation.estimate import served_acceptance
from specheads.files import read_text
from specheads.heads.format import load_head
from specheads.kernels import draft
from specheads.target.loader import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces")
    ap.add_argument("--temps", required=True, help="T1,T2,...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--head", default=".dev/head")
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2")
    ap.add_argument("--prompts", default="0:24", help="LO:HI of the traces' prompts")
    ap.add_argument("--tree", default="6,4,15", help="S,K,N")
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)  # (two replays side by side on a 2-core machine)
    lo, hi = (int(x) for x in args.prompts.split(":"))
    steps_, topk, n_draft = (int(x) for x in args.tree.split(","))
    tree = dict(num_steps=steps_, topk=topk, num_draft_tokens=n_draft)
    data = json.loads(read_text(args.traces))
    prompts, answers = data["prompts"][lo:hi], data["answers"][lo:hi]
    target, _, _ = load_target(args.target)
    head = load_head(args.head, dtype=torch.float32)
    reference = draft.topk_expand_reference  # (the path the expansion takes off the GPU)
    results = {}
    try:
        for t in (float(x) for x in args.temps.split(",")):
            draft.topk_expand_reference = lambda logits, *a, _t=t, **k: reference(logits.float() / _t, *a, **k)
            t0 = time.time()
            with torch.no_grad():
                out = served_acceptance(target, head, "eagle3", tree, prompts, answers,
                                        new_tokens=[args.new_tokens] * len(prompts))
            steps = sum(o["steps"] for o in out)
            accepted = sum(o["accepted_tokens"] for o in out)
            results[t] = {"mean_accept": 1 + accepted / steps, "per_prompt": [o["mean_accept_length"] for o in out]}
            print(f"T={t}: mean accept {1 + accepted / steps:.4f} ({steps} steps, {time.time() - t0:.0f} s)", flush=True)
    finally:
        draft.topk_expand_reference = reference
    with open(args.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
