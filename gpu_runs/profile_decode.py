"""Where a decode step's time goes: CUDA-graph replays of our ar and eagle3-tree steps at
batch 1 under torch.profiler (kernels per step, the top kernels by time), plus the step time
with and without the profiler. Run on the GPU box:  python3 gpu_runs/profile_decode.py HEAD"""
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
text = json.load(open(".dev/prompts/sharegpt.json"))[0]
prompt = tok(render(tok, [{"role": "user", "content": text}], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
report, tables = {}, []
for name, kw in [("ar", dict(method="ar")), ("eagle3-tree", dict(method="eagle3"))]:
    engine = SpecEngine(target, head if name != "ar" else None, max_batch=1, **kw)
    engine.generate([prompt], SamplingParams(max_new_tokens=400))  # captures every context bucket it reaches
    engine.add(Request(prompt, SamplingParams(max_new_tokens=400), frozenset()))
    for _ in range(10):  # prefill, then steady steps
        engine.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 50
    for _ in range(n):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / n * 1000
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            engine.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    kernels = sum(e.count for e in events) / 10
    gpu_ms = sum(e.self_device_time_total for e in events) / 10 / 1000
    line = (f"== {name}: {step_ms:.3f} ms per step (no profiler), {kernels:.0f} kernels per step, "
            f"{gpu_ms:.3f} ms of kernel time per step")
    print(line)
    tables.append(line + "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30,
                                                          max_name_column_width=90))
    report[name] = {"step_ms": step_ms, "kernels_per_step": kernels, "kernel_ms_per_step": gpu_ms}
out = os.environ.get("OUT", ".")
json.dump(report, open(os.path.join(out, "profile_decode.json"), "w"), indent=1)
open(os.path.join(out, "profile_decode.txt"), "w").write("\n\n".join(tables))  # the top kernels of each
print(json.dumps(report))
