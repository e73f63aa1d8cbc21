"""Tiers on the engine: the tree verified changes from step to step (a scripted policy forces
every change: full tree, smaller trees, none) and greedy output still equals plain decoding for
every drafter that drafts tiers (EAGLE-3, EAGLE-1, MTP, Medusa, a standalone draft model,
n-gram), in a batch, at the graphs' bucket shapes, with steps run ahead; seeded sampling and
log-probabilities are unchanged; the adaptive policy itself (static or loaded costs) stays exact
and decodes plainly where its costs say speculation loses; bad policy input is refused clearly."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specheads.drafters.assist import GATE_CHAIN, GATE_LONG
from specheads.drafters.draft_model import DraftLM
from specheads.runtime.engine import EngineError, Request, SpecEngine
from specheads.runtime.policy import SpeculationProfile, TreeShape, context_hint, default_tiers
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import ar_tokens, make_target, random_head, random_prompts, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
PROMPTS = TRAIN[:5]
NEW = 28
FULL = dict(num_steps=4, topk=3, num_draft_tokens=8)
TIERS = "1,1,1;2,1,2;3,2,5"  # + the full tree 4,3,8
SCHEDULE = [4, 1, 0, 3, 2, 4, 4, 0, 1, 3]  # tier per step (0: none), round and round


class ScriptedPolicy:
    """Forces the tier of every step from a schedule (a tier change at almost every step) and
    records what the engine reported back."""

    name = "scripted"
    cost = None

    def __init__(self, tiers, schedule=SCHEDULE):
        self.tiers, self.schedule = tiers, schedule
        self.launches = 0
        self.observed = []

    def new_row(self):
        return object()

    def release(self, row):
        pass

    def observe(self, rows, tier, offered, accepted):
        self.observed += [(tier, o, a) for o, a in zip(offered, accepted)]

    def choose(self, rows, batch, kv, host_ms=0.0, draining=False, context=None):
        return self.schedule[self.launches % len(self.schedule)]

    def launched(self, tier):
        self.launches += 1


def scripted(full: TreeShape, tiers=TIERS, schedule=SCHEDULE) -> ScriptedPolicy:
    from specheads.runtime.policy import resolve_tiers

    return ScriptedPolicy(resolve_tiers(tiers, full, trees=full.topk > 1, can_tier=True), schedule)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, NEW)


HEADS = {"eagle3": {}, "eagle": {}, "mtp": dict(num_modules=4), "medusa": dict(num_heads=4, steps=100)}


@pytest.fixture(scope="module")
def heads(target):
    return {kind: train_head(target, TRAIN, kind=kind, **kw) for kind, kw in HEADS.items()}


def drafter_args(method, target, heads):
    """(head, method, tree) of each drafter that drafts tiers."""
    if method == "draft_model":  # the target itself as its draft: drafts accepted deep, state must follow
        return DraftLM(copy.deepcopy(target)), None, FULL
    if method.startswith("ngram"):  # ngram (on the device) and ngram-host
        return None, method, dict(num_draft_tokens=5)
    return heads[method], None, FULL


def tiers_for(method):
    return "1,1,1;2,1,2;4,1,4" if method.startswith("ngram") else TIERS


def run(engine, prompts, params, max_batch):
    """Requests joining as rows free up; each one's tokens and the tiers its steps verified."""
    todo, got, trees, order = list(prompts), {}, {}, []
    while todo or engine.has_work:
        while todo and engine.free_slots:
            h = engine.add(Request(todo.pop(0), params))
            got[h], trees[h] = [], []
            order.append(h)
        for out in engine.step():
            got[out.handle] += out.new_tokens
            if not out.prefill:
                trees[out.handle].append((out.draft_tree, out.accepted))
    return [got[h] for h in order], [trees[h] for h in order]


@pytest.mark.parametrize("method", ["eagle3", "eagle", "mtp", "medusa", "draft_model", "ngram", "ngram-host"])
@pytest.mark.parametrize("max_batch", [1, 3])
def test_greedy_output_equals_ar_while_the_tier_changes(target, heads, reference, method, max_batch):
    head, name, tree = drafter_args(method, target, heads)
    engine = SpecEngine(target, head, method=name, max_len=64, max_batch=max_batch, **tree)
    policy = engine.policy = scripted(engine.full_tree, tiers_for(method))
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), max_batch)
    assert tokens == reference
    seen = {t for steps in trees for t, _ in steps}
    assert seen == {None, *policy.tiers}  # every tier ran, and plain steps
    if not method.startswith("ngram"):  # drafts accepted under the smaller trees too, up to their depth
        small = [(t, a) for steps in trees for t, a in steps if t is not None and t != policy.tiers[-1]]
        assert any(a > 0 for _, a in small) and all(a <= t.steps for t, a in small)
    # each step tells what it offered: its tier's depth, at most its drafts; a gated step (the assist's
    # full tier at batch 1) its longer chain's
    full = len(policy.tiers)
    assert policy.observed and all(
        offered == min(policy.tiers[t - 1].steps, policy.tiers[t - 1].num_draft)
        or (t == full and offered == engine.widest_nodes - 1) for t, offered, _ in policy.observed)


@pytest.mark.parametrize("method", ["eagle3", "draft_model", "ngram", "ngram-host"])
@pytest.mark.parametrize("buckets", [False, True], ids=["exact", "buckets"])
def test_tiers_with_steps_run_ahead_and_at_bucket_shapes(target, heads, reference, method, buckets):
    """The graphs' shapes (padded batches) and overlapped steps (a host drafter's plain steps run
    ahead too): the output stays the target's."""
    head, name, tree = drafter_args(method, target, heads)
    engine = SpecEngine(target, head, method=name, max_len=64, max_batch=4, **tree)
    engine.buckets = buckets
    engine.policy = scripted(engine.full_tree, tiers_for(method), schedule=[0, 0, 3, 0, 1, 0, 0, 2])
    ahead = []
    launch = engine._launch
    engine._launch = lambda ahead=0, plan=None, _log=ahead: _log.append(ahead) or launch(ahead=ahead, plan=plan)
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference
    assert ahead.count(1) >= 3


def test_rows_near_their_budget_run_ahead(target, heads, reference):
    """A row that reaches its token budget in the step in flight runs one step too many, dropped
    as after a stop: rows within the full tree's depth of their budget still run ahead (before,
    one such row of the batch stopped every step from running ahead), the output stays the
    target's, and nothing is left in flight once every request is done."""
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=4, **FULL)
    engine.policy = scripted(engine.full_tree, schedule=[0, 0, 1, 0, 4])
    near = []
    launch = engine._launch

    def logged(ahead=0, plan=None):
        if ahead:
            near.append(any(r.emitted + engine.depth + 1 >= r.budget for r in engine.rows))
        return launch(ahead=ahead, plan=plan)

    engine._launch = logged
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference
    assert sum(near) >= 3  # launched ahead where the largest tree's reserve would have forbidden it
    assert engine._inflight is None and not engine.has_work


def test_no_step_runs_ahead_past_the_cache(target, heads):
    """Answers that end at the cache's end: a step runs ahead only where every row's cache holds
    it after the step in flight (its depth + 1 tokens, then the full tree), and the output is the
    target's."""
    new = 20
    max_len = max(len(p) for p in PROMPTS) + new  # the longest prompt's answer fills its cache
    params = SamplingParams(max_new_tokens=new)
    want = [r.token_ids for r in SpecEngine(target, method="ar", max_len=max_len).generate(PROMPTS, params)]
    engine = SpecEngine(target, heads["eagle3"], max_len=max_len, max_batch=4, **FULL)
    engine.policy = scripted(engine.full_tree, schedule=[0, 4, 1, 4])
    launch, ahead_at_end = engine._launch, []

    def logged(ahead=0, plan=None):
        if ahead:
            current = engine._inflight_depth
            most = max(r.committed for r in engine.rows) + current + 1 + engine.tree_nodes + 1
            assert most <= engine.cap, (most, engine.cap)
            ahead_at_end.append(most > engine.cap - 2 * (engine.depth + 1))
        out = launch(ahead=ahead, plan=plan)
        engine._inflight_depth = engine.policy.tiers[out.tier - 1].steps if out.tier else 0
        return out

    engine._launch = logged
    tokens, _ = run(engine, PROMPTS, params, 4)
    assert tokens == want
    assert any(ahead_at_end)  # some step ran ahead within two steps of a cache's end


@needs_triton
@pytest.mark.parametrize("method", ["eagle3", "eagle", "draft_model", "ngram"])
def test_tier_changes_on_the_triton_kernels(target, heads, reference, method, monkeypatch):
    """The draft loop's, verify's and commit's Triton kernels (interpreted) at every tier's shapes,
    and plain steps' keep-up after a drafting step (wide) and after a plain one (narrow)."""
    interpret_triton(monkeypatch)
    head, name, tree = drafter_args(method, target, heads)
    engine = SpecEngine(target, head, method=name, max_len=64, max_batch=2, **tree)
    engine.policy = scripted(engine.full_tree, tiers_for(method), schedule=[1, 0, 0, 2, 3, 4])
    tokens, trees = run(engine, PROMPTS[:2], SamplingParams(max_new_tokens=12), 2)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert tokens == [r[:12] for r in reference[:2]]
    assert len({t for steps in trees for t, _ in steps}) >= 4


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_seeded_sampling_and_logprobs_are_unchanged_by_the_tier(target, heads, method):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_new_tokens=16)
    plain = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    head, name, tree = drafter_args(method, target, heads)
    engine = SpecEngine(target, head, method=name, max_len=64, max_batch=2, **tree)
    engine.policy = scripted(engine.full_tree)

    def sample(e):
        out = {}
        handles = [e.add(Request(p, params, top_logprobs=2)) for p in PROMPTS[:2]]
        while e.has_work:
            for o in e.step():
                out.setdefault(o.handle, []).extend(zip(o.new_tokens, o.logprobs))
        return [out[h] for h in handles]

    want, got = sample(plain), sample(engine)
    assert [[t for t, _ in r] for r in got] == [[t for t, _ in r] for r in want]
    for g, w in zip(got, want):
        for (_, (lp, top)), (_, (lp_w, top_w)) in zip(g, w):
            assert lp == pytest.approx(lp_w, abs=1e-4) and [t for t, _ in top] == [t for t, _ in top_w]


def test_the_adaptive_policy_is_exact_and_switches_tiers(target, heads, reference):
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=3, speculation_policy="adaptive",
                        speculation_tiers=TIERS, **FULL)
    assert engine.policy.name == "adaptive" and type(engine.policy.cost).__name__ == "StaticCost"
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    assert len({t for steps in trees for t, _ in steps}) >= 2
    # every row's record went back when it left (finished, or aborted while waiting or running)
    waiting = engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=NEW)))
    engine.abort(waiting)
    running = engine.add(Request(PROMPTS[1], SamplingParams(max_new_tokens=NEW)))
    engine.step()
    engine.abort(running)
    assert sorted(engine.policy._free) == list(range(len(engine.policy.mean)))


def cpu_profile(engine, verify_ms_per_token: float) -> SpeculationProfile:
    """A made-up profile of this engine's tiers for the cpu: plain steps cost 1 ms; a tier costs
    verify_ms_per_token for every token it verifies per row, above the plain step."""
    p = SpeculationProfile("cpu", engine._fingerprint())
    for b in (1, 2, 4):
        for kv in (64, 128):
            p.add(None, b, kv, 1.0)
            for t in engine.policy.tiers:
                p.add(t, b, kv, 1.0 + verify_ms_per_token * b * t.num_draft)
    return p


def test_a_loaded_profile_where_speculation_loses_decodes_plainly(target, heads, reference, tmp_path):
    probe = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=3, speculation_policy="adaptive", **FULL)
    path = tmp_path / "costs.json"
    cpu_profile(probe, verify_ms_per_token=5.0).save(path)
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=3, speculation_policy="adaptive",
                        speculation_profile=path, speculation_settings="probe_every=1000000000", **FULL)
    assert engine.policy.cost.measured
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    assert all(t is None for steps in trees for t, _ in steps)  # every step a plain decode step
    cheap = tmp_path / "cheap.json"
    cpu_profile(probe, verify_ms_per_token=0.0).save(cheap)
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=3, speculation_policy="adaptive",
                        speculation_profile=cheap, **FULL)
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    assert all(t is not None for steps in trees for t, _ in steps)  # drafting costs nothing here


def test_policy_input_errors_name_the_input(target, heads, tmp_path):
    head = heads["eagle3"]
    for kwargs, message in (
        (dict(speculation_policy="sometimes"), "speculation policy 'sometimes' is not one of fixed, adaptive"),
        (dict(speculation_policy="adaptive", speculation_tiers="5,3,8"), "tier 5,3,8 is larger than this engine's "
                                                                        "tree 4,3,8"),
        (dict(speculation_tiers="1,1,1"), "applies to --speculation-policy adaptive"),
        (dict(speculation_profile=tmp_path / "p.json"), "--speculation-profile applies to --speculation-policy "
                                                        "adaptive"),
        (dict(speculation_settings="switch_margin=0.1"), "--speculation-settings apply to --speculation-policy "
                                                         "adaptive"),
        (dict(speculation_policy="adaptive", speculation_settings="margin=0.1"), "unknown setting 'margin'; "
                                                                                "expected NAME=VALUE"),
        (dict(speculation_policy="adaptive", speculation_settings="window=0"), "window=0 must be at least 1"),
        (dict(speculation_policy="adaptive", speculation_settings="refresh=0"), "refresh=0 must be at least 1"),
        (dict(speculation_policy="adaptive", speculation_settings="prior=high"), "prior='high' is not a number"),
        (dict(speculation_policy="adaptive", speculation_settings="share_chains=2"), "share_chains=2 must be 0 or 1"),
        (dict(speculation_policy="adaptive", speculation_settings="drain=2"), "drain=2 must be 0 or 1"),
        (dict(speculation_policy="adaptive", speculation_settings="drain_quantile=1.5"),
         r"drain_quantile=1.5 must lie in \[0, 1\]"),
    ):
        with pytest.raises(EngineError, match=message):
            SpecEngine(target, head, method="eagle3", max_len=64, **FULL, **kwargs)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**SpeculationProfile("NVIDIA H200", {}).to_json()}))
    with pytest.raises(EngineError, match=f"speculation profile '{other}' was measured on 'NVIDIA H200', not this "
                                          "'cpu'"):
        SpecEngine(target, head, max_len=64, speculation_policy="adaptive", speculation_profile=other, **FULL)
    # a static tree drafts one shape: adaptive chooses between it and plain decoding
    static = SpecEngine(target, head, static_tree="0;1;0,0", max_len=64, speculation_policy="adaptive")
    assert static.policy.tiers == [static.full_tree]
    with pytest.raises(EngineError, match=r"drafts one tree only \(2,4,3\)"):
        SpecEngine(target, head, method="eagle3", static_tree="0;1;0,0", max_len=64, speculation_policy="adaptive",
                   speculation_tiers="1,1,1")


def test_default_tiers_and_no_policy_without_a_drafter(target):
    engine = SpecEngine(target, random_head(target), method="eagle3", max_len=64, speculation_policy="adaptive",
                        num_steps=6, topk=4, num_draft_tokens=15)
    assert engine.policy.tiers == default_tiers(TreeShape(6, 4, 15))
    # the n-gram assist (an EAGLE-3 head's default): the full tier reaches its ladder's depth, or its
    # gated chain's without the ladder
    assisted = SpecEngine(target, random_head(target), max_len=64, speculation_policy="adaptive",
                          num_steps=6, topk=4, num_draft_tokens=15)
    assert assisted.method == "eagle3+ngram"
    assert assisted.policy.tiers == default_tiers(TreeShape(GATE_LONG, 4, 15))
    no_ladder = SpecEngine(target, random_head(target), max_len=64, speculation_policy="adaptive",
                           num_steps=6, topk=4, num_draft_tokens=15, drafter_options={"ngram_gate_long": 0})
    assert no_ladder.policy.tiers == default_tiers(TreeShape(GATE_CHAIN, 4, 15))
    ungated = SpecEngine(target, random_head(target), max_len=64, speculation_policy="adaptive", num_steps=6,
                         topk=4, num_draft_tokens=15, drafter_options={"ngram_gate": 0})
    assert ungated.policy.tiers == default_tiers(TreeShape(15, 4, 15))  # the lookup's chain, the tree's 15
    assert SpecEngine(target, method="ar", max_len=64, speculation_policy="adaptive").policy is None
    tuned = SpecEngine(target, random_head(target), max_len=64, speculation_policy="adaptive", num_steps=6, topk=4,
                       num_draft_tokens=15, speculation_settings="switch_margin=0.15, probe_every=8")
    assert (tuned.policy.switch_margin, tuned.policy.probe_every) == (0.15, 8)
    with pytest.raises(EngineError, match="apply to a method that drafts; method ar drafts nothing"):
        SpecEngine(target, method="ar", max_len=64, speculation_policy="adaptive", speculation_tiers="1,1,1")


class _Clock:
    """torch.cuda.Event's timing, emulated with the host clock (CPU steps run synchronously)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return 1000 * (end.t - self.t)


class _EagerGraph:
    """A 'captured graph' that runs its function again at each replay (into the captured output)."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        import torch

        with torch.no_grad():
            res = self.fn()
        if isinstance(self.out, torch.Tensor):
            self.out.copy_(res)

    def pool(self):
        return None


def _eager_capture(fn, pool=None, after_warmup=None, warmups=2):
    """capture_graph's warm-ups, then a 'capture' that (as a real one) leaves no trace in the state."""
    import torch

    with torch.no_grad():
        for _ in range(warmups + 1):
            out = fn()
            if after_warmup is not None:
                after_warmup()
    return _EagerGraph(fn, out), out


def test_a_capture_runs_its_warm_ups_then_captures_once(monkeypatch):
    """capture_graph runs the work `warmups` times on a side stream (each followed by after_warmup),
    then once inside the capture; the engine passes its `capture_warmups`; none is refused."""
    import contextlib

    import torch

    from specheads.runtime import graphs

    events = []

    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def pool(self):
            return None

    @contextlib.contextmanager
    def capturing(graph, pool=None):
        events.append("capture")
        yield

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    for warmups in (1, 2, 3):
        events.clear()
        _, out = graphs.capture_graph(lambda: events.append("run") or len(events), None,
                                      lambda: events.append("undo"), warmups)
        assert events == ["run", "undo"] * warmups + ["capture", "run"] and out == 2 * warmups + 2
    with pytest.raises(ValueError, match="warm-up"):
        graphs.capture_graph(lambda: None, warmups=0)

    import specheads.runtime.engine as engine_mod

    seen = []
    monkeypatch.setattr(engine_mod, "capture_graph", lambda fn, pool, undo, warmups: seen.append(warmups) or
                        (Graph(), None))
    engine = SpecEngine.__new__(SpecEngine)
    engine._pool, engine.capture_warmups = None, 1
    engine._restorer = lambda: None
    engine._capture(1, 128, False, 0)
    assert seen == [1]


def test_costs_are_timed_on_the_step_graphs_and_saved(target, heads, reference, tmp_path, monkeypatch):
    """The engine's graph path, emulated on CPU (a replay reruns the step): each bucket's plain and
    tier steps are timed (a row's state restored after every timed replay, so the output stays the
    target's): the first bucket at once, later ones when the engine is idle, then saved to the profile path, and loaded by the next
    engine without timing anything; capture_common reports the graphs of every tier and bucket."""
    import torch

    import specheads.runtime.engine as engine_mod

    monkeypatch.setattr(engine_mod, "capture_graph", _eager_capture)
    monkeypatch.setattr(torch.cuda, "Event", _Clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    path = tmp_path / "costs.json"
    build = lambda: SpecEngine(target, heads["eagle3"], max_len=64, max_batch=4, use_graphs=True,  # noqa: E731
                               speculation_policy="adaptive", speculation_tiers=TIERS, speculation_profile=path,
                               **FULL)
    engine = build()
    assert engine._measuring and not path.exists()
    measured, busy = [], []
    real = engine._measure_costs

    def timing(b, kv):
        measured.append((b, kv))
        busy.append(len(engine.rows) + len(engine.waiting) + (engine._inflight is not None))
        real(b, kv)

    engine._measure_costs = timing
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference
    # only the first bucket (nothing timed yet) is timed while rows run, at the bucket's top alone (a
    # replay below it would write over the rows' context); it is timed again at both ends, and the
    # others for the first time, once the engine is idle (timing replays every tier's graph: a
    # stall for every running row)
    assert len(measured) > 2 and measured.count(measured[0]) == 2 and len(set(measured)) == len(measured) - 1
    assert busy[0] > 0 and busy[1:] == [0] * (len(busy) - 1)
    assert not engine._untimed
    saved = SpeculationProfile.load(path)
    assert all(saved.has(b, kv, engine.policy.tiers) for b, kv in measured)
    assert set(saved.step_ms) == {"plain", *map(str, engine.policy.tiers)}
    # each bucket is timed at its shortest and longest context too, the top's time its step time
    for b, kv in measured:
        points = saved.context_ms[str(engine.policy.tiers[-1])][b][kv]
        assert sorted(points) == engine._bucket_fills(kv) and len(points) == 2
        assert points[max(points)] == saved.step_ms[str(engine.policy.tiers[-1])][b][kv]

    again = build()  # the same prompts: a bucket the profile holds (at both ends) is not timed again
    assert again.policy.cost.step_ms == saved.step_ms and again.policy.cost.context_ms == saved.context_ms
    retimed = []
    again._measure_costs = lambda b, kv: retimed.append((b, kv))
    tokens, _ = run(again, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    # (the costs it reads decide its tiers, so it may reach a batch bucket the first run did not)
    assert tokens == reference and not set(retimed) & set(measured)

    # a tier the saved profile lacks: the engine takes the profile, times the new tier (with every
    # tier) at the first bucket it plans, and saves it beside the old ones
    wider = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=4, use_graphs=True, speculation_policy="adaptive",
                       speculation_tiers=TIERS + ";4,1,4", speculation_profile=path, **FULL)
    assert "4,1,4" not in wider.policy.cost.step_ms and wider.policy.cost.has_any(wider.policy.tiers[:1])
    tokens, _ = run(wider, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference
    assert set(SpeculationProfile.load(path).step_ms) == {"plain", *map(str, wider.policy.tiers)}

    fresh = SpecEngine(target, heads["eagle3"], method="eagle3", max_len=64, max_batch=4, use_graphs=True,
                       speculation_policy="adaptive", speculation_tiers=TIERS, **FULL)
    import gc

    gc.unfreeze()
    try:
        n = fresh.capture_common((1, 2))
        # start-up's objects are left out of the collector's later passes
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    report = fresh.graph_report
    steps = [k for k in fresh.graphs if k[0] != "prefill"]
    # per batch and context bucket: plain, each tier, the full tree, and plain after a drafting step
    assert n == len(fresh.graphs) and len(steps) == 2 * len(report["context_buckets"]) * (1 + len(TIERS.split(";")) + 2)
    assert report["tiers"] == ["1,1,1", "2,1,2", "3,2,5", "4,3,8"] and report["batch_buckets"] == [1, 2]
    assert fresh.policy.cost.has(2, report["context_buckets"][-1], fresh.policy.tiers)
    assert "captured" in fresh.graph_summary() and "graph memory" in fresh.graph_summary()
    tokens, _ = run(fresh, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference


def test_a_host_drafter_proposes_before_the_policy_chooses(target, reference):
    """n-gram under the adaptive policy: where the tokens are known the proposal comes first, a row
    it has nothing for counts one token (all such rows: a plain step), one with a shorter chain is
    capped there, the proposal itself is verified (no second lookup), the policy records only rows
    that drafted, each at most its proposal's length, and the output stays the target's."""
    engine = SpecEngine(target, method="ngram-host", num_draft_tokens=5, max_len=64, max_batch=3,
                        speculation_policy="adaptive")
    policy, drafter = engine.policy, engine.drafter
    proposals, choices, records = [], [], []
    propose, choose, observe = drafter.propose, policy.choose, policy.observe

    def proposing(ctx):
        tree = propose(ctx)
        proposals.append(list(tree.offered))
        return tree

    def choosing(rows, batch, kv, host_ms=0.0, draining=False, context=None):
        tier = choose(rows, batch, kv, host_ms, draining, context)
        choices.append((rows, tier, len(proposals)))
        return tier

    def observing(rows, tier, offered, accepted):
        records.append((tier, list(offered), list(accepted)))
        return observe(rows, tier, offered, accepted)

    drafter.propose, policy.choose, policy.observe = proposing, choosing, observing
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    fresh = [(rows, tier, proposals[n - 1]) for rows, tier, n in choices if rows and all(len(r) == 2 for r in rows
                                                                                           if r is not None)
             and n > 0 and len(proposals[n - 1]) == len(rows)]
    assert fresh, "some steps were planned with a proposal in hand"
    for rows, tier, offered in fresh:
        for r, n in zip(rows, offered):
            assert (r is None) == (n == 0) and (r is None or r[1] == min(n, 5))
        if all(n == 0 for n in offered):
            assert tier == 0  # nothing to verify anywhere: a plain step
    assert any(tier for _, tier, _ in fresh) and any(not tier for _, tier, _ in fresh)
    assert records and all(0 < o for _, offered, _ in records for o in offered)
    assert all(a <= o for _, offered, accepted in records for o, a in zip(offered, accepted))
    steps = sum(len(t) for t in trees)
    assert len(proposals) <= steps  # one lookup a planned step at most: the launch reuses it


@pytest.mark.parametrize("method", ["eagle3", "ngram", "ngram-host"])
def test_a_plain_step_reads_the_context_ar_reads(heads, method):
    """A plain step in a drafting engine verifies the root alone: its context bucket leaves room
    for the step in flight as it is (not the largest tree's depth) and for one token, as `ar`'s
    does, so it does not cross into a larger bucket (a slower graph) earlier than `ar`. Prompts of
    about 90 tokens: with the largest tree's room their steps would pass the 128-token bucket."""
    target = make_target(seed=0, vocab=VOCAB, max_positions=256)  # room past the 128 bucket (the head
    head, name, tree = drafter_args(method, target, heads)          # never drafts: its training is moot)
    prompts = random_prompts(3, VOCAB, [92, 88, 85], seed=5)
    params = SamplingParams(max_new_tokens=NEW)
    plans, outputs = {}, {}
    for key, engine in (("ar", SpecEngine(target, method="ar", max_len=200, max_batch=3)),
                        ("plain", SpecEngine(target, head, method=name, max_len=200, max_batch=3, **tree))):
        engine.buckets = True  # the graphs' shapes, run eagerly
        if key == "plain":
            engine.policy = scripted(engine.full_tree, tiers_for(method), schedule=[0])
        plan, seen = engine._plan, plans.setdefault(key, [])

        def logged(ahead, inflight=None, plan=plan, seen=seen, engine=engine):
            out = plan(ahead, inflight) if inflight is not None else plan(ahead)
            seen.append(out[1])
            return out

        engine._plan = logged
        outputs[key], _ = run(engine, prompts, params, 3)
    assert outputs["plain"] == outputs["ar"]
    assert plans["plain"] == plans["ar"] and set(plans["ar"]) == {128}


def test_each_tier_reads_its_own_context_bucket():
    """A step reads its own tree's room, not the largest tree's: the policy is offered one context
    bucket for plain decoding and one per tier (each the smallest that holds the step: the rows'
    context, what the step in flight commits, then the tier's nodes and one), the step runs at the
    chosen one's, and with contexts near the 128-token bucket's end a chain still reads 128 where
    the full tree reads the next bucket. The output stays the target's."""
    target = make_target(seed=0, vocab=VOCAB, max_positions=256)
    prompts = random_prompts(3, VOCAB, [96, 100, 90], seed=7)
    params = SamplingParams(max_new_tokens=NEW)
    want = [r.token_ids for r in SpecEngine(target, method="ar", max_len=200, max_batch=3).generate(prompts, params)]
    engine = SpecEngine(target, random_head(target), max_len=200, max_batch=3, **FULL)
    engine.buckets = True  # the graphs' shapes, run eagerly
    engine.policy = scripted(engine.full_tree, TIERS, schedule=[1, 2, 4, 3])
    tiers, offered, ran = engine.policy.tiers, [], []
    choose, plan = engine.policy.choose, engine._plan

    def choosing(rows, batch, kv, host_ms=0.0, draining=False, context=None):
        offered.append(list(kv))
        return choose(rows, batch, kv, host_ms, draining, context)

    def planned(ahead, inflight=None):
        out = plan(ahead, inflight) if inflight is not None else plan(ahead)
        ran.append((out[3], out[1], offered[-1]))
        return out

    engine.policy.choose, engine._plan = choosing, planned
    got, _ = run(engine, prompts, params, 3)
    assert got == want
    assert ran and all(len(kvs) == 1 + len(tiers) for _, _, kvs in ran)
    for tier, kv, kvs in ran:
        assert kv == kvs[tier]  # the step reads the bucket it was priced at
        assert kvs == sorted(kvs)  # (plain's room is the least, and tiers go by draft tokens)
    split = [(kvs[1], kvs[-1]) for _, _, kvs in ran if kvs[1] != kvs[-1]]
    assert split and all(small == 128 < large for small, large in split)



@pytest.mark.parametrize("method", ["eagle3", "eagle", "mtp", "medusa", "draft_model", "ngram"])
@pytest.mark.parametrize("before, plain", [(0, 1), (0, 3), (1, 1), (2, 3)])
def test_a_device_drafter_drafts_after_plain_steps_as_after_a_fresh_prompt(target, heads, method, before, plain):
    """Plain steps keep a device drafter's row state up to date (`Drafter.keep_up`): after
    `before` drafting steps and then `plain` plain ones, the tree it drafts equals the one it drafts
    at its first step for a prompt that is the same context (the prefill's state, from the whole
    context at once). A plain step right after a drafting one takes in that step's whole path (the
    wide keep-up), a later one its single entry. Before, a head's state stood still through plain
    steps and it drafted from a stale context."""
    head, name, tree = drafter_args(method, target, heads)
    prompt = PROMPTS[1]

    def draft_after(prompt, schedule, skip):
        """The tree of the drafting step after `skip` drafting ones, and the row's tokens then (the
        prompt, then every emitted token; the last is the step's root)."""
        engine = SpecEngine(target, head, method=name, max_len=64, **tree)
        engine.policy = scripted(engine.full_tree, tiers_for(method), schedule)
        engine.overlap = False  # each step planned once the one before is read: the history is the context
        trees = []
        tree_of = engine._tree

        def record(b, kv, tier, wide=0):
            t = tree_of(b, kv, tier, wide)
            if tier:
                trees.append((t.tokens.clone(), list(engine.rows[0].history)))
            return t
        engine._tree = record
        engine.add(Request(prompt, SamplingParams(max_new_tokens=40)))
        while len(trees) <= skip:
            engine.step()
        return trees[skip]

    drafted, history = draft_after(prompt, [4] * before + [0] * plain + [4] * 8, before)
    assert len(history) >= len(prompt) + before + plain + 1
    # the same context as a prompt: the tokens committed before that step's root
    fresh, again = draft_after(history[:-1], [4] * 8, 0)
    assert again == history  # the same root
    assert torch.equal(drafted, fresh)


class FirstDraftPolicy(ScriptedPolicy):
    """A scripted policy that numbers its rows' records in the order requests join and keeps
    the first-draft checks of plain steps."""

    def __init__(self, tiers, schedule):
        super().__init__(tiers, schedule)
        self.rows, self.firsts = 0, []

    def new_row(self):
        self.rows += 1
        return self.rows - 1

    def observe_first(self, rows, hits):
        self.firsts += list(zip(rows, hits))


@pytest.mark.parametrize("max_batch", [1, 3])
def test_plain_steps_check_the_device_ngram_first_draft(target, reference, max_batch):
    """In a small batch's plain steps the device n-gram tells each row's first draft and the engine
    checks it against the target's token (`observe_first`): the checks are those of the host
    lookup over the same history (a row without a match: a miss, as in a drafting step), the
    output is `ar`'s, and drafting steps tell none."""
    from specheads.drafters.ngram import NgramDrafter
    from specheads.runtime.policy import resolve_tiers

    engine = SpecEngine(target, method="ngram", max_len=64, max_batch=max_batch, num_draft_tokens=5, overlap=False)
    schedule = [0, 0, 0, 2, 0, 0, 0, 0, 3] if max_batch == 1 else [0]
    policy = engine.policy = FirstDraftPolicy(resolve_tiers(tiers_for("ngram"), engine.full_tree, trees=False,
                                                            can_tier=True), schedule)
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), max_batch)
    assert tokens == reference
    lookup = NgramDrafter(5)
    for i, (prompt, out) in enumerate(zip(PROMPTS, tokens)):
        want, j = [], 0  # j: the root's index in out (the first token came from the prefill)
        for tree, accepted in trees[i]:
            if tree is None:
                cont = lookup._lookup(list(prompt) + out[: j + 1])
                want.append(int(bool(cont) and cont[0] == out[j + 1]))
            j += accepted + 1
        got = [hit for row, hit in policy.firsts if row == i]
        assert got == want
    assert any(hit for _, hit in policy.firsts) and not all(hit for _, hit in policy.firsts)


def test_the_engine_tells_the_policy_its_steps_pace(target, heads, reference, monkeypatch):
    """Where steps have events to wait on (the card), the engine tells the policy the time between
    two steps' results of the same tier and bucket, both run ahead (AdaptivePolicy.paced); outputs
    are unchanged."""
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=3, speculation_policy="adaptive",
                        speculation_tiers=TIERS, **FULL)

    class Ready:  # a CUDA event whose step has finished
        def synchronize(self):
            pass

    launch, told, launched = engine._launch, [], []

    def with_event(ahead, **kw):
        out = launch(ahead, **kw)
        out.event = Ready()
        launched.append((out.tier, out.batch, out.ahead))
        return out

    monkeypatch.setattr(engine, "_launch", with_event)
    monkeypatch.setattr(engine.policy, "paced", lambda tier, batch, ms: told.append((tier, batch, ms)))
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    assert told and all(ms > 0 for _, _, ms in told)
    assert {(t, b) for t, b, _ in told} <= {(t, b) for t, b, ahead in launched if ahead}
    assert any(not ahead for _, _, ahead in launched)  # (a step after prefills waits: it is never timed)


def test_a_context_bucket_is_timed_at_its_shortest_and_longest_context(target, heads):
    """The rows' tokens `_measure_costs` times a bucket at: from about half the bucket (0 in the
    smallest) to the full tree's tokens filling it, also in a bucket cut at the cache's end (the
    policy carries the line through them down to the rows' mean context)."""
    engine = SpecEngine(target, heads["eagle3"], max_len=64, max_batch=2, **FULL)
    engine._allocate()
    n = engine.tree_nodes
    assert engine._bucket_fills(128) == [0, 128 - n - 1]
    assert engine._bucket_fills(2048) == [1024 - n - 1, 2048 - n - 1]
    assert engine._bucket_fills(1500) == [750 - n - 1, 1500 - n - 1]  # a cache of 1500: its last bucket
    assert context_hint(1000.5, 2048) == 1024 and context_hint(1024.2, 2048) == 1152


@pytest.mark.parametrize("method", ["eagle3", "eagle3+ngram", "eagle", "mtp"])
@pytest.mark.parametrize("max_batch", [1, 3])
def test_a_step_behind_a_smaller_tier_feeds_the_narrow_width(target, heads, reference, method, max_batch,
                                                             monkeypatch):
    """From NARROW_FEED_ROWS rows on (here: every batch), a smaller tier's step behind a plain step or a
    smaller tier's feeds the head the smaller tiers' longest path (graph variant 4), not the full
    tree's: every row holds at most that many entries pending there (checked before each such step);
    a step behind the full tree or a gated one, and the full tree's and plain steps, feed the full
    width; greedy output equals plain decoding. Drafters that do not feed at a fixed width (MTP) keep
    the one variant."""
    import specheads.runtime.engine as engine_module

    monkeypatch.setattr(engine_module, "NARROW_FEED_ROWS", 1)
    kind = method.split("+")[0]
    engine = SpecEngine(target, heads[kind], method=method if "+" in method else None, max_len=64,
                        max_batch=max_batch, **FULL)
    engine.policy = scripted(engine.full_tree, schedule=[4, 1, 0, 3, 2, 4, 4, 0, 1, 3, 3, 2, 2, 0, 0])
    inner = engine.drafter
    while hasattr(inner, "inner"):
        inner = inner.inner
    variants, step = [], engine._step

    def checked(b, kv, sampled, tier, logprobs=False, wide=0):
        variants.append((tier, wide))
        if wide == 4:  # every row's pending path fits the narrow width
            assert int(inner.pending_n[:b].max()) <= engine._narrow_width
        return step(b, kv, sampled, tier, logprobs, wide)

    engine._step = checked
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), max_batch)
    assert tokens == reference
    if kind == "mtp":
        assert engine._narrow_width is None and not any(w == 4 for _, w in variants)
        return
    # the smaller tiers 1,1,1 / 2,1,2 / 3,2,5: paths of at most 4 entries, against the full tree's 9 nodes
    assert engine._narrow_width == 4 < engine.tree_nodes
    narrow = [t for t, w in variants if w == 4]
    assert set(narrow) == {1, 2, 3}  # every smaller tier
    assert any(w == 0 and 0 < t < 4 for t, w in variants)  # and the full width behind a full-tree step
    # every graph a server captures at start: each smaller tier's narrow variant in each bucket
    narrow_keys = [k for k in engine._bucket_keys(1, 128) if len(k) == 6 and k[-1] == 4]
    assert narrow_keys == [(1, 128, False, t, False, 4) for t in (1, 2, 3)]


def test_a_wide_batch_captures_and_prices_the_narrow_feed(target, heads, reference, monkeypatch):
    """capture_common captures every smaller tier's narrow-feed variant in the batch buckets from
    NARROW_FEED_ROWS on (here 2), and the policy's costs there time the smaller tiers on it (they run
    behind smaller tiers and plain steps), the full tree on its own width; the output stays the target's."""
    import torch

    import specheads.runtime.engine as engine_mod

    monkeypatch.setattr(engine_mod, "NARROW_FEED_ROWS", 2)
    monkeypatch.setattr(engine_mod, "capture_graph", _eager_capture)
    monkeypatch.setattr(torch.cuda, "Event", _Clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    engine = SpecEngine(target, heads["eagle3"], method="eagle3", max_len=64, max_batch=4, use_graphs=True,
                        speculation_policy="adaptive", speculation_tiers=TIERS, **FULL)
    timed, measuring, step, measure = [], [], engine._step, engine._measure_costs

    def logged(b, kv, sampled, tier, logprobs=False, wide=0):
        if measuring:
            timed.append((b, tier, wide))
        return step(b, kv, sampled, tier, logprobs, wide)

    def measured(b, kv):
        measuring.append(1)
        try:
            measure(b, kv)
        finally:
            measuring.clear()

    engine._step, engine._measure_costs = logged, measured
    engine.capture_common((1, 2))
    kvs = engine.graph_report["context_buckets"]
    steps = [k for k in engine.graphs if k[0] != "prefill"]
    # per bucket: plain, the four tiers, plain after a drafting step; at batch 2 the three smaller tiers narrow
    assert len(steps) == 2 * len(kvs) * 6 + len(kvs) * 3
    assert {k for k in steps if len(k) == 6 and k[-1] == 4} == {(2, kv, False, t, False, 4) for kv in kvs
                                                                for t in (1, 2, 3)}
    # the costs' replays at batch 2: the smaller tiers' narrow variants, the full tree's and plain's own;
    # at batch 1 every tier's own
    assert {(t, w) for b, t, w in timed if b == 2} == {(0, 0), (1, 4), (2, 4), (3, 4), (4, 0)}
    assert {(t, w) for b, t, w in timed if b == 1} == {(t, 0) for t in range(5)}
    assert engine.policy.cost.has(2, kvs[-1], engine.policy.tiers)
    tokens, _ = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 4)
    assert tokens == reference
