"""The speculation policy replayed offline: what a policy would choose, step by step, and the
time it would take, without the decode loop.

Greedy speculative decoding emits the target's own greedy continuation whatever tree a step
verifies, so a request's steps depend only on where each step is rooted and how many drafts the
chosen tier's tree gets accepted there. `tier_traces` computes, once per tier, the accepted drafts
of a step rooted at every position of each continuation (teacher-forced, as `estimate.py` does);
`simulate` then runs the policy's own code (`runtime/policy.py`: the same `choose`, `observe`,
`launched`) over a continuous batch of those requests, as the engine does when it does not run a
step ahead, and adds up each step's cost (a measured `SpeculationProfile` of the card, or the
static model). Policies, tiers and their settings can so be compared and tuned on the validation
prompts in seconds once the traces exist; what it predicts is checked against the engine on the
card (the evaluation suite, scripts/bench.py).

    python -m specheads.evaluation.policy_sim --draft HEAD [--target T] --split validation \
        --limit 8 --tiers "1,1,1;2,1,2;4,1,4;6,4,15" --batch-sizes 1 8 32 64 \
        [--profile PROFILE.json] [--grid window=8,16,32 prior_weight=1,2,4 explore_every=32,64] \
        [--traces TRACES.json] --out OUT

--profile: the card's step costs; a file that does not exist is measured first (GPU: every tier
and plain decoding at every batch and context bucket, as a server's start-up does) and saved.
--traces: the answers and per-tier traces, kept for later runs (a tier it lacks is traced and added).

Not modelled: the host's share of a step (a device drafter's step overlaps it), prefill (the
same for every policy) and a sampled request's steps (its tokens, not only its steps, follow
the noise; the policy treats them alike).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specheads.evaluation.estimate import accepted_per_position, scoring_drafter
from specheads.runtime.defaults import DEFAULT_TREE
from specheads.runtime.graphs import next_pow2
from specheads.runtime.policy import FIRST_DRAFT_ROWS, POLICY_SETTINGS, AdaptivePolicy, FixedPolicy, StaticCost, \
    TreeShape, context_hint, setting_value


def headless(draft: str) -> bool:
    """--draft names a registered method that drafts without a head (the prompt lookups), not a head."""
    from specheads.drafters import PLAIN, method_names, method_needs_head

    return draft != PLAIN and draft in method_names() and not method_needs_head(draft)


def method_of(head, draft: str, method: str | None = None) -> str:
    """The drafting method: --method where given, else the head's kind, or the headless method --draft names."""
    return method or (head.kind if head is not None else draft)


def tells_first(draft: str) -> bool:
    """--draft's drafter tells its first draft in a plain step (`Abilities.first_draft`), read from
    the method's drafter or the head kind's drafter class (no weights loaded)."""
    from specheads.drafters import DraftSetup, build_drafter
    from specheads.heads.fetch import resolve_head
    from specheads.heads.format import read_folder_config
    from specheads.heads.registry import drafter_class

    if headless(draft):
        return build_drafter(draft, DraftSetup(None)).abilities.first_draft
    kind, _ = read_folder_config(resolve_head(draft))
    return drafter_class(kind).abilities.first_draft


def tier_traces(target, head, method: str, tiers: list[TreeShape], prompts: list[list[int]],
                continuations: list[list[int]], rows: int = 64,
                head_tree: tuple[int, int, int] = DEFAULT_TREE) -> dict[TreeShape, list[list[int]]]:
    """traces[tier][i][j]: drafts accepted by a step of that tree rooted j tokens into
    continuation i (after its (j + 1)-th token), for every j but the last. A method with the n-gram
    assist (KIND+ngram) drafts the tiers of one drafter over the head's own tree `head_tree` (its
    tiers are the assisted engine's: the largest as deep as the lookup's gated chain, or deeper; it
    is traced with the gated chain, without the ladder: a ladder step depends on the step before it,
    which a trace of each root alone does not know)."""
    from specheads.drafters.assist import split_method

    out = {}
    parent = full = None
    if split_method(method)[1]:
        steps, topk, n = head_tree
        parent = scoring_drafter(target, head, method, {"num_steps": steps, "topk": topk, "num_draft_tokens": n},
                                 prompts, continuations, rows, options={"ngram_gate_long": 0})
        full = TreeShape(parent.depth, parent.topk, parent.num_draft)
    for tier in tiers:
        if parent is not None:
            # (the engine's full tier, as deep as its ladder, or the gated chain's)
            top = tier.steps >= full.steps and (tier.topk, tier.num_draft) == (full.topk, full.num_draft)
            drafter = parent if top else parent.tier(tier)
        else:
            drafter = scoring_drafter(target, head, method, {"num_steps": tier.steps, "topk": tier.topk,
                                                             "num_draft_tokens": tier.num_draft}, prompts,
                                      continuations, rows)
        out[tier] = [accepted_per_position(drafter, target, p + c, len(p), rows) for p, c in zip(prompts, continuations)]
        del drafter
    return out


@dataclass
class SimResult:
    tokens: int = 0
    cost: float = 0.0  # in the cost model's unit (ms for a measured profile)
    steps: int = 0
    drafted_steps: int = 0
    accepted: int = 0  # drafts accepted (a step's last one only up to the budget)
    steps_by_tier: Counter = field(default_factory=Counter)  # batch steps by the policy's tier index (0: plain)
    row_steps_by_tier: Counter = field(default_factory=Counter)  # the same, counted per row (as the engine reports)

    @property
    def tokens_per_cost(self) -> float:
        return self.tokens / self.cost if self.cost else 0.0

    @property
    def mean_accept_length(self) -> float | None:
        return 1 + self.accepted / self.drafted_steps if self.drafted_steps else None

    def to_dict(self, tiers) -> dict:
        names = ["plain"] + [str(t) for t in tiers]
        return {"tokens": self.tokens, "cost": round(self.cost, 4), "steps": self.steps,
                "tokens_per_cost": self.tokens_per_cost, "mean_accept_length": self.mean_accept_length,
                "steps_by_tier": {names[k]: round(v / self.steps, 4) for k, v in sorted(self.steps_by_tier.items())}}


def simulate(policy, traces: dict, prompt_lens: list[int], new_tokens: list[int], batch: int, cost=None,
             buckets: bool = False, first_drafts: bool = False, host_us: tuple[float, float] = (0.0, 0.0)) -> SimResult:
    """Serve every request (prompt i: new_tokens[i] tokens, the first from its prefill) with at
    most `batch` rows at once, a finished row taking the next request, each step's tier chosen by
    `policy` (None: plain decoding every step) and priced by `cost.step(b, kv, tier, context)` at
    the rows' mean context (default: the static model, which has no context term). buckets: price
    and choose at the engine's graph buckets (powers of two), as it does on a GPU, the policy told
    the mean context rounded as the engine rounds it. traces: `tier_traces` of (at least) the policy's tiers. first_drafts: the
    drafter tells its first draft in a plain step (`Abilities.first_draft`), so a batch of at most
    FIRST_DRAFT_ROWS rows observes it there, as the engine's does. host_us (drafting, plain): the
    host's time a step beyond the card's, in microseconds a row (reading and emitting each row's
    tokens; on an H200 at batch 64 about 12 us a row for the assisted chains' steps and 2 for
    plain ones, docs/benchmarks.md), added to every step's cost and told to the policy as the
    engine tells it the steps' pace. The result's steps_by_tier counts by the policy's tier index
    (0: plain)."""
    cost = cost or StaticCost()
    tiers = policy.tiers if policy is not None else []
    # a chain's trace: its first draft was accepted where it accepted any
    chain = next((t for t in tiers if t.topk == 1), None) if first_drafts else None
    res = SimResult()
    todo = deque(range(len(new_tokens)))
    active: list[list] = []  # [request, tokens emitted, the policy's record]
    last = None  # the (tier, batch bucket) of the step before

    def leave():  # the requests that are done free their rows
        for r in [r for r in active if r[1] >= new_tokens[r[0]]]:
            active.remove(r)
            if policy is not None:
                policy.release(r[2])

    while todo or active:
        leave()  # done at the last step: the row takes the next request now, as the engine's does
        while todo and len(active) < batch:
            i = todo.popleft()
            active.append([i, 1, policy.new_row() if policy is not None else None])
            res.tokens += 1  # the prefill's token
        leave()  # a one-token answer: done at its prefill
        if not active:
            continue
        n = len(active)
        b = min(next_pow2(n), batch) if buckets else n
        # the context each entry's step reads, as the engine's: the rows' context, then the step's
        # own tree (a plain step the root alone)
        context = max(prompt_lens[i] + e for i, e, _ in active)
        kvs = [max(next_pow2(need), 128) if buckets else need
               for need in [context + 1] + [context + t.num_draft + 1 for t in tiers]]
        # priced at the rows' mean context, as the engine prices and a measured profile times a step
        # (rounded as the engine rounds it for the policy)
        mean = sum(prompt_lens[i] + e for i, e, _ in active) / n
        hint = context_hint(mean, kvs[-1]) if buckets else mean
        # no request waits once the last one is in: the batch drains, as generate()'s does
        tier = policy.choose([(slot, tiers[-1].steps) for _, _, slot in active], b, kvs,
                             draining=not todo, context=hint) if policy is not None else 0
        if policy is not None:
            policy.launched(tier)
        step = cost.step(b, kvs[tier], tiers[tier - 1] if tier else None, mean) + n * host_us[0 if tier else 1] / 1000.0
        res.cost += step
        if (host_us[0] or host_us[1]) and policy is not None and hasattr(policy, "paced"):
            if last == (tier, b):  # two steps of one tier and bucket in a row: their spacing, as the engine reads it
                policy.paced(tier, b, step)
            last = (tier, b)
        res.steps += 1
        res.steps_by_tier[tier] += 1
        res.row_steps_by_tier[tier] += n
        seen = ([], [], [])
        firsts = ([], []) if chain is not None and not tier and b <= FIRST_DRAFT_ROWS else None
        for r in active:
            i, emitted, slot = r
            got = traces[tiers[tier - 1]][i][emitted - 1] if tier else 0
            if firsts is not None and emitted - 1 < len(traces[chain][i]):
                firsts[0].append(slot)
                firsts[1].append(int(traces[chain][i][emitted - 1] > 0))
            room = new_tokens[i] - emitted
            step_tokens = min(got + 1, room)
            r[1] += step_tokens
            res.tokens += step_tokens
            if tier:
                res.drafted_steps += 1
                res.accepted += step_tokens - 1
                for kept, value in zip(seen, (slot, tiers[tier - 1].steps, got)):
                    kept.append(value)
        if tier and policy is not None:
            policy.observe(seen[0], tier, seen[1], seen[2])
        if firsts and firsts[0]:
            policy.observe_first(*firsts)
    return res


def grid(spec: list[str]) -> list[dict]:
    """["window=8,16", "prior_weight=1,2"] -> every combination as a dict of settings."""
    axes = []
    for item in spec:
        name, _, values = item.partition("=")
        if name not in POLICY_SETTINGS or not values:
            raise ValueError(f"--grid {item!r}: expected NAME=V1,V2,... with NAME one of {', '.join(POLICY_SETTINGS)}")
        axes.append([(name, setting_value(name, v, "--grid")) for v in values.split(",")])
    return [dict(c) for c in itertools.product(*axes)] if axes else [{}]


def stream_order(n: int, stream: int, order: int, orders: int) -> list[int]:
    """The requests of one replay: each of n prompts `stream` times, in the prompts' own order where
    there is one order, else shuffled by a generator seeded with the order's index (the same on
    every machine)."""
    import random

    idx = [i % n for i in range(n * stream)]
    if orders > 1:
        random.Random(order).shuffle(idx)
    return idx


def compare(tiers, traces, prompt_lens, new_tokens, batch_sizes, cost=None, buckets=False, settings_grid=({},),
            fixed_trees=None, first_drafts: bool = False, stream: int = 1, orders: int = 1,
            warmup: bool = False, host_us: tuple[float, float] = (0.0, 0.0)) -> list[dict]:
    """Per batch size: ar, a fixed policy at each of `fixed_trees` (default: the largest tier) and
    adaptive over `tiers` at every settings combination; each row with its speed relative to ar.
    stream R: each prompt R times, so a batch refills from a queue as a server's does; orders K: K
    shuffled orders of those requests, each row naming its order (the adaptive policy's choices follow
    the records its early steps leave, so one order is one path); warmup: each adaptive policy serves
    the requests once before the pass that is counted, as a benchmark's warm-up run leaves it;
    host_us: as `simulate`'s, for every policy."""
    rows = []
    fixed_trees = fixed_trees if fixed_trees is not None else [tiers[-1]]
    for order in range(orders):
        idx = stream_order(len(prompt_lens), stream, order, orders)
        tr = {t: [v[i] for i in idx] for t, v in traces.items()}
        lens, news = [prompt_lens[i] for i in idx], [new_tokens[i] for i in idx]
        for b in batch_sizes:
            base = simulate(None, tr, lens, news, b, cost, buckets, host_us=host_us)
            cands = [("ar", {}, None, base, [])]
            for tree in fixed_trees:
                cands.append(("fixed", {}, str(tree), simulate(FixedPolicy(tree), tr, lens, news, b, cost, buckets,
                                                               host_us=host_us), [tree]))
            for s in settings_grid:
                pol = AdaptivePolicy(list(tiers), cost or StaticCost(), **s)
                if warmup:
                    simulate(pol, tr, lens, news, b, cost, buckets, first_drafts, host_us)
                cands.append(("adaptive", s, None, simulate(pol, tr, lens, news, b, cost, buckets, first_drafts, host_us),
                              tiers))
            for name, s, tree, r, used in cands:
                rows.append({"batch": b, "order": order, "policy": name, "tree": tree, "settings": s, **r.to_dict(used),
                             "speedup_vs_ar": r.tokens_per_cost / base.tokens_per_cost if base.tokens_per_cost else math.nan})
    return rows


def static_cost(spec: list[str]) -> StaticCost:
    """StaticCost with NAME=V parameters (saturation_tokens, draft_depth_cost)."""
    cost = StaticCost()
    for item in spec:
        name, _, value = item.partition("=")
        if name not in ("saturation_tokens", "draft_depth_cost") or not value:
            raise ValueError(f"--static {item!r}: expected saturation_tokens=N or draft_depth_cost=X")
        setattr(cost, name, int(value) if name == "saturation_tokens" else float(value))
    return cost


def rank_settings(rows: list[dict]) -> list[dict]:
    """Each adaptive setting's tokens per cost over the best fixed tree's, by batch size (the mean
    over the replay's orders; `by_batch_worst`: the worst order), and the worst of those over batch
    sizes and orders (best worst case first): how settings are chosen on the validation split."""
    best = {}
    for r in rows:
        if r["policy"] == "fixed":
            k = (r["batch"], r.get("order", 0))
            best[k] = max(best.get(k, 0.0), r["tokens_per_cost"])
    out = {}
    for r in rows:
        k = (r["batch"], r.get("order", 0))
        if r["policy"] == "adaptive" and best.get(k):
            key = json.dumps(r["settings"], sort_keys=True)
            out.setdefault(key, {"settings": r["settings"], "ratios": {}})["ratios"].setdefault(r["batch"], []).append(
                r["tokens_per_cost"] / best[k])
    ranked = []
    for v in out.values():
        ratios = v.pop("ratios")
        v["by_batch"] = {b: sum(x) / len(x) for b, x in ratios.items()}
        v["by_batch_worst"] = {b: min(x) for b, x in ratios.items()}
        v["worst"] = min(v["by_batch_worst"].values())
        ranked.append(v)
    return sorted(ranked, key=lambda v: -v["worst"])


def load_answers(path, key: dict, answer) -> dict:
    """The traces file at `path` (JSON, gzip where it ends in .gz: the run's key, prompts, answers,
    traces by tier), or a new one from `answer()` -> (prompts, answers), saved at once (a run cut
    short keeps its answers); a file of another run (split, prompts, head, tokens) is refused."""
    from specheads.files import read_text, write_text

    if path is not None and Path(path).exists():
        data = json.loads(read_text(path))
        if data.get("key") != key:
            raise ValueError(f"traces file {str(path)!r} belongs to another run ({data.get('key')}, not {key}): "
                             f"pass a new --traces path")
        return data
    prompts, answers = answer()
    data = {"key": key, "prompts": prompts, "answers": answers, "traces": {}}
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(data))
    return data


def add_traces(path, data: dict, tiers, trace) -> dict:
    """Trace the tiers `data` lacks (`trace(tiers, prompts, answers)`), one at a time, saving the
    file after each (a run cut short keeps the tiers it finished)."""
    from specheads.files import write_text

    for t in [t for t in tiers if str(t) not in data["traces"]]:
        data["traces"].update({str(k): v for k, v in trace([t], data["prompts"], data["answers"]).items()})
        if path is not None:
            write_text(path, json.dumps(data))
    return data


def load_or_trace(path, key: dict, tiers, answer, trace) -> dict:
    """`load_answers`, then `add_traces`: every tier's traces of the run `key` names."""
    return add_traces(path, load_answers(path, key, answer), tiers, trace)


def measure_profile(path, models, tiers, max_batch: int, max_len: int, draft: str) -> None:
    """Time every tier's step (and the plain step) at every batch and context bucket up to these,
    as an adaptive engine does at a server's start, and save the profile at `path` (CUDA only)."""
    from specheads.runtime.engine import SpecEngine

    if not torch.cuda.is_available():
        raise ValueError(f"--profile {str(path)!r} does not exist, and step costs are measured on a GPU only "
                         f"(leave --profile out for the static cost model)")
    target, _, head = models()
    full = tiers[-1]
    engine = SpecEngine(target, head, method=method_of(head, draft), num_steps=full.steps, topk=full.topk,
                        num_draft_tokens=full.num_draft, max_batch=max_batch, max_len=max_len,
                        speculation_policy="adaptive", speculation_tiers=";".join(map(str, tiers)),
                        speculation_profile=str(path))
    engine.capture_common(range(1, max_batch + 1))
    print(f"{engine.graph_summary()}; profile saved to {path}", flush=True)


def main(argv=None) -> int:
    import argparse

    from specheads.drafters import method_names

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", required=True, help="a head folder or hub id (its kind drafts), or a method that "
                    "drafts without a head (" + ", ".join(m for m in method_names() if headless(m)) + ")")
    ap.add_argument("--method", default=None, help="the drafting method (default: the head's kind); KIND+ngram: "
                    "with the n-gram assist, --tiers in the assisted engine's terms (e.g. '1,1,1;2,1,2;4,1,4;15,4,15')")
    ap.add_argument("--head-tree", default=",".join(map(str, DEFAULT_TREE)), help="S,K,N: the head's own tree under the n-gram assist")
    ap.add_argument("--split", default="validation", choices=["validation", "test"])
    ap.add_argument("--categories", nargs="+", default=None)
    ap.add_argument("--limit", type=int, default=8, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tiers", default="1,1,1;2,1,2;4,1,4;6,4,15", help="S,K,N;... the adaptive policy's trees; "
                    "the largest is the engine's tree")
    ap.add_argument("--fixed", default=None, help="S,K,N;... trees to compare as fixed policies (default: each tier)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--profile", default=None, help="a measured speculation profile (JSON) of the card, measured "
                    "here first where the file does not exist (GPU); default: the static cost model")
    ap.add_argument("--grid", nargs="*", default=[], metavar="NAME=V1,V2", help=f"adaptive settings to compare "
                    f"({', '.join(POLICY_SETTINGS)})")
    ap.add_argument("--static", nargs="*", default=[], metavar="NAME=V",
                    help="the static cost model's parameters where no --profile is given, e.g. saturation_tokens=64 "
                         "draft_depth_cost=0.07 (one --static set a run; default: StaticCost's)")
    ap.add_argument("--traces", default=None, help="keep the answers and acceptance traces in this JSON file "
                    "(reused by later runs of the same prompts and head; missing tiers are traced and added; "
                    "gzip-compressed where the name ends in .gz)")
    ap.add_argument("--first-drafts", choices=["auto", "off"], default="auto",
                    help="auto: a small batch's plain steps observe the first draft where --draft's drafter tells it "
                         "(the device n-gram's), as the engine does; off: they observe nothing (the engine before)")
    ap.add_argument("--stream", type=int, default=1, metavar="R",
                    help="each prompt R times, so wide batches refill from a queue as a server's do (default 1)")
    ap.add_argument("--orders", type=int, default=1, metavar="K",
                    help="K shuffled orders of the requests, reported by their mean and worst (default 1: as listed)")
    ap.add_argument("--warmup", action="store_true",
                    help="each adaptive policy serves the requests once before the counted pass, as a benchmark's "
                         "warm-up run leaves it")
    ap.add_argument("--host-us", type=float, nargs=2, default=(0.0, 0.0), metavar=("DRAFTING", "PLAIN"),
                    help="the host's time a step beyond the card's, in microseconds a row, for drafting and for "
                         "plain steps (default 0 0: the graphs' times alone; an H200 at batch 64: about 12 and 2)")
    ap.add_argument("--out", default="policy_sim")
    args = ap.parse_args(argv)
    if args.stream < 1 or args.orders < 1:
        raise ValueError(f"--stream {args.stream} and --orders {args.orders}: each must be at least 1")

    from specheads.runtime.policy import SpeculationProfile, check_tier, parse_tiers

    out = Path(args.out).with_suffix(".json")
    for name, other in (("--traces", args.traces), ("--profile", args.profile)):
        if other is not None and Path(other).resolve() == out.resolve():
            raise ValueError(f"{name} {other!r} is the report --out {args.out!r} writes: give them different names")

    order = lambda t: (t.num_draft, t.steps, t.topk)  # noqa: E731
    tiers = sorted(parse_tiers(args.tiers), key=order)
    for t in tiers:  # as an engine whose tree is the largest tier would take them
        check_tier(t, tiers[-1], trees=True)
    fixed = sorted(parse_tiers(args.fixed), key=order) if args.fixed else list(tiers)
    deepest = max(t.steps for t in tiers + fixed)
    key = {"split": args.split, "categories": args.categories, "limit": args.limit,
           "max_new_tokens": args.max_new_tokens, "draft": str(args.draft), "target": str(args.target)}
    if args.method:  # (traces of the head alone keep their key: files made before --method still load)
        key.update(method=args.method, head_tree=args.head_tree)
    loaded = {}

    def models():
        if not loaded:
            from specheads.heads.format import load_head
            from specheads.target.loader import load_target

            device = "cuda" if torch.cuda.is_available() else "cpu"
            dtype = torch.bfloat16 if device == "cuda" else torch.float32
            target, tok, _ = load_target(args.target, dtype=dtype, device=device)
            head = None if headless(args.draft) else load_head(args.draft, device=device, dtype=dtype)
            loaded.update(target=target, tok=tok, head=head)
        return loaded["target"], loaded["tok"], loaded["head"]

    def answer():
        from specheads.evaluation.run import contexts
        from specheads.evaluation.suite import load_suite
        from specheads.runtime.engine import SpecEngine
        from specheads.runtime.sampling import SamplingParams
        from specheads.target.chat import stop_token_ids

        target, tok, _ = models()
        ctx = contexts(target, tok, load_suite(args.split, args.categories, limit=args.limit), args.max_new_tokens,
                       3072)
        # 16 tokens past the budget, so a step near the end is scored as the engine scores it (the
        # budget cuts the count); the first max_new_tokens of a greedy answer are the shorter answer
        extra = max(16, deepest + 1)
        engine = SpecEngine(target, method="ar", max_len=max(len(c) for c in ctx) + args.max_new_tokens + extra + 1,
                            max_batch=8)
        longer = [r.token_ids for r in engine.generate(
            ctx, SamplingParams(max_new_tokens=args.max_new_tokens + extra), stop_token_ids(tok))]
        print(f"{len(ctx)} prompts answered", flush=True)
        return ctx, longer

    def trace(todo, prompts, longer):
        target, _, head = models()
        print(f"tracing {', '.join(map(str, todo))} over {len(prompts)} answers", flush=True)
        return tier_traces(target, head, method_of(head, args.draft, args.method), todo, prompts, longer,
                           head_tree=tuple(int(x) for x in args.head_tree.split(",")))

    # answers, then the card's step costs (a minute or two), then the traces (the longest part), each
    # saved as it is done: a run cut short by a time limit keeps what it finished for the next
    data = load_answers(args.traces, key, answer)
    if args.profile and not Path(args.profile).exists():
        measure_profile(args.profile, models, tiers, max(args.batch_sizes),
                        max(len(p) + len(a) for p, a in zip(data["prompts"], data["answers"])) + tiers[-1].num_draft + 2,
                        args.draft)
    data = add_traces(args.traces, data, sorted(set(tiers + fixed), key=order), trace)
    traces = {t: data["traces"][str(t)] for t in set(tiers + fixed)}
    prompt_lens = [len(c) for c in data["prompts"]]
    new_tokens = [max(min(len(a), args.max_new_tokens), 1) for a in data["answers"]]
    cost = SpeculationProfile.load(args.profile) if args.profile else static_cost(args.static)
    rows = compare(tiers, traces, prompt_lens, new_tokens, args.batch_sizes, cost, buckets=cost is not None,
                   settings_grid=grid(args.grid), fixed_trees=fixed,
                   first_drafts=args.first_drafts == "auto" and tells_first(args.draft),
                   stream=args.stream, orders=args.orders, warmup=args.warmup, host_us=tuple(args.host_us))
    print(f"{'batch':>5} {'order':>5} {'policy':>8} {'tree / settings':>40} {'accept':>6} {'x ar':>6}  steps by tier")
    for r in rows:
        what = r["tree"] or (" ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults")
        acc = f"{r['mean_accept_length']:.2f}" if r["mean_accept_length"] else "-"
        print(f"{r['batch']:>5} {r['order']:>5} {r['policy']:>8} {what:>40} {acc:>6} {r['speedup_vs_ar']:>6.3f}  "
              f"{r['steps_by_tier']}")
    ranking = rank_settings(rows)
    print("adaptive settings by their worst ratio to the best fixed tree over the batch sizes"
          + (" and orders (mean / worst order):" if args.orders > 1 else ":"))
    for r in ranking[:10]:
        what = " ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults"
        cells = ", ".join(f"b{b} {x:.3f}" + (f" / {r['by_batch_worst'][b]:.3f}" if args.orders > 1 else "")
                          for b, x in r["by_batch"].items())
        print(f"  {what:>40}: worst {r['worst']:.3f}  ({cells})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**key, "prompts": len(prompt_lens), "stream": args.stream, "orders": args.orders,
                               "host_us": list(args.host_us),
                               "warmup": args.warmup, "tiers": [str(t) for t in tiers],
                               "profile": args.profile, "static": args.static, "rows": rows, "ranking": ranking},
                              indent=1))
    png = out.with_suffix(".png")
    cats = args.categories or ["every category"]
    plot_ranking(ranking, png, f"{args.split}, {cats[0] if len(cats) == 1 else f'{len(cats)} categories'}, "
                               f"{len(prompt_lens)} prompts x {args.stream}")
    print(f"wrote {out} and {png.name}")
    return 0


def plot_ranking(ranking: list[dict], png: Path, title: str) -> None:
    """Each adaptive setting's ratio to the best fixed tree by batch size: the mean over the orders
    (solid) and the worst order (dashed), beside the 0.97 bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not ranking:
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for r in ranking[:8]:
        label = " ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults"
        batches = list(r["by_batch"])
        xs = range(len(batches))  # (one step a batch size: 1, 8, 16, 32, 64 evenly)
        line, = ax.plot(xs, [r["by_batch"][b] for b in batches], marker="o", label=label)
        ax.plot(xs, [r["by_batch_worst"][b] for b in batches], ls="--", color=line.get_color())
        ax.set_xticks(list(xs), [str(b) for b in batches])
    ax.axhline(0.97, color="grey", lw=0.8)
    ax.set_xlabel("batch")
    ax.set_ylabel("adaptive / best fixed tree")
    ax.set_title(f"replay: {title}\n(solid: the mean over the orders, dashed: the worst order)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
