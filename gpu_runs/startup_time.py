"""How long a server's start-up capture takes, and the graph memory it holds: the engine that
`specheads serve` builds (SmolLM2-135M's shapes, random weights: a capture depends on shapes, not
weights), for each speculation policy and maximum batch, timed as `load_engine` times it
(`SpecEngine.capture_common` over batch sizes 1..max_batch; with the adaptive policy, the step
costs of every batch and context bucket are timed there too). The target's load from its GGUF
(dequantization on the host) comes before this and is not included: time it with
`specheads generate` or the server's log.

    python3 gpu_runs/startup_time.py --out $OUT/startup [--kind eagle3] [--max-batch 8 32 64]
        [--policies fixed adaptive] [--max-len 2048] [--tiers "1,1,1;2,1,2;4,1,4"] [--tree 6,4,15]
        [--profile-dir $OUT/profiles]

With --profile-dir the adaptive policy's measured step costs (every tier, batch and context
bucket) are saved there as speculation profiles (profile_b<max batch>.json), the costs
`python -m specheads.evaluation.policy_sim --profile` replays.

Prints a table (policy, max batch, graphs, capture s, of which cost timing s, graph MiB) and
writes the JSON.
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


def capture(kind: str, policy: str, max_batch: int, max_len: int, layers: int, tree=(6, 4, 15), tiers=None,
            profile=None) -> dict:
    from specheads.runtime.engine import SpecEngine

    target, head = build(kind, torch.device("cuda" if torch.cuda.is_available() else "cpu"),
                         torch.bfloat16 if torch.cuda.is_available() else torch.float32, layers)
    t0 = time.perf_counter()
    adaptive = dict(speculation_tiers=tiers, speculation_profile=profile) if policy == "adaptive" else {}
    engine = SpecEngine(target, head, method=kind, max_batch=max_batch, max_len=max_len, speculation_policy=policy,
                        num_steps=tree[0], topk=tree[1], num_draft_tokens=tree[2], **adaptive)
    built = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine.capture_common(range(1, max_batch + 1))
    seconds = time.perf_counter() - t1
    report = dict(engine.graph_report)
    row = {"kind": kind, "policy": policy, "max_batch": max_batch, "max_len": max_len, "engine_s": round(built, 2),
           "capture_s": round(seconds, 2), **report, "summary": engine.graph_summary()}
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
    args = ap.parse_args()
    tree = tuple(int(x) for x in args.tree.split(","))
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies:
        for mb in args.max_batch:
            profile = str(Path(args.profile_dir) / f"profile_b{mb}.json") if args.profile_dir and policy == "adaptive" \
                else None
            r = capture(args.kind, policy, mb, args.max_len, args.layers, tree, args.tiers, profile)
            rows.append(r)
            print(f"{policy:>8} max batch {mb:>3}: {r['summary']}; engine built in {r['engine_s']:.1f} s", flush=True)
    print(f"{'policy':>8} {'max b':>5} {'graphs':>6} {'capture s':>9} {'timing s':>8} {'graph MiB':>9}")
    for r in rows:
        print(f"{r['policy']:>8} {r['max_batch']:>5} {r.get('graphs', 0):>6} {r['capture_s']:>9.1f} "
              f"{r.get('measure_seconds', 0):>8.1f} {r.get('graph_memory_mib', 0):>9.0f}")
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"card": card, "date": time.strftime("%Y-%m-%d"), "kind": args.kind,
                               "layers": args.layers, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
