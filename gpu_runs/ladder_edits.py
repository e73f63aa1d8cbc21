"""The lookup's ladder (ngram_gate_long) on answers that copy: code edits, replayed on the CPU.

Prompts: the function sources of the `code-prompts` source's "explain" prompts (CPython standard
library, PSF-2.0; their code is among the head's training prompts), each with an edit instruction
(`EDITS`, the instruction drawn by the function's index): the answer restates the function with a
change, so much of it copies the prompt. The target answers each greedily (plain decoding); the head's
tree and the lookup are then scored teacher-forced at every root of the answer (specheads/evaluation/
estimate.py, as a batch-1 engine under the fixed policy drafts: the gate on, its chain 31) and each
answer is walked with the gated chain alone and with each ladder (`ladder_walk`).

    python3 gpu_runs/ladder_edits.py --target T.gguf --draft .dev/head --prompts 24 --out docs/results/ladder-cpu/edits24
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from types import SimpleNamespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specheads.data.sources import CODE_PROMPTS_FILE  # noqa: E402
from specheads.evaluation.estimate import accepted_per_position, ladder, ladder_walk, scoring_drafter  # noqa: E402

EDITS = ("Rewrite the following Python function with type hints on its parameters and return value. Reply with "
         "the whole function.",
         "Rename the parameters of the following Python function to longer, clearer names. Reply with the whole "
         "function.",
         "Add a short comment above each statement of the following Python function. Reply with the whole function.")


def edit_prompts(count: int, max_chars: int = 1500) -> list[SimpleNamespace]:
    """`count` edit prompts (each with `turns`, as the evaluation suite's), from every k-th "explain"
    prompt whose code fits in max_chars."""
    rows = [json.loads(line) for line in gzip.open(CODE_PROMPTS_FILE, "rt")]
    code = [r["messages"][0]["content"].split("\n\n", 1)[1] for r in rows
            if r["messages"][0]["content"].startswith("Explain")]
    code = [c for c in code if 200 <= len(c) <= max_chars]
    step = max(len(code) // count, 1)
    return [SimpleNamespace(turns=[f"{EDITS[i % len(EDITS)]}\n\n{c}"]) for i, c in enumerate(code[::step][:count])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True, help="an EAGLE-3 head")
    ap.add_argument("--tree", default="6,4,15")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--ladders", default="63,127")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from specheads.evaluation.run import contexts
    from specheads.heads.format import load_head
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import stop_token_ids
    from specheads.target.loader import load_target

    target, tok, _ = load_target(args.target, dtype=torch.float32, device="cpu")
    head = load_head(args.draft, device="cpu", dtype=torch.float32)
    ctx = contexts(target, tok, edit_prompts(args.prompts), args.max_new_tokens, 3072)
    engine = SpecEngine(target, method="ar", max_len=max(map(len, ctx)) + args.max_new_tokens + 160, max_batch=8)
    ladders = [int(x) for x in args.ladders.split(",")]
    # past the budget by the longest ladder, so a step near the end is scored as the engine scores it
    answers = [r.token_ids for r in engine.generate(ctx, SamplingParams(max_new_tokens=args.max_new_tokens + max(ladders) + 1),
                                                    stop_token_ids(tok))]
    print(f"{len(ctx)} prompts answered", flush=True)
    s, k, n = (int(x) for x in args.tree.split(","))
    drafter = scoring_drafter(target, head, "eagle3+ngram", {"num_steps": s, "topk": k, "num_draft_tokens": n}, ctx,
                              answers, options={"ngram_gate_long": max(ladders)})
    chain = ladder(drafter)[0]
    walks = {"none": [], **{str(L): [] for L in ladders}}
    kinds = {key: {} for key in walks}
    for i, (p, a) in enumerate(zip(ctx, answers)):
        new = min(len(a), args.max_new_tokens)
        if new < 2:
            continue
        chains = []
        acc = accepted_per_position(drafter, target, p + a, len(p), chains=chains)
        walks["none"].append(ladder_walk(acc, chains, new, chain, chain, kinds["none"]))
        for L in ladders:
            walks[str(L)].append(ladder_walk(acc, chains, new, chain, L, kinds[str(L)]))
        print(f"{i + 1}/{len(ctx)}", flush=True)
    report = {"target": args.target, "draft": args.draft, "tree": args.tree, "gated_chain": chain,
              "prompts": len(walks["none"]), "max_new_tokens": args.max_new_tokens, "ladders": {}}
    for key, w in walks.items():
        steps, drafts = sum(x for x, _ in w), sum(y for _, y in w)
        report["ladders"][key] = {"accept": 1 + drafts / steps, "steps": kinds[key]}
        print(f"ladder {key:>5}: accept {1 + drafts / steps:.3f}, steps {kinds[key]}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
