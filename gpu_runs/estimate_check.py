"""On the GPU: the served-acceptance estimate (specheads/evaluation/estimate.py) over long
conversations, against the engine's measured acceptance on the same prompts.

    PYTHONPATH=$PWD python3 gpu_runs/estimate_check.py HEAD [--lengths 200 1500 3000] [--unbounded]

Each prompt is held-out ShareGPT text (.dev/prompts/sharegpt.json) joined until it reaches the
length; the engine decodes it greedily (64 new tokens, the default tree) and the estimate scores
the same answer. --unbounded scores every chunk of 64 roots in one prefill whatever its width
(the estimate before its prefill budget), to show what the budget prevents; run it last (or
with CUDA_LAUNCH_BLOCKING=1): a failed launch ends the process."""
import argparse
import json
import os

import torch

from specheads.evaluation import estimate
from specheads.heads.format import load_head
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.chat import render
from specheads.target.loader import load_target

ap = argparse.ArgumentParser()
ap.add_argument("head")
ap.add_argument("--lengths", type=int, nargs="+", default=[200, 1500, 3000])
ap.add_argument("--new-tokens", type=int, default=64)
ap.add_argument("--unbounded", action="store_true")
args = ap.parse_args()
if args.unbounded:
    estimate.PREFILL_TOKENS = 1 << 40

target, tok, _ = load_target(os.environ["TARGET"], dtype=torch.bfloat16, device="cuda")
head = load_head(args.head, device="cuda", dtype=torch.bfloat16)
texts = json.load(open(".dev/prompts/sharegpt.json"))
prompts = []
for n in args.lengths:
    text, i = "", 0
    while True:
        ids = tok(render(tok, [{"role": "user", "content": text + texts[i % len(texts)]}], add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        if len(ids) > n and text:
            break
        text, i = text + texts[i % len(texts)] + "\n\n", i + 1
    prompts.append(tok(render(tok, [{"role": "user", "content": text}], add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"])
engine = SpecEngine(target, head, "eagle3", max_batch=1, max_len=max(len(p) for p in prompts) + args.new_tokens + 64)
params = SamplingParams(max_new_tokens=args.new_tokens)
res = engine.generate(prompts, params)
answers = [r.token_ids for r in res]
est = estimate.served_acceptance(target, head, "eagle3", {"num_steps": 6, "topk": 4, "num_draft_tokens": 15},
                                 prompts, answers, [len(a) for a in answers])
torch.cuda.synchronize()
rows = []
for p, r, e in zip(prompts, res, est):
    rows.append({"prompt_tokens": len(p), "answer_tokens": len(r.token_ids), "measured": r.mean_accept_length,
                 "estimated": e["mean_accept_length"]})
    print(f"prompt {len(p):5d} tokens, answer {len(r.token_ids):4d}: measured {r.mean_accept_length:.3f}, "
          f"estimated {e['mean_accept_length']:.3f}", flush=True)
print("unbounded" if args.unbounded else f"prefill budget {estimate.PREFILL_TOKENS} tokens", "ok")
out = os.environ.get("OUT")
if out:
    json.dump({"card": torch.cuda.get_device_name(), "unbounded": args.unbounded, "rows": rows},
              open(os.path.join(out, "estimate_check_unbounded.json" if args.unbounded else "estimate_check.json"), "w"),
              indent=1)
