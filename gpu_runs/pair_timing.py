"""Qwen2.5-Coder-0.5B drafting for -1.5B, timed on the GPU at their real shapes with random
weights (issue 25's fallback where the real weights cannot travel): the plain decode step of the
1.5B and the speculative step (the 0.5B drafting a chain or a tree, the 1.5B verifying it) in
the engine's captured graphs, and the speedup predicted from those times and the acceptance the
real pair measured (scripts/draft_pair.py, CPU, float32: tokens a verify step produced).

With random weights the drafts are rejected, so a speculative step produces one token: its time
is that of a step at any acceptance (the graphs run the same work whatever is accepted).
predicted speedup = acceptance x (ar time a step) / (speculative time a step).

    python3 gpu_runs/pair_timing.py --out $OUT/pair_timing [--batch-sizes 1 8] [--tiny]

Writes OUT.json and prints a table. --tiny: small shapes, for a CPU check of the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QWEN = dict(model_type="qwen2", vocab_size=151936, rms_norm_eps=1e-6, tie_word_embeddings=False,
            max_position_embeddings=32768, rope_theta=1e6)
SHAPES = {  # the GGUFs' configs (docs/results/draft-pair-cpu/draft_pair.json) and Qwen2.5's MLP widths
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}
# the real pair's acceptance (tokens a verify step produced), scripts/draft_pair.py on CPU, 8 coding
# prompts of the suite's test split, 48 new tokens: (tokens - prompts) / steps of its JSON
ACCEPTANCE = {"chain 4": (384 - 8) / 99, "tree 4,3,10": (384 - 8) / 87}
METHODS = {"ar": None, "chain 4": dict(num_steps=4, topk=1, num_draft_tokens=4),
           "tree 4,3,10": dict(num_steps=4, topk=3, num_draft_tokens=10)}


def model(shape: dict, device, dtype, tiny: bool):
    from transformers import Qwen2Config

    from specheads.target.model import TargetModel

    kw = {**QWEN, **shape}
    if tiny:
        kw.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024)
    cfg = Qwen2Config(**kw)
    with torch.device(device):
        m = TargetModel(cfg)
    for p in m.parameters():  # small weights: finite activations through every layer
        torch.nn.init.normal_(p, std=0.02)
    return m.to(dtype).eval().requires_grad_(False)


def timed(engine, prompts, new: int, device) -> dict:
    from specheads.runtime.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new)
    engine.generate(prompts, params)  # captures the graphs of these shapes
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    res = engine.generate(prompts, params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    steps = sum(r.steps for r in res)
    return {"wall_s": wall, "tokens": sum(len(r.token_ids) for r in res), "steps": steps,
            "accepted": sum(r.accepted_tokens for r in res)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="pair_timing")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    from specheads.drafters.draft_model import DraftLM
    from specheads.runtime.engine import SpecEngine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    target = model(SHAPES["1.5B"], device, dtype, args.tiny)
    draft = model(SHAPES["0.5B"], device, dtype, args.tiny)
    card = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    g = torch.Generator().manual_seed(1)
    rows = []
    report = {"card": card, "dtype": str(dtype), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "tiny": args.tiny, "prompt_len": args.prompt_len, "new_tokens": args.new, "torch": torch.__version__,
              "weights": "random (the real shapes)", "acceptance_source": "scripts/draft_pair.py, CPU float32, "
              "docs/results/draft-pair-cpu/draft_pair.json", "rows": rows}
    out = Path(args.out).with_suffix(".json")
    for b in args.batch_sizes:
        prompts = torch.randint(0, 500, (b, args.prompt_len), generator=g).tolist()
        ar_step = None
        for name, tree in METHODS.items():
            kw = dict(max_batch=b, max_len=args.prompt_len + args.new + 16)
            engine = (SpecEngine(target, method="ar", **kw) if tree is None
                      else SpecEngine(target, DraftLM(draft), **tree, **kw))
            r = timed(engine, prompts, args.new, device)
            step_ms = 1000 * r["wall_s"] / max(1, r["steps"] // b)  # a step of the whole batch
            row = {"batch": b, "method": name, **r, "step_ms": step_ms}
            if tree is None:
                ar_step = step_ms
            else:
                a = ACCEPTANCE[name]
                row.update(acceptance_real_pair=a, predicted_speedup=a * ar_step / step_ms)
            rows.append(row)
            out.write_text(json.dumps(report, indent=1))  # after every row: a run cut short keeps its rows
            print(f"{card} b{b:<3} {name:<12} step {step_ms:7.3f} ms  ({r['steps']} row-steps, {r['wall_s']:.2f} s)"
                  + (f"  predicted {row['predicted_speedup']:.2f}x at acceptance {row['acceptance_real_pair']:.2f}"
                     if tree else ""), flush=True)
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
