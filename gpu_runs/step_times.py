"""Where a batch-1 benchmark run's time goes beyond the steady step: prompts one after
another through one engine (as scripts/bench.py runs them), each engine.step() timed on the
host and split into prefill calls (a prompt joins) and decode calls, the decode calls also by
the context they stepped from.
    [PROMPTS=6] [NO_STOP=1] python3 gpu_runs/step_times.py HEAD [TREE]   (TREE: steps,topk,tokens; default engine's)"""
import json
import os
import sys
import time

import torch

try:
    from specheads.target.chat import render, stop_token_ids
except ImportError:  # an older checkout (run from its archive on PYTHONPATH)
    from specheads.data.chat import render
    from specheads.data.regenerate import stop_token_ids
from specheads.heads.format import load_head
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.loader import load_target

target, tok, _ = load_target(os.environ["TARGET"], dtype=torch.bfloat16, device="cuda")
head = load_head(sys.argv[1], device="cuda", dtype=torch.bfloat16)
texts = json.load(open(".dev/prompts/sharegpt.json"))[:int(os.environ.get("PROMPTS", "6"))]
prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
               add_special_tokens=False)["input_ids"] for t in texts]
# NO_STOP=1: every answer runs to its budget (no stop tokens), so two versions whose greedy
# answers differ still decode the same number of tokens a prompt
stops = () if os.environ.get("NO_STOP") == "1" else stop_token_ids(tok)
params = SamplingParams(max_new_tokens=256)
report = {}
for name, kw in [("ar", dict(method="ar")), ("eagle3-tree", dict(method="eagle3"))]:
    if name != "ar" and len(sys.argv) > 2:
        s, k, n = (int(x) for x in sys.argv[2].split(","))
        kw.update(num_steps=s, topk=k, num_draft_tokens=n)
    engine = SpecEngine(target, head if name != "ar" else None, max_batch=1, **kw)
    engine.generate(prompts, params, stops)  # warm-up: every graph captured
    calls = []
    real_step = engine.step

    def timed_step():
        joining = bool(engine.waiting)
        context = max((getattr(r, "committed", 0) for r in engine.rows), default=0)
        t0 = time.perf_counter()
        out = real_step()
        calls.append((joining, time.perf_counter() - t0, sum(len(o.new_tokens) for o in out), context))
        return out

    engine.step = timed_step
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = engine.generate(prompts, params, stops)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in res)
    pre = [c for c in calls if c[0]]
    dec = [c for c in calls if not c[0]]
    dec_ms = sorted(c[1] * 1000 for c in dec)
    row = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "prompt_lengths": [len(p) for p in prompts],
           "prefill_calls": len(pre), "prefill_ms_total": sum(c[1] for c in pre) * 1000,
           "decode_calls": len(dec), "decode_ms_total": sum(dec_ms), "decode_ms_median": dec_ms[len(dec_ms) // 2],
           "decode_ms_p90": dec_ms[int(len(dec_ms) * 0.9)], "decode_ms_max": dec_ms[-1],
           "outside_step_ms": wall * 1000 - sum(c[1] for c in calls) * 1000,
           "tokens_per_decode_call": sum(c[2] for c in dec) / max(len(dec), 1)}
    # decode calls by the context they stepped from (the committed length before the call)
    by_context = {}
    for lo in (0, 128, 256, 512, 1024):
        ms = sorted(c[1] * 1000 for c in dec if lo <= c[3] < max(2 * lo, 128))
        if ms:
            by_context[f"{lo}-{max(2 * lo, 128)}"] = {"calls": len(ms), "median_ms": ms[len(ms) // 2],
                                                    "mean_ms": sum(ms) / len(ms)}
    row["decode_by_context"] = by_context
    report[name] = row
    print(name, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
json.dump(report, open(os.path.join(os.environ.get("OUT", "."), "step_times.json"), "w"), indent=1)
