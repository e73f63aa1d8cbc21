"""Tree attention time per call by split-K chunk, at the shapes the engine runs (SmolLM2:
9 query heads over 3 KV heads, d 64; the 8B shape: 32 over 8, d 128), each replayed 200
times in a CUDA graph. Picks how many keys one program should walk.
    python3 gpu_runs/attn_chunks.py     (writes $OUT/attn_chunks.json)"""
import json
import os

import torch

from specheads.kernels import attention, tuning

dev = "cuda"
rows = []
shapes = [(1, 9, 3, 1, s, 64) for s in (128, 256, 512, 1024, 2048)] + \
         [(1, 9, 3, 33, s, 64) for s in (128, 256, 512, 1024, 2048)] + \
         [(1, 9, 3, 8, s, 64) for s in (256, 512, 1024)] + \
         [(8, 9, 3, 33, s, 64) for s in (256, 1024)] + \
         [(1, 32, 8, 1, s, 128) for s in (512, 1024)]
for b, h, kv, t, s, d in shapes:
    q = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, kv, s, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, kv, s, d, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(b, 1, t, s, dtype=torch.bool, device=dev)
    res = {"b": b, "h": h, "kv": kv, "t": t, "s": s, "d": d}
    for chunk in (64, 128, 256, 512, 1024, 2048):
        if chunk > max(s, 64) * 2:
            continue
        tuning.use(tuning.KernelTuning().replace(attention_chunk=chunk))
        for _ in range(3):
            attention.tree_attention(q, k, v, mask)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(200):
                attention.tree_attention(q, k, v, mask)
        g.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        res[f"chunk{chunk}_us"] = round(e0.elapsed_time(e1) / 200 * 1000, 2)
    rows.append(res)
    print(res, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "attn_chunks.json"), "w"), indent=1)
