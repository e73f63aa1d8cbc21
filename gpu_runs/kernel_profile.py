"""On the GPU: where a steady decoding step's time goes, kernel by kernel, at several batch
sizes, for whichever checkout is first on PYTHONPATH (so an older commit's archive runs it too:
it uses only the engine's public API, SpecEngine / Request / add / step).

    python3 gpu_runs/kernel_profile.py HEAD --out DIR [--label L] [--batch-sizes 1 8 32]
        [--methods ar eagle3-tree eagle3+ngram@6,4,15:ngram_gate=1] [--set FIELD=VALUE ...] [--policy adaptive]
        (TARGET in the environment; a method: ar, eagle3-tree (6,4,15) or METHOD@S,K,N[:drafter options])

For each method and batch size: the rows fill with held-out prompts (.dev/prompts/sharegpt.json;
--min-context N joins their texts until each has N tokens), run 12 steps (graphs captured, buckets warm), then 12 steps timed on the host (ms a step, tokens
a step) and 6 steps under the CUDA profiler; kernels are summed by name (and by a coarse family:
projection, attention, norm, draft, ...) per step. --set changes kernel tuning fields (newer
checkouts: specheads.kernels.tuning) for a what-if. --gaps also reads the profiled timeline: the
device's idle time between kernels a step, summed by the pair of kernels around each gap (where
two versions whose kernels take the same time still differ in step time). --host also times the
host: each step's wall time less the time it waits on the device (a step bound by the host
waits for nothing), and the host's costliest Python functions over 30 steps (cProfile). Prints a table; writes
DIR/LABEL.json."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

FAMILIES = [("linear", "projection"), ("gemm", "cublas"), ("cutlass", "cublas"), ("sm90", "cublas"),
            ("causal", "attention"), ("split_kernel", "attention"), ("attention", "attention"), ("flash", "attention"),
            ("fmha", "attention"), ("rms", "norm"), ("norm", "norm"), ("rope", "rope"), ("rotary", "rope"),
            ("topk", "draft"), ("select", "draft"), ("draft", "draft"), ("expand", "draft"), ("path", "accept"),
            ("accept", "accept"), ("verify", "accept"), ("commit", "kv"), ("kv", "kv"), ("mask", "mask"),
            ("step_inputs", "mask"), ("embed", "embed"), ("argmax", "accept")]


def family(name: str) -> str:
    low = name.lower()
    return next((f for key, f in FAMILIES if key in low), "other")


def short(name: str) -> str:
    return name.split("<")[0].replace("void ", "")[:40]


def gaps(prof, n_steps: int) -> dict:
    """Device idle time between consecutive kernels (and copies) of the profiled steps, a step:
    total, the number of kernels, and the 12 largest sums by (previous, next) kernel."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    ks = sorted((e["ts"], e["dur"], e["name"]) for e in events
                if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    by_pair, total, big = defaultdict(lambda: [0.0, 0]), 0.0, []
    for (t0, d0, n0), (t1, _, n1) in itertools.pairwise(ks):
        gap = t1 - (t0 + d0)
        if gap <= 0:
            continue
        if gap > 200:  # between steps' graphs (the host's turn), reported apart
            big.append(gap)
            continue
        total += gap
        key = f"{short(n0)} -> {short(n1)}"
        by_pair[key][0] += gap / n_steps
        by_pair[key][1] += 1
    top = sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:12]
    return {"idle_us": total / n_steps, "kernels": len(ks) / n_steps,
            "long_gaps_us": sum(big) / n_steps, "pairs": [[k, round(v[0], 2), v[1] // n_steps] for k, v in top]}


def engine_spec(method: str) -> tuple[str, tuple[int, int, int], dict]:
    """'eagle3-tree' (6,4,15) or 'METHOD@S,K,N[:name=value,...]' (e.g. 'eagle3+ngram@6,4,15:ngram_gate=1')
    -> (method, tree, drafter options)."""
    if method == "eagle3-tree":
        return "eagle3", (6, 4, 15), {}
    from specheads.evaluation.run import parse_methods  # (`specheads evaluate`'s syntax)

    m = parse_methods([method], (6, 4, 15))[-1]
    return m.method, (m.num_steps, m.topk, m.num_draft_tokens), dict(m.options)


# the steps a cell runs on its timed requests: warm-up, timed, host_time's (timed, then profiled), profiled
TIMED_STEPS, HOST_PROFILED_STEPS, PROFILED_STEPS = 12, 30, 6
WINDOW_STEPS = 3 * TIMED_STEPS + HOST_PROFILED_STEPS + PROFILED_STEPS


def host_time(steps) -> dict:
    """The host's time a step outside waits on the device, and its costliest functions."""
    import cProfile
    import io
    import pstats
    waited = [0.0]
    sync = torch.cuda.Event.synchronize

    def timed_sync(self):
        t = time.perf_counter()
        sync(self)
        waited[0] += time.perf_counter() - t

    torch.cuda.Event.synchronize = timed_sync
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        steps(TIMED_STEPS)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1000 / TIMED_STEPS
        waits = waited[0] * 1000 / TIMED_STEPS
        prof = cProfile.Profile()
        prof.enable()
        steps(HOST_PROFILED_STEPS)
        prof.disable()
    finally:
        torch.cuda.Event.synchronize = sync
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
    print(f"    host: step {wall:.3f} ms, waiting on the device {waits:.3f} ms, busy {wall - waits:.3f} ms")
    print("\n".join(line for line in buf.getvalue().splitlines()[6:34] if line.strip()))
    return {"step_ms": wall, "wait_ms": waits, "busy_ms": wall - waits, "cprofile_60_steps": buf.getvalue()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("head")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="run")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--methods", nargs="+", default=["ar", "eagle3-tree"])
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--new-tokens", type=int, default=400)
    ap.add_argument("--min-context", type=int, default=0,
                    help="join prompt texts (as one user turn) until each prompt has at least this many "
                         "tokens, to profile the steps of a longer context bucket (e.g. 600: the 1,024-key one)")
    ap.add_argument("--policy", default=None, choices=["fixed", "adaptive"],
                    help="the drafting methods' speculation policy (default: the engine's, fixed); adaptive "
                         "also times its tiers at the start, as a server does")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--host", action="store_true", help="the host's share of a step and its costliest functions")
    ap.add_argument("--gaps", action="store_true", help="the device's idle time between kernels, by kernel pair")
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch without programmatic dependent launch, so kernel times add up (older "
                         "checkouts: SPECHEADS_PDL=0 in the environment)")
    args = ap.parse_args()

    from specheads.evaluation.suite import CHAT_CATEGORIES, single_turn_texts
    from specheads.heads.format import load_head
    from specheads.runtime.engine import Request, SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.loader import load_target
    try:
        from specheads.target.chat import render
    except ImportError:
        from specheads.data.chat import render
    if args.set or (args.no_pdl and os.environ.get("SPECHEADS_PDL") != "0"):
        from specheads.kernels import tuning
        changes = {"pdl_kernels": frozenset()} if args.no_pdl else {}
        for item in args.set:
            k, v = item.split("=")
            changes[k] = int(v) if v.lstrip("-").isdigit() else v
        tuning.use(tuning.active().replace(**changes))

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    target, tok, _ = load_target(os.environ["TARGET"], dtype=dtype, device=args.device)
    head = load_head(args.head, device=args.device, dtype=dtype)
    saved = Path(".dev/prompts/sharegpt.json")  # the held-out ShareGPT turns where kept; else the suite's chat prompts
    texts = json.loads(saved.read_text()) if saved.exists() else single_turn_texts("test", CHAT_CATEGORIES, 64)
    encode = lambda t: tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),  # noqa: E731
                           add_special_tokens=False)["input_ids"]
    prompts = []
    for i, t in enumerate(texts):
        j = i
        while len(encode(t)) < args.min_context:  # the next prompts' texts appended, in turn
            j = (j + 1) % len(texts)
            t = t + "\n\n" + texts[j]
        prompts.append(encode(t))
    report = {"label": args.label, "min_context": args.min_context, "card": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "set": args.set, "cells": []}
    for method in args.methods:
        for b in args.batch_sizes:
            if method == "ar":
                engine = SpecEngine(target, method="ar", max_batch=b)
            else:
                name, shape, options = engine_spec(method)
                policy = {"speculation_policy": args.policy} if args.policy else {}  # (older checkouts: none)
                engine = SpecEngine(target, head, name, num_steps=shape[0], topk=shape[1], num_draft_tokens=shape[2],
                                    max_batch=b, drafter_options=options, **policy)
            if getattr(engine, "use_graphs", False) and hasattr(engine, "capture_common"):  # (older checkouts: none)
                # every graph the timed steps reach, captured first as a server starts: no capture
                # inside the timed or profiled windows (a fixed engine captures a bucket when met)
                engine.capture_common(range(1, b + 1))
            params = SamplingParams(max_new_tokens=args.new_tokens)
            engine.generate(prompts[:b], params)
            # the timed requests outlive every timed and profiled step (at most WINDOW_STEPS), even
            # where each step commits a whole chain: a row that left would leave steps that do nothing
            longest = max(len(prompts[i % len(prompts)]) for i in range(b))
            budget = max(args.new_tokens, WINDOW_STEPS * (getattr(engine, "widest_nodes", 1) + 1))
            timed = SamplingParams(max_new_tokens=min(budget, engine.max_len - longest - 1))
            for i in range(b):
                engine.add(Request(prompts[i % len(prompts)], timed, frozenset()))
            short = [0]

            def steps(n):
                toks = 0
                for _ in range(n):
                    toks += sum(len(o.new_tokens) for o in engine.step())
                    short[0] += len(engine.rows) < b
                return toks

            steps(TIMED_STEPS)
            sync()
            t0 = time.perf_counter()
            toks = steps(TIMED_STEPS)
            sync()
            ms = (time.perf_counter() - t0) * 1000 / TIMED_STEPS
            host = host_time(steps) if args.host and args.device == "cuda" else None
            with profile(activities=[ProfilerActivity.CUDA if args.device == "cuda" else ProfilerActivity.CPU]) as prof:
                steps(PROFILED_STEPS)
                sync()
            by_name = defaultdict(float)
            for e in prof.key_averages():
                t = getattr(e, "self_device_time_total", None)
                if t is None:
                    t = e.self_cuda_time_total
                if t > 0:
                    by_name[e.key] += t / PROFILED_STEPS
            by_family = defaultdict(float)
            for n, t in by_name.items():
                by_family[family(n)] += t
            top = sorted(by_name.items(), key=lambda kv: -kv[1])[:14]
            cell = {"method": method, "batch": b, "step_ms": ms, "tokens_per_step": toks / TIMED_STEPS,
                    "tokens_per_s": toks / TIMED_STEPS / ms * 1000, "kernel_us_per_step": sum(by_name.values()),
                    "families_us": dict(sorted(by_family.items(), key=lambda kv: -kv[1])),
                    "top_kernels_us": [[n[:90], t] for n, t in top]}
            if host is not None:
                cell["host"] = host
            if args.gaps:
                cell["gaps"] = gaps(prof, PROFILED_STEPS)
            cell["short_steps"] = short[0]  # steps after a row left (0: every figure is of full batches)
            if short[0]:
                print(f"  warning: {short[0]} steps ran with fewer than {b} rows (raise --new-tokens)", flush=True)
            report["cells"].append(cell)
            print(f"{args.label:10s} {method:12s} b{b:<3d} step {ms:7.3f} ms  tok/step {toks / TIMED_STEPS:6.2f}  "
                  f"tok/s {cell['tokens_per_s']:8.0f}  kernels {cell['kernel_us_per_step']:8.1f} us  "
                  + "  ".join(f"{f} {t:.0f}" for f, t in list(cell["families_us"].items())[:6]), flush=True)
            for n, t in top[:8]:
                print(f"      {t:8.1f} us  {n[:100]}")
            if args.gaps:
                g = cell["gaps"]
                print(f"    idle between kernels {g['idle_us']:.1f} us a step over {g['kernels']:.0f} kernels "
                      f"(+ {g['long_gaps_us']:.1f} us in gaps over 200 us)")
                for k, us, n in g["pairs"][:8]:
                    print(f"      {us:8.1f} us  {n:4d}x  {k}")
            del engine
            torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.label}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
