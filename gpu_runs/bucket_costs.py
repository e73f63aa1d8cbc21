"""On the GPU: the speculation policy's step costs (each tier's captured step graph replayed, as
`SpecEngine._measure_costs` times them at start-up) at chosen batch and context buckets, under
kernel-tuning variants: where a step's cost jumps from one bucket to the next and whether a
setting removes the jump. Random SmolLM2-shaped weights (a cost depends on shapes only), so no
GGUF needs staging.

    python3 gpu_runs/bucket_costs.py --out DIR [--cells 1:512 1:1024 8:512 8:1024 ...]
        [--variants default attention_split_programs=132 pdl-attention ...]

A variant is `default`, FIELD=VALUE[,FIELD=VALUE] (kernels/tuning.py fields), `pdl-NAME`
(the kernel NAME launched without programmatic dependent launch; pdl-all: no kernel) or
`pdl+NAME[+NAME]` (these kernels launched with it too). Prints a table (ms a step:
the plain step and every tier, by cell and variant) and writes DIR/bucket_costs.json."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_step_times import build  # noqa: E402

DEFAULT_CELLS = ["1:256", "1:512", "1:1024", "1:2048", "8:256", "8:512", "8:1024", "32:128", "32:256", "32:512"]


def variant_tuning(name: str):
    from specheads.kernels import tuning
    base = tuning.active()
    if name == "default":
        return base
    if name == "pdl-all":
        return base.replace(pdl_kernels=frozenset())
    if name.startswith("pdl-"):
        return base.replace(pdl_kernels=frozenset(base.speed.pdl_kernels - {name[4:]}))
    if name.startswith("pdl+"):  # pdl+a+b: these kernels launched with PDL too
        return base.replace(pdl_kernels=frozenset(base.speed.pdl_kernels | set(name[4:].split("+"))))
    changes = {}
    for item in name.split(","):
        k, v = item.split("=")
        changes[k] = int(v) if v.lstrip("-").isdigit() else v
    return base.replace(**changes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", nargs="+", default=DEFAULT_CELLS, help="BATCH:CONTEXT_BUCKET")
    ap.add_argument("--variants", nargs="+", default=["default", "attention_split_programs=132"])
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()

    from specheads.kernels import tuning
    from specheads.runtime.engine import SpecEngine

    cells = [tuple(int(x) for x in c.split(":")) for c in args.cells]
    max_batch = max(b for b, _ in cells)
    max_len = max(kv for _, kv in cells)
    target, head = build("eagle3", "cuda", torch.bfloat16, args.layers)
    base = tuning.active()
    report = {"card": torch.cuda.get_device_name(), "layers": args.layers, "rows": []}
    for name in args.variants:
        engine = SpecEngine(target, head, "eagle3", num_steps=6, topk=4, num_draft_tokens=15, max_batch=max_batch,
                            max_len=max_len + 64, speculation_policy="adaptive", kernel_tuning=variant_tuning(name))
        engine._allocate()  # the buffers and per-tier drafters (capture_common does this first too)
        tiers = [None, *engine.policy.tiers]
        for b, kv in cells:
            engine._measure_costs(b, kv)
            ms = {str(t) if t else "plain": engine.policy.cost.step(b, kv, t) for t in tiers}
            report["rows"].append({"variant": name, "batch": b, "kv": kv, "step_ms": ms})
            print(f"{name:34s} b{b:<3d} kv{kv:<5d} " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()), flush=True)
        del engine
        torch.cuda.empty_cache()
        tuning.use(base)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bucket_costs.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
