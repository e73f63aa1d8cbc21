"""Profile training micro-steps on the GPU (prints the kernel table); decoding: gpu_runs/profile_decode.py."""
import os, time, torch
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
