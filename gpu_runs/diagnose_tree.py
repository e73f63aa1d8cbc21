"""Where does a tree lose acceptance on the GPU? One eagle3 tree run several ways (graphs,
overlap, attention kernel or SDPA) on held-out ShareGPT prompts, against ar's tokens.
    python3 gpu_runs/diagnose_tree.py HEAD STEPS,TOPK,TOKENS [STEPS,TOPK,TOKENS ...]"""
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

dtype = getattr(torch, os.environ.get("DTYPE", "bfloat16"))  # float32: the GPU path must equal ar exactly
target, tok, _ = load_target(os.environ["TARGET"], dtype=dtype, device="cuda")
head = load_head(sys.argv[1], device="cuda", dtype=dtype)
texts = json.load(open(".dev/prompts/sharegpt.json"))[:int(os.environ.get("N", 4))]
prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
           for t in texts]
params = SamplingParams(max_new_tokens=int(os.environ.get("TOKENS", 128)))
stops = stop_token_ids(tok)
ar = [r.token_ids for r in SpecEngine(target, method="ar", max_batch=1).generate(prompts, params, stops)]
rows = []
import specheads.runtime.engine as engine_mod  # noqa: E402
from specheads.kernels import tuning  # noqa: E402
from specheads.kernels.kv_commit import commit_kv, commit_kv_reference  # noqa: E402

# (graphs, overlap, attention, fused modules, triton commit)
VARIANTS = {"base": (True, True, "triton", True, True), "no-overlap": (True, False, "triton", True, True),
            "sdpa": (True, True, "sdpa", True, True), "eager": (False, False, "triton", True, True),
            "unfused": (True, True, "sdpa", False, True), "torch-commit": (True, True, "triton", True, False)}
for tree in sys.argv[2:]:
    s, k, n = (int(x) for x in tree.split(","))
    for name in os.environ.get("VARIANTS", "base,no-overlap,sdpa,eager").split(","):
        graphs, overlap, attn, fused, triton_commit = VARIANTS[name]
        tuning.use(tuning.KernelTuning().replace(attention=attn))
        engine_mod.commit_kv = commit_kv if triton_commit else commit_kv_reference
        eng = SpecEngine(target, head, "eagle3", num_steps=s, topk=k, num_draft_tokens=n, max_batch=1,
                         use_graphs=graphs, overlap=overlap)
        target.fused = head.fused = fused
        for rep in range(2 if os.environ.get("TWICE") else 1):  # TWICE: the benchmark's warm-up + timed run
            t0 = time.time()
            res = eng.generate(prompts, params, stops)
            torch.cuda.synchronize()
            acc = sum(r.accepted_tokens for r in res) / max(sum(r.steps for r in res), 1) + 1
            same = sum(r.token_ids == a for r, a in zip(res, ar))
            row = dict(tree=tree, variant=name, run=rep, accept=round(acc, 3),
                       per_prompt=[round(r.mean_accept_length, 2) for r in res],
                       same_as_ar=f"{same}/{len(ar)}", wall_s=round(time.time() - t0, 2))
            rows.append(row)
            print(row, flush=True)
        target.fused = head.fused = True
        del eng
tuning.use(tuning.KernelTuning())
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "diagnose_tree.json"), "w"), indent=1)
