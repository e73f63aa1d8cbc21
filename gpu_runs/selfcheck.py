"""GPU self-check before timing: graphed engine steps against eager ones (same kernels, so the
same tokens) for one method and batch size, on held-out ShareGPT prompts.
    python3 gpu_runs/selfcheck.py HEAD METHOD MAX_BATCH [TOKENS]"""
import json
import os
import sys
import time

import torch

from specheads.data.chat import render
from specheads.data.regenerate import stop_token_ids
from specheads.heads.format import load_head
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.loader import load_target

head_dir, method, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 256
target, tok, _ = load_target(os.environ["TARGET"], dtype=torch.bfloat16, device="cuda")
head = load_head(head_dir, device="cuda", dtype=torch.bfloat16) if method.startswith("eagle3") else None
texts = json.load(open(".dev/prompts/sharegpt.json"))[:6]
prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
           for t in texts]
kw = {"ar": dict(method="ar"), "ngram": dict(method="ngram", num_draft_tokens=8),
      "eagle3-chain": dict(method="eagle3", topk=1), "eagle3-tree": dict(method="eagle3")}[method]
res = {}
if os.environ.get("TWICE"):  # the same graphed engine twice (the benchmark's warm-up + timed run)
    eng = SpecEngine(target, head, max_batch=batch, **kw)
    for i in range(2):
        print(f"{method} batch {batch} pass {i}", flush=True)
        res[i] = eng.generate(prompts, SamplingParams(max_new_tokens=tokens), stop_token_ids(tok))
        torch.cuda.synchronize()
    print(method, batch, "pass 2 == pass 1:", [a.token_ids == b.token_ids for a, b in zip(res[0], res[1])], flush=True)
    sys.exit()
for graphs in (False, True):
    eng = SpecEngine(target, head, use_graphs=graphs, max_batch=batch, **kw)
    eng.buckets = True  # eager at the graphs' widths: the same kernels, so the check isolates capture
    if graphs and os.environ.get("PRECAPTURE"):  # the server's start-up capture (batch 1) first
        print(f"captured {eng.capture_common((1,))} graphs at start", flush=True)
    t0 = time.time()
    res[graphs] = eng.generate(prompts, SamplingParams(max_new_tokens=tokens), stop_token_ids(tok))
    torch.cuda.synchronize()
    print(f"{method} batch {batch} graphs={graphs}: {time.time() - t0:.2f}s, accept "
          f"{[round(r.mean_accept_length, 2) for r in res[graphs]]}", flush=True)
print(method, batch, "graphed == eager:", [a.token_ids == b.token_ids for a, b in zip(res[False], res[True])], flush=True)
