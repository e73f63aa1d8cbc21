"""Drafts accepted after plain steps: the adaptive policy made to probe (no prior, a probe every few
plain steps) against the fixed tree, on the evaluation suite's validation prompts. Where a plain step
left the drafter's state behind, the probes' drafts come from a stale context and are rarely
accepted (docs/benchmarks.md, "Speculation policy").

    TARGET=<gguf or folder> python3 gpu_runs/probe_acceptance.py HEAD [--settings prior=0,probe_every=4,probe_backoff=1]
        [--categories writing coding] [--per-category 4] [--max-new-tokens 96]

CPU (float32) or CUDA (bf16), batch 1. Prints the fixed tree's accepted drafts a step, the probing
run's accepted drafts a drafting step, and whether both outputs are the same."""
from __future__ import annotations

import argparse
import os

import torch

from specheads.evaluation.suite import single_turn_texts
from specheads.heads.format import load_head
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.chat import render, stop_token_ids
from specheads.target.loader import load_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("head")
    ap.add_argument("--settings", default="prior=0,probe_every=4,probe_backoff=1")
    ap.add_argument("--categories", nargs="+", default=["writing", "coding"])
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    target, tok, _ = load_target(os.environ["TARGET"], dtype=dtype, device=dev)
    head = load_head(args.head, device=dev, dtype=dtype)
    texts = [t for c in args.categories for t in single_turn_texts("validation", [c], args.per_category)]
    prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for t in texts]
    params, stops = SamplingParams(max_new_tokens=args.max_new_tokens), stop_token_ids(tok)
    tree = dict(num_steps=6, topk=4, num_draft_tokens=15, max_batch=1)
    fixed = SpecEngine(target, head, method="eagle3", **tree).generate(prompts, params, stops)
    print(f"fixed tree: {sum(r.accepted_tokens for r in fixed) / sum(r.steps for r in fixed):.2f} drafts accepted a step")
    engine = SpecEngine(target, head, method="eagle3", speculation_policy="adaptive",
                        speculation_settings=args.settings, **tree)
    seen = {"steps": 0, "accepted": 0}
    observe = engine.policy.observe

    def counting(rows, tier, offered, accepted):
        seen["steps"] += len(rows)
        seen["accepted"] += sum(accepted)
        return observe(rows, tier, offered, accepted)
    engine.policy.observe = counting
    probing = engine.generate(prompts, params, stops)
    steps = sum(r.steps for r in probing)
    print(f"adaptive ({args.settings}): {seen['accepted'] / max(seen['steps'], 1):.2f} drafts accepted a drafting "
          f"step, {seen['steps']} drafting steps of {steps}; outputs equal the fixed tree's: "
          f"{[r.token_ids for r in probing] == [r.token_ids for r in fixed]}")


if __name__ == "__main__":
    main()
