"""Outputs of captured CUDA graphs against eager steps, with the engine's capture settings (its
`capture_warmups`), needing no staged files: random bf16 weights at SmolLM2-135M's shapes (the
target and an EAGLE-3 head), greedy, random prompts. Every engine's tokens must equal plain decoding
run eagerly (no graphs): `ar` with graphs, the default drafting under the fixed and the adaptive
policy. A capture that misses a warm-up's initialisation shows here as a token that differs.

    python3 gpu_runs/capture_check.py [--max-batch 8] [--prompts 24] [--tokens 96] [--capture-warmups N]
        [--out $OUT/capture_check.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_step_times import build  # noqa: E402


def main() -> None:
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--capture-warmups", type=int, default=None, help="default: the engine's")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()  # (on a CPU every engine runs eagerly: a smoke run of the script)
    dev = torch.device("cuda" if cuda else "cpu")
    target, head = build("eagle3", dev, torch.bfloat16 if cuda else torch.float32, args.layers)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 40000, (int(n),), generator=gen).tolist()
               for n in torch.randint(8, 300, (args.prompts,), generator=gen)]
    params = SamplingParams(max_new_tokens=args.tokens)
    runs = {"ar eager": dict(method="ar", use_graphs=False),
            "ar graphs": dict(method="ar"),
            "eagle3+ngram fixed graphs": dict(method="eagle3+ngram", speculation_policy="fixed"),
            "eagle3+ngram adaptive graphs": dict(method="eagle3+ngram", speculation_policy="adaptive")}
    outs = {}
    report = {"card": torch.cuda.get_device_name() if cuda else "cpu", "max_batch": args.max_batch,
              "prompts": len(prompts), "tokens": args.tokens, "rows": []}
    for name, kw in runs.items():
        t0 = time.perf_counter()
        engine = SpecEngine(target, None if kw["method"] == "ar" else head, max_batch=args.max_batch, max_len=1024,
                            num_steps=6, topk=4, num_draft_tokens=15, **kw)
        if args.capture_warmups is not None:
            engine.capture_warmups = args.capture_warmups
        if engine.use_graphs:
            engine.capture_common(range(1, args.max_batch + 1))
        outs[name] = [r.token_ids for r in engine.generate(prompts, params)]
        same = sum(a == b for a, b in zip(outs[name], outs["ar eager"]))
        row = {"engine": name, "capture_warmups": engine.capture_warmups, "same_as_ar_eager": same,
               "seconds": round(time.perf_counter() - t0, 1)}
        report["rows"].append(row)
        print(f"{name:30s} warm-ups {engine.capture_warmups}  {same}/{len(prompts)} equal to ar eager  "
              f"({row['seconds']} s)", flush=True)
        del engine
        if cuda:
            torch.cuda.empty_cache()
    report["all_equal"] = all(r["same_as_ar_eager"] == len(prompts) for r in report["rows"])
    print("all equal" if report["all_equal"] else "SOME OUTPUTS DIFFER")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
