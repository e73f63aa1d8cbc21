"""The host's share of a decode step, the device's work stubbed out: each step's result is set
(every row accepts a random number of its drafts, up to the tier's depth) instead of computed, so
what is timed is the engine's and the policy's Python per step (planning, the policy's choice,
reading the result, emitting tokens, observing, rows leaving and joining), on whatever machine runs
it. A tiny random target (its prefills are real, and small). Old and new code side by side: run
it from each checkout (PYTHONPATH) on the same machine.

    python3 gpu_runs/host_steps.py [--methods ar chain1 chain2 adaptive] [--batch 64] [--prompts 320]
        [--max-new-tokens 200] [--repeats 5] [--launches] [--card-ms 2.3 [--prefill-ms 0.8]] [--out FILE.json]

Prints, per method, the best and median wall time of `generate()` over the repeats without its
prefills, and ms a step (the steps the results count).

--card-ms: a stand-in card (`StandInCard`) instead: each step takes that many ms and each prefill
call --prefill-ms, queued in launch order, and the engine's reads wait on it as on a card (its
prefills are not computed). The wall then includes the waits, and the card's idle ms (nothing
queued while the host read, planned and launched) tell how much host work the run-ahead failed to
hide, e.g. at the steps after requests join."""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from transformers import LlamaConfig

from specheads.heads.registry import head_kind
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.model import TargetModel

METHODS = {"ar": {}, "chain1": dict(num_steps=1, topk=1, num_draft_tokens=1),
           "chain2": dict(num_steps=2, topk=1, num_draft_tokens=2),
           "chain4": dict(num_steps=4, topk=1, num_draft_tokens=4),
           # adaptive, made to verify chain 2 every step (its choice still worked out)
           "adaptive": dict(num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive"),
           # the full tree every step, fixed and under the adaptive policy's own choice (batch 1's host work)
           "tree": dict(num_steps=6, topk=4, num_draft_tokens=15),
           "tree-adaptive": dict(num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive"),
           # adaptive with the full tree its only tier: the policy's own host work beside the fixed tree's
           "tree-adaptive-full": dict(num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive",
                                      speculation_tiers="6,4,15"),
           "tree-adaptive-hold": dict(num_steps=6, topk=4, num_draft_tokens=15, speculation_policy="adaptive",
                                      speculation_settings="hold=0.1"),
           # the n-gram assist (method eagle3+ngram, the EAGLE-3 head's default), fixed and adaptive: its gate
           # and ladder make the policy's records 63 deep (the stub accepts at most the tree's 15 a step, and
           # runs no gated step: the gate reads the lookup's match from the device's step)
           "assist": dict(num_steps=6, topk=4, num_draft_tokens=15, method="eagle3+ngram"),
           "assist-chain4": dict(num_steps=4, topk=1, num_draft_tokens=4, method="eagle3+ngram"),
           "assist-adaptive": dict(num_steps=6, topk=4, num_draft_tokens=15, method="eagle3+ngram",
                                   speculation_policy="adaptive")}


def build(vocab: int = 512):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    target = TargetModel(cfg).eval().requires_grad_(False)
    entry = head_kind("eagle3")
    head = entry.module(entry.config.for_target(target, draft_vocab_size=vocab // 2)).eval().requires_grad_(False)
    return target, head


def stub(engine, seed: int = 3) -> None:
    """The step's result without the device's work: row r accepts a uniform 0..depth drafts (the
    tier's depth, at most its draft count)."""
    gen = torch.Generator().manual_seed(seed)

    def run(b, kv, sampled, tier, logprobs=False):
        shape = engine.policy.tiers[tier - 1] if tier else None
        depth = min(shape.steps, shape.num_draft) if tier else 0
        n = torch.randint(0, depth + 1, (b,), generator=gen) + 1
        out = engine.out
        out[:b, 0] = n
        out[:b, 1] = 7
        out[:b, 2] = depth
        out[:b, 5: 5 + depth] = 5
        return out
    engine._run = run


def timed(fn, tally: list):
    """fn, its seconds added to tally[0] and its calls counted in tally[1] where there is one."""
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            tally[0] += time.perf_counter() - t0
            if len(tally) > 1:
                tally[1] += 1
    return wrapper


def time_prefills(engine) -> list:
    """Wrap the engine's prefill with a timer (the real forward of the tiny target, not the host's
    share a step): returns the list its seconds are added to."""
    spent = [0.0]
    engine._queue_prefill = timed(engine._queue_prefill, spent)
    return spent


class StandInCard:
    """A card that runs each launched step in `step_ms` and each prefill call in `prefill_ms`, in
    launch order (a step starts when it is launched or when the card is done with the one before):
    `attach` gives the engine's launches its events, whose `synchronize` waits (spinning) for the
    step (queued where the step's graph would be replayed), and replaces the prefill's forward
    (first token 7); the read of a prefill's first tokens
    waits for the prefills queued so far (not for a step queued behind them). `idle_s`: the time
    the card had nothing queued, from its first launch on."""

    class Event:
        def __init__(self, at: float):
            self.at = at

        def query(self) -> bool:
            return time.perf_counter() >= self.at

        def synchronize(self) -> None:
            while time.perf_counter() < self.at:
                pass

    def __init__(self, step_ms: float, prefill_ms: float):
        self.step_s, self.prefill_s = step_ms / 1e3, prefill_ms / 1e3
        self.reset()

    def reset(self) -> None:
        self.free, self.prefilled, self.idle_s, self.busy_s = None, 0.0, 0.0, 0.0

    def queue(self, seconds: float) -> float:
        now = time.perf_counter()
        if self.free is not None and now > self.free:
            self.idle_s += now - self.free
        self.free = max(now, self.free or now) + seconds
        self.busy_s += seconds
        return self.free

    def attach(self, engine) -> None:
        """(After `stub`: a step is queued where its graph would be replayed, in `_run`.)"""
        launch, run, read = engine._launch, engine._run, engine._read_prefill
        queued = [0.0]

        def replayed(*a, **k):
            queued[0] = self.queue(self.step_s)
            return run(*a, **k)

        def launched(*a, **k):
            out = launch(*a, **k)
            out.event = self.Event(queued[0])
            return out

        def prefill(start, ids, lens, sampled, logprobs=False):
            self.prefilled = self.queue(self.prefill_s)
            return torch.full((ids.shape[0],), 7, dtype=torch.long)

        def read_prefill(*a, **k):  # (whatever the checkout's signature)
            self.Event(self.prefilled).synchronize()
            return read(*a, **k)

        engine._run, engine._launch = replayed, launched
        engine._prefill_forward, engine._read_prefill = prefill, read_prefill


def time_launches(engine) -> dict:
    """Wrap the engine's launch with timers: 'planned' (behind a step in flight, its plan made before),
    'unplanned' (it plans its own step: the first after a prefill) and the policy's `launched`;
    returns {part: [seconds, calls]}, emptied in place by the caller between runs."""
    spent = {"planned": [0.0, 0], "unplanned": [0.0, 0], "launched": [0.0, 0]}
    launch = engine._launch
    planned, unplanned = timed(launch, spent["planned"]), timed(launch, spent["unplanned"])
    engine._launch = lambda ahead, plan=None: (planned if ahead else unplanned)(ahead, plan=plan)
    if engine.policy is not None:  # (`ar` has none)
        engine.policy.launched = timed(engine.policy.launched, spent["launched"])
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=["ar", "chain1", "chain2", "adaptive"], choices=list(METHODS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=320)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--settings", default=None, help="the adaptive methods' --speculation-settings (NAME=VALUE,...)")
    ap.add_argument("--launches", action="store_true",
                    help="also the launch's host time, us a call: planned, unplanned (after a prefill), the policy's part")
    ap.add_argument("--card-ms", type=float, default=None, help="a stand-in card: ms a step (module docstring)")
    ap.add_argument("--prefill-ms", type=float, default=0.8, help="the stand-in card's ms a prefill call")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target, head = build()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (int(torch.randint(20, 60, (1,), generator=g)),), generator=g).tolist()
               for _ in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    engines = {}
    for name in args.methods:
        kw = dict(METHODS[name])
        method = kw.pop("method", "eagle3")
        if args.settings and kw.get("speculation_policy") == "adaptive":
            kw["speculation_settings"] = ",".join(x for x in (kw.get("speculation_settings"), args.settings) if x)
        engine = SpecEngine(target, head if name != "ar" else None, method="ar" if name == "ar" else method,
                            max_batch=args.batch, max_len=args.max_new_tokens + 128, **kw)
        engine.buckets = True  # the card's batch and context buckets (the policy's choices are kept between them)
        stub(engine)
        card = StandInCard(args.card_ms, args.prefill_ms) if args.card_ms else None
        if card is not None:
            card.attach(engine)
        if name == "adaptive":
            choose = engine.policy.choose
            engine.policy.choose = lambda *a, _c=choose, **k: (_c(*a, **k), 2)[1]
        engine.generate(prompts[: args.batch], params)  # warm-up
        engines[name] = (engine, time_prefills(engine), time_launches(engine) if args.launches else None, card)
    walls = {name: [] for name in args.methods}
    steps, parts, idle, busy = {}, {}, {name: [] for name in args.methods}, {}
    for _ in range(args.repeats):  # the methods in turn, so that the machine's drift falls on each alike
        for name, (engine, spent, launches, card) in engines.items():
            spent[0] = 0.0
            for tally in (launches or {}).values():
                tally[:] = [0.0, 0]
            if card is not None:
                card.reset()
            t0 = time.perf_counter()
            results = engine.generate(prompts, params)
            # (with the stand-in card the wall is the whole run: its prefills are the card's, not computed)
            walls[name].append(time.perf_counter() - t0 - (spent[0] if card is None else 0.0))
            if card is not None:
                idle[name].append(card.idle_s)
                busy[name] = card.busy_s
            steps[name] = max(1, sum(r.steps for r in results) // args.batch)
            if launches:  # (the last repeat's)
                parts[name] = {k: round(1e6 * t / max(n, 1), 2) for k, (t, n) in launches.items()}
    report = {"machine": platform.processor() or platform.machine(), "batch": args.batch, "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "date": time.strftime("%Y-%m-%d"), "rows": []}
    if args.card_ms:
        report |= {"card_ms": args.card_ms, "prefill_ms": args.prefill_ms}
    print(f"{'method':>9} {'best ms':>8} {'median':>8} {'steps':>6} {'ms a step':>9}"
          + (f" {'card busy ms':>12} {'idle ms (median)':>16}" if args.card_ms else ""))
    for name in args.methods:
        best, med = min(walls[name]) * 1e3, statistics.median(walls[name]) * 1e3
        row = {"method": name, "best_ms": round(best, 2), "median_ms": round(med, 2), "steps": steps[name],
               "ms_per_step": round(best / steps[name], 4)} | ({"launch_us": parts[name]} if name in parts else {})
        line = f"{name:>9} {best:8.1f} {med:8.1f} {steps[name]:6d} {best / steps[name]:9.4f}"
        if idle[name]:
            row |= {"card_busy_ms": round(1e3 * busy[name], 2), "card_idle_ms": [round(1e3 * t, 2) for t in idle[name]]}
            line += f" {1e3 * busy[name]:12.1f} {1e3 * statistics.median(idle[name]):16.1f}"
        report["rows"].append(row)
        print(line + (f"  launch us: {parts[name]}" if name in parts else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
