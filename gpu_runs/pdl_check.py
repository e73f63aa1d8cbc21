"""On the GPU: programmatic dependent launch (kernels/fused.py pdl_options) on and off, on
random-weight targets of the SmolLM2-135M and Llama-3.1-8B shapes: the graphed verify forward
over k tokens must give the same logits and KV cache bit for bit, and how long it takes.

    python3 gpu_runs/pdl_check.py [--out DIR] [--repeats 200]

Prints a table and writes pdl_check.json under --out (exit 1 if any output differs)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # bench.py
from bench import LLAMA_8B, chain_inputs, graphed_ms, prefill_random, random_target  # noqa: E402

from specheads.kernels import tuning  # noqa: E402
from specheads.runtime.graphs import GraphedForward  # noqa: E402
from specheads.target.model import KVCache  # noqa: E402

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rms_norm_eps=1e-5)


def run(cfg: dict, ks, context: int, repeats: int) -> list[dict]:
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    model = random_target(cfg, dev, dt)
    rows = []
    with torch.no_grad():
        for k in ks:
            outs = {}
            for pdl in (False, True):
                tuning.use(tuning.KernelTuning().replace(pdl_kernels=tuning.PDL_DEFAULT if pdl else frozenset()))
                cache = KVCache(model.spec, 1, context + k + 1, dt, dev)
                prefill_random(model, cache, context)
                graphed = GraphedForward(model, cache, k, tree=True)
                toks, pos, mask = chain_inputs(cache, context, k)
                logits = graphed(toks, pos, pos, mask).logits.clone()
                ms = graphed_ms(graphed, toks, pos, mask, repeats)
                outs[pdl] = (logits, cache.k.clone(), cache.v.clone(), ms)
                del graphed, cache
            same = all(torch.equal(a, b) for a, b in zip(outs[False][:3], outs[True][:3]))
            rows.append({"k": k, "ms_off": outs[False][3], "ms_on": outs[True][3],
                         "speedup": outs[False][3] / outs[True][3], "identical": same})
    tuning.use(tuning.KernelTuning())
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    report = {"card": torch.cuda.get_device_name(), "shapes": {}}
    ok = True
    print(f"{'shape':10} {'k':>3} {'PDL off ms':>10} {'PDL on ms':>10} {'speedup':>8}  identical")
    for name, cfg in (("smollm2", SMOLLM2), ("llama-8b", LLAMA_8B)):
        rows = run(cfg, (1, 8, 33), 512, a.repeats)
        report["shapes"][name] = rows
        for r in rows:
            print(f"{name:10} {r['k']:3} {r['ms_off']:10.3f} {r['ms_on']:10.3f} {r['speedup']:7.3f}x  {r['identical']}",
                  flush=True)
            ok &= r["identical"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pdl_check.json").write_text(json.dumps(report, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
