"""Where a prompt's join costs time: one engine.step() that prefills a prompt (after a
warm-up run of the same prompts), timed in parts and under torch.profiler (host ops by
CPU time). Run on the GPU box:  python3 gpu_runs/profile_prefill.py HEAD"""
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specheads.data.chat import render
from specheads.heads.format import load_head
from specheads.runtime.engine import Request, SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.loader import load_target

target, tok, _ = load_target(os.environ["TARGET"], dtype=torch.bfloat16, device="cuda")
head = load_head(sys.argv[1], device="cuda", dtype=torch.bfloat16)
texts = json.load(open(".dev/prompts/sharegpt.json"))[:6]
prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
               add_special_tokens=False)["input_ids"] for t in texts]
params = SamplingParams(max_new_tokens=64)
engine = SpecEngine(target, head, max_batch=1)
engine.generate(prompts, params)
parts = {}
for name in ("_queue_joins", "_read_prefill", "_launch", "_finish"):  # (a join: queued, read)
    real = getattr(engine, name)

    def timed(*a, _real=real, _name=name, **k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = _real(*a, **k)
        torch.cuda.synchronize()
        parts.setdefault(_name, []).append((time.perf_counter() - t0) * 1000)
        return out
    setattr(engine, name, timed)
for p in prompts[:3]:
    engine.add(Request(p, params))
    t0 = time.perf_counter()
    engine.step()
    print(f"join step: {(time.perf_counter() - t0) * 1000:.2f} ms; parts (ms, synchronized): "
          + ", ".join(f"{k} {[round(x, 2) for x in v]}" for k, v in parts.items()), flush=True)
    parts.clear()
    while engine.has_work:
        engine.step()
engine.add(Request(prompts[3], params))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    engine.step()
    torch.cuda.synchronize()
table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)
print(table)
open(os.path.join(os.environ.get("OUT", "."), "profile_prefill.txt"), "w").write(table)
