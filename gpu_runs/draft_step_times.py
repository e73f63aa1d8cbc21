"""What one speculative step costs for each head kind, against a plain decode step: SmolLM2-135M's
shapes with random weights (a step's kernels and shapes do not depend on the weights, only how
many tokens it accepts does), so no GGUF or trained head has to travel. Each kind drafts its tree
(default 6,4,15, capped at the head's depth) every step; each engine.step() is timed on the host
after warm-up, and the median step is reported (a step that captures a new cache bucket's CUDA
graph as the rows grow is an outlier), batch rows all decoding.

    python3 gpu_runs/draft_step_times.py --out $OUT/step_times [--kinds ar eagle3 mtp eagle medusa]
        [--batch-sizes 1 8] [--steps 200] [--label new] [--accept mtp=3.21 eagle3=2.62 ...]
        [--trees 6,4,15 8,10,63] [--profile 12]

A kind may carry head options: `medusa:shared_lm_head=1` (one vocabulary projection for every
Medusa head), `medusa:num_heads=2`, and its drafter's `lm_head_int8=0` (the draft readout as loaded)
and `draft_stop=P` (EAGLE-3: the draft stopped on the device; with random weights no depth's best
path keeps much probability, so `eagle3:draft_stop=0.9` stops after depth 1 at every step, the floor
of a stopped draft, and `eagle3:draft_stop=1e-30` never stops, the cost of the checks alone).

--trees times every kind at each tree shape (a row per kind, tree and batch); --profile N prints,
for each row, the N kernels that take the most GPU time in a step (torch.profiler over 20 steps),
so the part of a step that grows with the tree's size can be named.

--tunings LABEL=JSON ... times every kind and tree again under each kernel tuning (over the card's
defaults; `specheads/kernels/tuning.py`), e.g. the top-k expansion's block and warps:
`--tunings 'b2048={}' 'b1024={"speed": {"draft_block": 1024}}' 'w4={"speed": {"draft_warps": 4}}'`.

With --accept (served tokens a step, e.g. from a kinds table) it also prints the speedup those
would give at this step cost: accept / (step ms / ar step ms). Old and new code side by side:
run it from each checkout on the same card (gpu_runs/README.md).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specheads, run from anywhere

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
               rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)
SHAPES = {"mtp": {"num_modules": 5}, "medusa": {"num_heads": 4}}


FLAGS = ("shared_lm_head", "lm_head_int8")
DRAFTER_OPTIONS = ("lm_head_int8", "draft_stop")  # the rest configure the head
FLOATS = ("draft_stop",)


def kind_options(spec: str) -> tuple[str, dict, dict]:
    """'medusa:shared_lm_head=1,num_heads=3,lm_head_int8=0' -> ('medusa', {'shared_lm_head': True,
    'num_heads': 3}, {'lm_head_int8': False}): the kind, its head's options, its drafter's."""
    kind, _, opts = spec.partition(":")
    head, drafter = {}, {}
    for item in (x for x in opts.split(",") if x):
        key, _, value = item.partition("=")
        (drafter if key in DRAFTER_OPTIONS else head)[key] = (value.lower() in ("1", "true") if key in FLAGS else
                                                              float(value) if key in FLOATS else int(value))
    return kind, head, drafter


def build(spec: str, device, dtype, layers: int):
    from transformers import LlamaConfig

    from specheads.target.model import TargetModel

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers})
    target = TargetModel(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)
    kind, extra, _ = kind_options(spec)
    if kind == "ar":
        return target, None
    from specheads.heads.registry import head_kind

    entry = head_kind(kind)
    hcfg = entry.config.for_target(target, draft_vocab_size=32000, **{**SHAPES.get(kind, {}), **extra})
    head = entry.module(hcfg).to(device=device, dtype=dtype).eval().requires_grad_(False)
    return target, head


def kernel_table(engine, top: int, steps: int = 20) -> list[dict]:
    """The `top` kernels by GPU time a step over `steps` steps (name, us a step, calls a step)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total, e.count) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    table = [{"kernel": k[:90], "us_per_step": round(t / steps, 2), "calls_per_step": round(n / steps, 2)}
             for k, t, n in rows[:top]]
    return [{"kernel": "(all kernels)", "us_per_step": round(total / steps, 2), "calls_per_step": 0}] + table


def time_kind(kind: str, batch: int, steps: int, tree, layers: int, prompt_len: int, profile_top: int = 0,
              kernel_tuning=None) -> dict:
    from specheads.runtime.engine import Request, SpecEngine
    from specheads.runtime.sampling import SamplingParams

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from specheads.kernels import tuning

    # this row's kernel tuning (default: the card's), in use before the models are built and fused
    kernel_tuning = kernel_tuning or tuning.KernelTuning.for_device(device)
    tuning.use(kernel_tuning)
    target, head = build(kind, device, dtype, layers)
    kw = {} if kind == "ar" else dict(num_steps=tree[0], topk=tree[1], num_draft_tokens=tree[2])
    name, _, options = kind_options(kind)
    engine = SpecEngine(target, head, method=name, max_batch=batch, max_len=prompt_len + 4 * steps + 64,
                        drafter_options=options or None, kernel_tuning=kernel_tuning, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(batch):
        prompt = torch.randint(0, SMOLLM2["vocab_size"], (prompt_len,), generator=g).tolist()
        engine.add(Request(prompt, SamplingParams(max_new_tokens=4 * steps + 32)))
    warm = 20
    for _ in range(warm):
        engine.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    # each step alone (engine.step() reads the step before it: its wall time is a step's); the
    # median leaves out the steps that capture a new cache bucket's graph as the rows grow
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    if device.type == "cuda":
        torch.cuda.synchronize()
    mean = (time.perf_counter() - t0) * 1e3 / steps
    times.sort()
    depth = getattr(engine.drafter, "depth", 0) if engine.drafter is not None else 0
    row = {"kind": kind, "batch": batch, "tree": ",".join(map(str, tree)) if kind != "ar" else "",
           "ms_per_step": round(times[len(times) // 2] * 1e3, 4), "mean_ms": round(mean, 4),
           "p90_ms": round(times[int(0.9 * len(times))] * 1e3, 4), "steps": steps, "draft_depth": depth,
           "rows": len(engine.rows)}
    if profile_top and device.type == "cuda":
        row["kernels"] = kernel_table(engine, profile_top)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="step_times")
    ap.add_argument("--kinds", nargs="+", default=["ar", "eagle3", "mtp", "eagle", "medusa"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tree", default="6,4,15")
    ap.add_argument("--trees", nargs="+", default=None, metavar="S,K,N", help="several tree shapes (overrides --tree)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print each row's N costliest kernels")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--label", default="")
    ap.add_argument("--accept", nargs="*", default=[], metavar="KIND=TOKENS", help="served tokens a step")
    ap.add_argument("--tunings", nargs="+", default=None, metavar="LABEL=JSON",
                    help='kernel tunings to time each row under, over the card\'s defaults, e.g. '
                         '\'b1024={"speed": {"draft_block": 1024}}\' (default: the card\'s defaults alone; '
                         'the ar rows run under the first)')
    args = ap.parse_args()
    from specheads.kernels.tuning import KernelTuning, TuningError

    tunings = [("", None, None)]  # (label, its JSON, the tuning over the card's defaults): checked before any row runs
    if args.tunings:
        tunings = []
        for spec in args.tunings:
            label, sep, text = spec.partition("=")
            if not sep or not label:
                raise SystemExit(f"--tunings {spec!r}: expected LABEL=JSON, e.g. 'b1024={{\"speed\": {{\"draft_block\": 1024}}}}'")
            try:
                tunings.append((label, json.loads(text), KernelTuning.parse(text, base=KernelTuning.for_device())))
            except (json.JSONDecodeError, TuningError) as e:
                raise SystemExit(f"--tunings {label}: {text!r}: {e}") from None
    trees = [tuple(int(x) for x in t.split(",")) for t in (args.trees or [args.tree])]
    accept = {k: float(v) for k, v in (a.split("=") for a in args.accept)}
    rows = []
    cells = [(batch, kind, tree, t) for batch in args.batch_sizes for kind in args.kinds
             for tree in (trees[:1] if kind == "ar" else trees) for t in (tunings[:1] if kind == "ar" else tunings)]
    for batch, kind, tree, (tlabel, tjson, ktuning) in cells:
        r = time_kind(kind, batch, args.steps, tree, args.layers, args.prompt_len, args.profile, ktuning)
        if tlabel:
            r["tuning"], r["tuning_json"] = tlabel, tjson
        rows.append(r)
        print(f"{args.label} b{batch} {kind:>7} {r['tree']:>8} {tlabel}: {r['ms_per_step']:.3f} ms a step "
              f"(depth {r['draft_depth']})", flush=True)
        for k in r.get("kernels", []):
            print(f"      {k['us_per_step']:>9.1f} us {k['calls_per_step']:>6.1f}x  {k['kernel']}")
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    ar = {r["batch"]: r["ms_per_step"] for r in rows if r["kind"] == "ar"}
    for r in rows:
        if r["batch"] in ar:
            r["x_ar_step"] = round(r["ms_per_step"] / ar[r["batch"]], 3)
            if r["kind"] in accept:
                r["accept"] = accept[r["kind"]]
                r["predicted_speedup"] = round(accept[r["kind"]] / r["x_ar_step"], 3)
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    report = {"card": card, "label": args.label, "tree": args.tree, "trees": [",".join(map(str, t)) for t in trees], "layers": args.layers,
              "prompt_len": args.prompt_len, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    print(f"{'label':>6} {'batch':>5} {'kind':>7} {'tree':>8} {'tuning':>8} {'ms/step':>8} {'x ar':>6} {'accept':>6} "
          f"{'pred.':>6}")
    for r in rows:
        print(f"{args.label:>6} {r['batch']:>5} {r['kind']:>7} {r['tree']:>8} {r.get('tuning', ''):>8} "
              f"{r['ms_per_step']:>8.3f} {r.get('x_ar_step', 0):>6.2f} {r.get('accept', 0):>6.2f} "
              f"{r.get('predicted_speedup', 0):>6.2f}")
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
