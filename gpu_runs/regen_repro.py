"""Replay one chunk of the round-0 regeneration (the first user turns) on the engine, with a
report of the engine's state if a step fails.  python3 gpu_runs/regen_repro.py [--start 16384]"""

import argparse
import os
import sys
import time
import traceback

import torch

from specheads.data.chat import render
from specheads.data.regenerate import stop_token_ids
from specheads.data.sources import SkipLog, read_conversations
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.loader import load_target, load_tokenizer, resolve_target

ap = argparse.ArgumentParser()
ap.add_argument("--start", type=int, default=16384)
ap.add_argument("--count", type=int, default=4096)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--prefill-tokens", type=int, default=16384)
args = ap.parse_args()
target_dir = resolve_target(os.environ["TARGET"])
tok = load_tokenizer(target_dir)
model, _, _ = load_target(target_dir, dtype=torch.bfloat16, device="cuda")
prompts = []
for c in read_conversations("sharegpt", SkipLog(), None):
    system = [m for m in c.messages[:1] if m["role"] == "system"]
    users = [m for m in c.messages if m["role"] == "user"]
    if not users:
        continue
    ids = tok(render(tok, system + [users[0]], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    if len(ids) < 2048 - 8:
        prompts.append(ids)
prompts = prompts[args.start : args.start + args.count]
print(f"{len(prompts)} prompts, longest {max(map(len, prompts))}", flush=True)
engine = SpecEngine(model, method="ar", max_len=2048, max_batch=args.batch, prefill_tokens=args.prefill_tokens)
log = []
real_step = SpecEngine.step


def step(self):
    log.append((len(self.rows), len(self.waiting), int(self.committed[: len(self.rows)].max()) if self.rows else 0))
    return real_step(self)


SpecEngine.step = step
t0 = time.time()
try:
    out = engine.generate(prompts, SamplingParams(max_new_tokens=512), stop_token_ids(tok))
    torch.cuda.synchronize()
    print(f"ok: {sum(len(r.token_ids) for r in out)} tokens in {time.time() - t0:.1f} s, {len(log)} steps")
except Exception:
    traceback.print_exc()
    print("steps:", len(log), "last (rows, waiting, max committed):", log[-5:])
    sys.exit(1)
