"""Profile one training micro-step and one batched decode step on the GPU (prints kernel tables)."""
import os, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from specheads.config import load_config
from specheads.training.trainer import Trainer

target = os.environ["TARGET"]
cfg = load_config("configs/smollm2-135m-eagle3.yaml", ["train.deepspeed=null"], **{"target.path": target, "data.path": "/tmp/prepared/smollm2", "output_dir": "/tmp/runs/prof"})
tr = Trainer(cfg); tr.setup(); tr.head.train()
for i in range(3):
    tr.micro_step(tr.batch_for(i)); tr.head.zero_grad(set_to_none=True)
torch.cuda.synchronize(); t = time.time()
for i in range(3, 8):
    tr.micro_step(tr.batch_for(i)); tr.head.zero_grad(set_to_none=True)
torch.cuda.synchronize(); print("train micro-step s", (time.time() - t) / 5)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for i in range(8, 10):
        tr.micro_step(tr.batch_for(i)); tr.head.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
from specheads.runtime.generate import generate_batch
from specheads.runtime.sampling import SamplingParams
prompts = [torch.randint(100, 40000, (400 + (i % 7) * 50,)).tolist() for i in range(256)]
generate_batch(tr.target, prompts[:8], SamplingParams(max_new_tokens=8))
torch.cuda.synchronize(); t = time.time()
generate_batch(tr.target, prompts, SamplingParams(max_new_tokens=64), compact_every=10**9)
torch.cuda.synchronize(); print("decode 256 x 64 tokens s", time.time() - t)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    generate_batch(tr.target, prompts, SamplingParams(max_new_tokens=16), compact_every=10**9)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
