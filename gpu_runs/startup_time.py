"""How long a server's start-up capture takes, and the graph memory it holds: the engine that
`specheads serve` builds (SmolLM2-135M's shapes, random weights: a capture depends on shapes, not
weights), for each speculation policy and maximum batch, timed as `load_engine` times it
(`SpecEngine.capture_common` over batch sizes 1..max_batch; with the adaptive policy, the step
costs of every batch and context bucket are timed there too), drafting with the kind's default
method as the server does (an EAGLE-3 head: eagle3+ngram, with its gate's graphs) unless --method
says otherwise. The target's load from its GGUF
(dequantization on the host) comes before this and is not included: time it with
`specheads generate` or the server's log.

    python3 gpu_runs/startup_time.py --out $OUT/startup [--kind eagle3] [--max-batch 8 32 64]
        [--policies fixed adaptive] [--max-len 2048] [--tiers "1,1,1;2,1,2;4,1,4"] [--tree 6,4,15]
        [--profile-dir $OUT/profiles] [--method eagle3] [--draft-option ngram_gate_long=0]
        [--compile-ahead on off] [--cold [--then-warm]] [--capture-warmups N] [--count]

--compile-ahead on off: each row with the kernels compiled ahead in parallel (kernels/ahead.py, the
default) and without (each variant compiled where the capture first launches it). --cold: each row
starts from an empty Triton cache (a fresh cache directory, kernels jitted afresh), as on a fresh
machine; without it a row finds what earlier rows and starts compiled. --then-warm: after each cold
row, the same start again on its cache (kernels jitted afresh, as in a restarted server): a start on
a machine that has compiled them, which skips the dry run.

--count (no GPU needed): count the graphs a start-up would capture, by batch bucket, without
capturing any, and the kernel variants it would compile, by kernel (a dry run for a stand-in sm_90 card,
compiling nothing): what a change to the engine's graph keys adds to a start-up, on the CPU. The
variants do not depend on the number of layers (--layers 1 is quick).

With --profile-dir the adaptive policy's measured step costs (every tier, batch and context
bucket) are saved there as speculation profiles (profile_b<max batch>.json), the costs
`python -m specheads.evaluation.policy_sim --profile` replays.

Prints a table (policy, max batch, compile ahead, cold or warm start, graphs, capture s, of which
cost timing s, graph MiB, kernel variants compiled ahead, Triton cache entries added during the
capture: compiled kernels, their launchers, the start's marker) and writes the JSON (after each row).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_step_times import build  # noqa: E402


def triton_cache_entries() -> int:
    """Entries of the Triton cache (TRITON_CACHE_DIR, else ~/.triton/cache): one a compiled kernel
    variant, so a capture's growth of it counts the kernels that capture compiled (a first start
    compiles; a start with the cache warm compiles none)."""
    import os

    root = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    return sum(1 for _ in root.iterdir()) if root.is_dir() else 0


def capture(kind: str, policy: str, max_batch: int, max_len: int, layers: int, tree=(6, 4, 15), tiers=None,
            profile=None, method: str | None = None, options: dict | None = None, count: bool = False,
            ahead_on: bool = True, cold: bool = False, warm: bool = False, warmups: int | None = None) -> dict:
    import os
    import tempfile

    from specheads.drafters import default_method
    from specheads.kernels import fused, offline
    from specheads.runtime.engine import SpecEngine

    cuda = torch.cuda.is_available() and not count
    if cold:  # an empty Triton cache, on disk and in memory
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    if cold or warm:  # (warm: the cache on disk as the last row left it)
        fused._jitted.clear()
    target, head = build(kind, torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32,
                         layers)
    method = method or default_method(head)
    t0 = time.perf_counter()
    adaptive = dict(speculation_tiers=tiers, speculation_profile=profile) if policy == "adaptive" else {}
    engine = SpecEngine(target, head, method=method, max_batch=max_batch, max_len=max_len, speculation_policy=policy,
                        num_steps=tree[0], topk=tree[1], num_draft_tokens=tree[2], drafter_options=options or {},
                        **adaptive)
    engine.compile_ahead = ahead_on
    if warmups is not None:
        engine.capture_warmups = warmups
    built = time.perf_counter() - t0
    variants, by_kernel = None, {}
    if count:  # the keys only: no graph captured, no step timed; the kernels counted by a dry run
        engine.use_graphs, engine._measuring = True, False
        engine._capture = lambda *key: key
        engine._prefill_graph = lambda width, sampled: engine.graphs.setdefault(("prefill", width, sampled), None)
        engine._allocate()
        _, _, buckets, widths = engine._capture_plan(range(1, max_batch + 1))
        if fused.triton is not None:
            with offline.for_card(90, compile=False):  # (the dry run alone: no mark left to skip the next)
                dry = engine._compile_ahead(buckets, widths) or {}
            variants, by_kernel = dry.get("variants"), dry.get("by_kernel", {})
    t1, cached = time.perf_counter(), triton_cache_entries()
    engine.capture_common(range(1, max_batch + 1))
    seconds = time.perf_counter() - t1
    compiled = triton_cache_entries() - cached
    report = dict(engine.graph_report)
    steps = [k for k in engine.graphs if k[0] != "prefill"]
    by_batch = {b: sum(k[0] == b for k in steps) for b in report.get("batch_buckets", [])}
    if count:
        report["compile_ahead"] = {"variants": variants, "by_kernel": by_kernel}
    row = {"kind": kind, "method": method, "options": options or {}, "policy": policy, "max_batch": max_batch,
           "max_len": max_len, "ahead": ahead_on, "cold": cold, "warm_restart": warm, "capture_warmups": engine.capture_warmups,
           "engine_s": round(built, 2),
           "capture_s": round(seconds, 2), **report, "step_graphs_by_batch": by_batch, "triton_compiled": compiled,
           "summary": engine.graph_summary()}
    del engine, target, head
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="startup")
    ap.add_argument("--kind", default="eagle3")
    ap.add_argument("--policies", nargs="+", default=["fixed", "adaptive"])
    ap.add_argument("--max-batch", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--tree", default="6,4,15", help="the engine's tree (the adaptive policy's largest tier)")
    ap.add_argument("--tiers", default=None, help="the adaptive policy's smaller tiers, S,K,N;... (default: chains)")
    ap.add_argument("--profile-dir", default=None, help="save each adaptive engine's measured step costs here")
    ap.add_argument("--method", default=None, help="the drafting method (default: the kind's, as `serve` drafts)")
    ap.add_argument("--draft-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a drafter option (repeatable), as `serve --draft-option`")
    ap.add_argument("--compile-ahead", nargs="+", choices=["on", "off"], default=["on"],
                    help="compile the kernels ahead in parallel (on), or where the capture launches them (off)")
    ap.add_argument("--cold", action="store_true", help="every row from an empty Triton cache")
    ap.add_argument("--then-warm", action="store_true", help="with --cold: each row again, on the cache it filled")
    ap.add_argument("--capture-warmups", type=int, default=None,
                    help="runs of each graph's work before its capture (default: the engine's, 1)")
    ap.add_argument("--count", action="store_true",
                    help="count the graphs and kernel variants only (no GPU needed)")
    args = ap.parse_args()
    from specheads.drafters import parse_options

    options = parse_options(",".join(args.draft_option))
    tree = tuple(int(x) for x in args.tree.split(","))
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    card = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.count else \
        platform.processor() or "cpu"
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies:
        for mb in args.max_batch:
            for on in args.compile_ahead:
                for warm in (False, True)[: 1 + (args.cold and args.then_warm)]:
                    profile = str(Path(args.profile_dir) / f"profile_b{mb}.json") if args.profile_dir and \
                        policy == "adaptive" else None
                    r = capture(args.kind, policy, mb, args.max_len, args.layers, tree, args.tiers, profile,
                                args.method, options, args.count, on == "on", args.cold and not warm, warm,
                                args.capture_warmups)
                    rows.append(r)
                    ahead_report = r.get("compile_ahead") or {}
                    top = ", ".join(f"{n} {c}" for n, c in list(ahead_report.get("by_kernel", {}).items())[:6])
                    what = (f"step graphs by batch bucket {r['step_graphs_by_batch']}, {ahead_report.get('variants')} "
                            f"kernel variants (most: {top})") if args.count else r["summary"]
                    print(f"{policy:>8} max batch {mb:>3}, {r['method']}, compile ahead {on}"
                          f"{', restarted warm' if warm else ''}: {what}; engine built in {r['engine_s']:.1f} s",
                          flush=True)
                    # (after every row: a call that runs out of time keeps what it measured)
                    out.write_text(json.dumps({"card": card, "date": time.strftime("%Y-%m-%d"), "kind": args.kind,
                                               "layers": args.layers, "cold": args.cold, "rows": rows}, indent=1))
    print(f"{'policy':>8} {'max b':>5} {'ahead':>5} {'start':>5} {'graphs':>6} {'capture s':>9} {'timing s':>8} "
          f"{'graph MiB':>9} {'variants':>8} {'entries':>8}")
    for r in rows:
        variants = (r.get("compile_ahead") or {}).get("variants")
        start = "warm" if r["warm_restart"] else "cold" if r["cold"] else "-"
        print(f"{r['policy']:>8} {r['max_batch']:>5} {'on' if r['ahead'] else 'off':>5} {start:>5} "
              f"{r.get('graphs', 0):>6} {r['capture_s']:>9.1f} {r.get('measure_seconds', 0):>8.1f} "
              f"{r.get('graph_memory_mib', 0):>9.0f} {'-' if variants is None else variants:>8} "
              f"{r['triton_compiled']:>8}")


if __name__ == "__main__":
    main()
