"""Where a batched benchmark run's time goes, by speculation policy: the evaluation suite's chat
prompts through one engine as scripts/bench.py runs them (a warm-up run, then timed runs), each
engine step's host work timed by part: planning and launching a step (the policy's choice
inside), waiting for the card, reading the result, prefills, and any step costs the adaptive
policy times mid-run; launches counted by tier and by whether they ran ahead of the step before.

    python3 gpu_runs/policy_steps.py HEAD --out DIR [--batch-sizes 32] [--runs 2] [--prompts N] [--set chat|coding]
        [--trace] [--methods ar tree chain adaptive assist assist-adaptive adaptive-pace adaptive-refresh8 chain1 chain2 chain4 plain-eagle3 plain-ngram ngram ngram-adaptive
        ngram-host ngram-host-adaptive]   (TARGET in the environment)

Prints one line a method and batch size; writes DIR/policy_steps.json (and the costliest host
functions of each method's last run, cProfile, with --cprofile; each step and each choice of the
policy in the last run, with --trace)."""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from specheads.evaluation.suite import single_turn_texts
from specheads.heads.format import load_head
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.chat import render, stop_token_ids
from specheads.target.loader import load_target

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32


def engine_for(name: str, target, head, **kw) -> SpecEngine:
    """The engine of a method of METHODS (the head where it drafts with one)."""
    spec = METHODS[name]
    engine = SpecEngine(target, head if spec["method"].startswith("eagle3") else None, **spec, **kw)
    if name.startswith("plain-"):  # plain steps only, whatever a plain step's first drafts tell the policy
        choose = engine.policy.choose
        engine.policy.choose = lambda *a, **k: min(choose(*a, **k), 0)
    return engine


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


CHAT = ["writing", "roleplay", "reasoning", "math", "extraction", "stem", "humanities"]
METHODS = {  # name -> SpecEngine keywords
    "ar": dict(method="ar"),
    "tree": dict(method="eagle3", num_steps=6, topk=4, num_draft_tokens=15),
    "chain": dict(method="eagle3", num_steps=6, topk=1, num_draft_tokens=6),
    "adaptive": dict(method="eagle3", num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive"),
    # the n-gram assist beside the head's tree (the EAGLE-3 default), fixed and adaptive
    "assist": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15),
    "assist-adaptive": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                            speculation_policy="adaptive"),
    # the adaptive policy with the assist's gate (off there unless asked; with it the gated long chain): at
    # coding batch 1 on an H200 it ran the full tier every step yet 5% below the fixed engine (2026-12-03)
    "assist-adaptive-gated": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                  speculation_policy="adaptive", drafter_options={"ngram_gate": 1}),
    # adaptive with the full tree its only tier (it chooses between it and plain decoding): the
    # policy's own cost a step beside the fixed engine's at the same tree
    "assist-adaptive-full": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                 speculation_policy="adaptive", speculation_tiers="6,4,15"),
    # the same with the gate: the fixed engine's steps exactly (the gated chain where every row matches),
    # so beside `assist` it isolates what the adaptive engine adds to a step
    "assist-adaptive-gated-full": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                       speculation_policy="adaptive", speculation_tiers="31,4,15",
                                       drafter_options={"ngram_gate": 1}),
    # the same with `hold` (runtime/policy.py): a clear choice repeated without an estimate for a few steps
    "assist-adaptive-gated-hold": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                       speculation_policy="adaptive", drafter_options={"ngram_gate": 1},
                                       speculation_settings="hold=0.1"),
    # the assisted chain 2, fixed: the best fixed shape at chat batch 64 in a stream (H200, 2026-12-04)
    "assist-chain2": dict(method="eagle3+ngram", num_steps=2, topk=1, num_draft_tokens=2),
    "assist-chain4": dict(method="eagle3+ngram", num_steps=4, topk=1, num_draft_tokens=4),
    # adaptive with full_share's refresh for the full tree alone (share_all 0) and for every tier dearer
    # than the chosen one (share_all 1, the default since 2026-12-05 on the validation replay): at chat
    # batch 64 on an H200 +12%, at coding batch 32 -4 to -9% (2026-12-04, late, older policy code; one
    # order of the prompts each)
    "assist-adaptive-share0": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                   speculation_policy="adaptive", speculation_settings="share_all=0"),
    "assist-adaptive-share1": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                   speculation_policy="adaptive", speculation_settings="share_all=1"),
    # share_all 2: every other tier refreshed by the tokens/s it would give up (batches of more than 16 rows)
    "assist-adaptive-share2": dict(method="eagle3+ngram", num_steps=6, topk=4, num_draft_tokens=15,
                                   speculation_policy="adaptive", speculation_settings="share_all=2"),
    # fixed chains, to set each one's time a step beside the speculation profile's for its tier
    "chain1": dict(method="eagle3", num_steps=1, topk=1, num_draft_tokens=1),
    "chain2": dict(method="eagle3", num_steps=2, topk=1, num_draft_tokens=2),
    "chain4": dict(method="eagle3", num_steps=4, topk=1, num_draft_tokens=4),
    # drafting engines whose policy never drafts (prior 0, no probes): what a plain step costs
    # there against `ar`'s, the policy's bookkeeping included
    "plain-eagle3": dict(method="eagle3", num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive",
                         speculation_settings="prior=0,probe_every=1000000"),
    "plain-ngram": dict(method="ngram", num_draft_tokens=8, speculation_policy="adaptive",
                        speculation_settings="prior=0,probe_every=1000000"),
    "ngram": dict(method="ngram", num_draft_tokens=8),
    "ngram-adaptive": dict(method="ngram", num_draft_tokens=8, speculation_policy="adaptive"),
    # the adaptive policy pricing each tier at least at its measured pace (off by default), beside it
    "adaptive-pace": dict(method="eagle3", num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive",
                          speculation_settings="pace=1"),
    # the records folded (and every row's estimate worked out) every 8 steps instead of 4 in a batch of
    # more than 8 rows. On this project's CPU (gpu_runs/host_steps.py's stubbed steps at batch 64, timed by
    # part) adaptive's host took 0.45-0.46 ms a step against chain 2's 0.27, the choice and the records
    # 0.15 of it; with refresh=8 0.41-0.43 (the choice and records 0.12). The replay of the validation
    # traces moved tokens per cost by -0.3% to 0 at batch 64 and -1.1% to +1.9% at batch 32 with it
    "adaptive-refresh8": dict(method="eagle3", num_steps=6, topk=4, num_draft_tokens=15,
                              speculation_policy="adaptive", speculation_settings="refresh=8"),
    # the same lookup on the host (its reference), beside the device one in one call
    "ngram-host": dict(method="ngram-host", num_draft_tokens=8),
    "ngram-host-adaptive": dict(method="ngram-host", num_draft_tokens=8, speculation_policy="adaptive"),
}


def run_order(n: int, run: int) -> list[int]:
    """The prompts' order for timed run `run` under --shuffle: a permutation seeded by the run's index
    (the same on every machine, so old and new code meet the same orders; the replay's orders,
    `policy_sim --orders`, are the same permutations)."""
    from specheads.evaluation.policy_sim import stream_order

    return stream_order(n, 1, run, orders=2)


def instrument(engine, trace: bool = False) -> dict:
    """Wrap the engine's step parts with host timers; returns the live tally. With `trace`, the
    tally also lists every step (`steps`: when its result was read, rows, batch bucket, tier,
    tokens emitted, drafts accepted) and every choice of the policy (`choices`: rows, buckets,
    the expected tokens per ms of plain decoding and of each tier, the tier chosen)."""
    tally = {"ms": defaultdict(float), "n": Counter(), "tiers": Counter(), "ahead": Counter(),
             "steps": [], "choices": []}
    ms, n = tally["ms"], tally["n"]
    t_start = time.perf_counter()

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                ms[name] += 1000 * (time.perf_counter() - t0)
                n[name] += 1
        return wrapper

    launch, finish = engine._launch, engine._finish

    def _launch(ahead, **kw):
        t0 = time.perf_counter()
        out = launch(ahead, **kw)
        if not ahead:  # (also in `launch`) a launch not behind a step in flight: it plans its step itself
            ms["launch-unplanned"] += 1000 * (time.perf_counter() - t0)
            n["launch-unplanned"] += 1
        tally["tiers"][out.tier] += 1
        tally["ahead"][ahead] += 1
        n["gated"] += bool(out.gated)  # (the assist's gated steps, counted under the full tier too)
        return out

    def _finish(l):
        if l.event is not None:
            t0 = time.perf_counter()
            l.event.synchronize()
            ms["wait"] += 1000 * (time.perf_counter() - t0)
        out = finish(l)
        if trace:
            tally["steps"].append({"i": len(tally["steps"]), "t_ms": round(1000 * (time.perf_counter() - t_start), 3),
                                   "rows": len(l.rows),
                                   "b": l.batch, "tier": l.tier, "gated": l.gated,
                                   "tokens": sum(len(o.new_tokens) for o in out),
                                   "accepted": sum(o.accepted for o in out)})
        return out

    engine._launch = timed("launch", _launch)
    engine._finish = timed("finish", _finish)
    # a prefill's host work and its first tokens' read (requests that join behind a step in flight
    # are queued in the step's call and read after the step behind them is launched)
    engine._queue_prefill = timed("prefill", engine._queue_prefill)
    engine._read_prefill = timed("prefill", engine._read_prefill)
    engine._gate = timed("gate", engine._gate)  # the assist's gate: its wait for the step in flight
    engine._run = timed("run", engine._run)  # a launch's graph replay (the launch's rest: its host work around it)
    engine._measure_costs = timed("measure_costs", engine._measure_costs)
    if engine.policy is not None:
        choose = timed("choose", engine.policy.choose)

        def _choose(rows, batch, kv, host_ms=0.0, draining=False, context=None):
            tier = choose(rows, batch, kv, host_ms, draining, context)
            if trace and hasattr(engine.policy, "rates") and any(r is not None for r in rows):
                # (asked again for the trace, outside the choice's timer)
                rates = engine.policy.rates(rows, batch, kv, host_ms, draining, context)
                # the launch this choice is for (steps are read in launch order: `steps[i]`) and
                # the costs the rates divide by (ms where measured), for choice_audit.py
                tally["choices"].append({"i": sum(tally["tiers"].values()), "rows": len(rows), "b": batch, "kv": kv, "context": context,
                                         "tier": tier, "draining": draining,
                                         "rates": [round(float(x), 3) for x in rates],
                                         "costs": [round(float(x), 4) for x in engine.policy.costs(batch, kv, context)]})
            return tier
        engine.policy.choose = _choose if trace else choose
        engine.policy.observe = timed("observe", engine.policy.observe)
    return tally


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("head")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--set", default="chat", choices=["chat", "coding"],
                    help="the suite's test prompts: the seven single-turn chat categories in turn, or coding")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--trace", action="store_true", help="list each step and each choice of the last run (JSON)")
    ap.add_argument("--shuffle", action="store_true",
                    help="each timed run takes the prompts in its own order (seeded by the run's index; the "
                         "warm-up keeps the set's order): the adaptive policy's choices follow the records its "
                         "early steps leave, so one order's runs repeat one path")
    args = ap.parse_args()

    target, tok, _ = load_target(os.environ["TARGET"], dtype=DTYPE, device=DEV)
    head = load_head(args.head, device=DEV, dtype=DTYPE)
    texts = single_turn_texts("test", CHAT if args.set == "chat" else ["coding"], args.prompts)
    prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for t in texts]
    stops, params = stop_token_ids(tok), SamplingParams(max_new_tokens=args.max_new_tokens)
    report = {"card": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "set": args.set, "prompts": len(prompts),
              "cells": []}
    for b in args.batch_sizes:
        for name in args.methods:
            kw = METHODS[name]
            engine = engine_for(name, target, head, max_batch=b)
            if DEV == "cuda":
                engine.capture_common(range(1, b + 1))  # as a server does at start
            engine.generate(prompts, params, stops)  # warm-up: every bucket met captured (and timed)
            own = dict(engine.policy.__dict__) if engine.policy is not None else {}  # (plain-*: its choose)
            for run in range(args.runs):
                order = run_order(len(prompts), run) if args.shuffle else list(range(len(prompts)))
                run_prompts = [prompts[i] for i in order]
                tally = instrument(engine, trace=args.trace and run == args.runs - 1)
                prof = cProfile.Profile() if args.cprofile and run == args.runs - 1 else None
                sync()
                t0 = time.perf_counter()
                if prof:
                    prof.enable()
                results = engine.generate(run_prompts, params, stops)
                sync()
                wall = 1000 * (time.perf_counter() - t0)
                if prof:
                    prof.disable()
                for attr in ("_launch", "_finish", "_queue_prefill", "_read_prefill", "_measure_costs", "_gate", "_run"):
                    delattr(engine, attr)  # back to the class's methods
                if engine.policy is not None:  # back to the policy's own (a plain-* engine keeps its wrapper)
                    for attr in ("choose", "observe"):
                        engine.policy.__dict__.pop(attr, None)
                        if attr in own:
                            engine.policy.__dict__[attr] = own[attr]
                tokens = sum(len(r.token_ids) for r in results)
                launches = sum(tally["tiers"].values())
                tiers = engine.policy.tiers if engine.policy is not None else []
                cell = {"method": name, "batch": b, "run": run, "shuffled": args.shuffle, "wall_ms": wall, "tokens": tokens,
                        "tokens_per_s": tokens / wall * 1000, "launches": launches,
                        "ms_per_launch": wall / max(launches, 1),
                        # a step's share of the run without the prefills (beside the profile's step_ms)
                        "step_ms": (wall - tally["ms"].get("prefill", 0.0)) / max(launches, 1),
                        "tiers": {("plain" if t == 0 else str(tiers[t - 1])): c for t, c in sorted(tally["tiers"].items())},
                        "ahead_share": tally["ahead"][1] / max(launches, 1),
                        "host_ms": {k: round(v, 2) for k, v in tally["ms"].items()}, "calls": dict(tally["n"])}
                if tally["steps"]:
                    cell["steps"], cell["choices"] = tally["steps"], tally["choices"]
                    cell["tier_names"] = ["plain"] + [str(t) for t in tiers]  # a choice's tier index -> its tree
                pace = getattr(engine.policy, "_pace", None)
                if pace:  # the policy's paced step times (ms) by tier index and batch bucket, after this run
                    cell["pace_ms"] = {f"{t}@{b}": round(v[0], 4) for (t, b), v in sorted(pace.items())}
                if prof:
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
                    cell["cprofile"] = s.getvalue()[-6000:]
                report["cells"].append(cell)
                h = cell["host_ms"]
                print(f"{name:9s} b{b:<3d} run {run}: {cell['tokens_per_s']:8.0f} tok/s  {launches:5d} launches "
                      f"{cell['ms_per_launch']:6.3f} ms each ({cell['step_ms']:.3f} without prefills), ahead {cell['ahead_share']:.0%}  wait {h.get('wait', 0):7.1f}"
                      f"  launch {h.get('launch', 0):6.1f} (replay {h.get('run', 0):6.1f}; unplanned {h.get('launch-unplanned', 0):5.1f})"
                      f"  choose {h.get('choose', 0):5.1f}  finish-wait "
                      f"{h.get('finish', 0) - h.get('wait', 0):6.1f}  prefill {h.get('prefill', 0):6.1f}  "
                      f"measure {h.get('measure_costs', 0):6.1f} ({cell['calls'].get('measure_costs', 0)})  "
                      f"gate {h.get('gate', 0):6.1f} ({cell['calls'].get('gated', 0)} gated)  "
                      f"tiers {cell['tiers']}", flush=True)
                if prof:
                    print(cell["cprofile"][:3000])
            del engine
            if DEV == "cuda":
                torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "policy_steps.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
