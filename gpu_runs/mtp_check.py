"""An MTP head on the GPU: the drafter runs inside captured CUDA graphs at several batch sizes,
and its greedy outputs are compared with plain decoding (bf16; a random-weight head unless
--draft names a trained one, so acceptance says nothing about quality here).

    python3 gpu_runs/mtp_check.py --target $TARGET --prompts .dev/prompts/sharegpt.json --out $OUT/mtp_check
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default=None, help="a trained MTP head folder (default: random weights)")
    ap.add_argument("--prompts", required=True, help="JSON list of prompt texts")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--modules", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="bench/mtp_check")
    args = ap.parse_args()

    from specheads.heads.format import load_head
    from specheads.heads.mtp import MTPConfig, MTPHead
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import render, stop_token_ids
    from specheads.target.loader import load_target

    target, tok, _ = load_target(args.target, dtype=torch.bfloat16, device="cuda")
    if args.draft:
        head = load_head(args.draft, device="cuda", dtype=torch.bfloat16)
    else:
        torch.manual_seed(0)
        head = MTPHead(MTPConfig.for_target(target, target.spec.vocab_size, num_modules=args.modules))
        head = head.to("cuda", torch.bfloat16).eval().requires_grad_(False)
    texts = json.loads(Path(args.prompts).read_text())[: args.num_prompts]
    prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"][:512] for t in texts]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    stops = stop_token_ids(tok)
    rows, ref = [], {}
    for batch in (1, 8):
        for name, kw in (("ar", dict(method="ar")), ("mtp-chain", dict(num_steps=args.modules, topk=1)),
                         ("mtp-tree", dict(num_steps=args.modules, topk=4, num_draft_tokens=15))):
            engine = SpecEngine(target, None if name == "ar" else head, max_batch=batch, max_len=1024, **kw)
            engine.generate(prompts[:batch], params, stops)  # warm-up: captures the graphs
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = engine.generate(prompts, params, stops)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            outs = [r.token_ids for r in res]
            if name == "ar":
                ref[batch] = outs
            n = sum(len(o) for o in outs)
            steps = sum(r.steps for r in res)
            same = sum(a == b for a, b in zip(outs, ref[batch])) / len(outs)
            row = {"method": name, "batch": batch, "tokens_per_s": n / dt, "identical_to_ar": same,
                   "mean_accept_length": 1 + sum(r.accepted_tokens for r in res) / max(steps, 1),
                   "graphs": len(engine.graphs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"card": torch.cuda.get_device_name(), "draft": args.draft,
                                                    "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
