"""The offline policy replay (evaluation/policy_sim.py) takes the steps the engine takes: plain
decoding, a fixed tree and the adaptive policy (its choices step by step, static costs, CPU,
float32, no run-ahead), alone and in a continuous batch; and its settings grid is checked."""

from __future__ import annotations

import gzip
import json

import pytest

from specheads.drafters.assist import GATE_CHAIN, GATE_LONG
from specheads.evaluation.policy_sim import (
    compare,
    grid,
    load_or_trace,
    simulate,
    tier_traces,
)
from specheads.runtime.engine import SpecEngine
from specheads.runtime.policy import (
    AdaptivePolicy,
    FixedPolicy,
    StaticCost,
    TreeShape,
    parse_tiers,
)
from specheads.runtime.sampling import SamplingParams
from tests.runtime.spec_helpers import make_target, random_prompts, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
PROMPTS = TRAIN[:6]
NEW = 30
TIERS = parse_tiers("1,1,1;2,1,2;3,3,8")  # the last: the engine's full tree
FULL = dict(num_steps=3, topk=3, num_draft_tokens=8)


@pytest.fixture(scope="module")
def setup():
    target = make_target(seed=0, vocab=VOCAB, max_positions=128)
    head = train_head(target, TRAIN)
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=90).generate(
        PROMPTS, SamplingParams(max_new_tokens=NEW + FULL["num_steps"] + 1))]
    traces = tier_traces(target, head, "eagle3", TIERS, PROMPTS, longer)
    return target, head, traces


def engine_run(target, head, policy: str, batch: int, method: str = "eagle3", tree=FULL, **settings):
    kw = dict(speculation_policy=policy, speculation_tiers="1,1,1;2,1,2") if policy == "adaptive" else {}
    engine = SpecEngine(target, head, method=method, max_len=90, max_batch=batch, overlap=False, **tree, **kw)
    if settings:  # the adaptive policy with other settings than its defaults
        engine.policy = AdaptivePolicy(list(engine.policy.tiers), engine.policy.cost, **settings)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    by_tree = {}
    for r in results:
        for tree, n in r.steps_by_tree.items():
            by_tree[tree] = by_tree.get(tree, 0) + n
    return sum(r.steps for r in results), sum(r.accepted_tokens for r in results), by_tree


def sim_by_tree(res, tiers=TIERS) -> dict:
    names = ["none"] + [str(t) for t in tiers]
    return {names[k]: n for k, n in res.row_steps_by_tier.items()}


@pytest.mark.parametrize("batch", [1, 3])
def test_fixed_replays_the_engine(setup, batch):
    target, head, traces = setup
    steps, accepted, _ = engine_run(target, head, "fixed", batch)
    res = simulate(FixedPolicy(TIERS[-1]), traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), batch)
    assert res.drafted_steps == steps and res.accepted == accepted
    assert res.tokens == NEW * len(PROMPTS)
    assert accepted > 20, "the head should be accepted at times"


@pytest.mark.parametrize("batch", [1, 3])
def test_adaptive_replays_the_engines_choices(setup, batch):
    """The same policy code, fed the same observations in the same order, chooses the same
    trees: the counts of steps by tree equal the engine's (static costs, as on a CPU; each tier
    forced every 8 drafting steps, so that the policy changes trees in so short a run)."""
    target, head, traces = setup
    steps, accepted, by_tree = engine_run(target, head, "adaptive", batch, explore_every=8)
    res = simulate(AdaptivePolicy(list(TIERS), StaticCost(), explore_every=8), traces, [len(p) for p in PROMPTS],
                   [NEW] * len(PROMPTS), batch)
    got = sim_by_tree(res)
    assert got == by_tree
    assert res.accepted == accepted
    assert len(by_tree) >= 3, f"the policy should have changed trees: {by_tree}"


def test_plain_decoding_takes_a_step_a_token(setup):
    _, _, traces = setup
    res = simulate(None, traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), 2)
    assert res.steps == (NEW - 1) * len(PROMPTS) / 2 and res.drafted_steps == 0
    assert res.tokens == NEW * len(PROMPTS)


def test_compare_rows_and_speedups(setup):
    _, _, traces = setup
    rows = compare(TIERS, traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), [1, 4],
                   settings_grid=grid(["window=4,16"]), fixed_trees=[TIERS[0], TIERS[2]])
    assert [(r["batch"], r["policy"], r["tree"]) for r in rows[:5]] == [
        (1, "ar", None), (1, "fixed", "1,1,1"), (1, "fixed", "3,3,8"), (1, "adaptive", None), (1, "adaptive", None)]
    assert [r["settings"] for r in rows if r["policy"] == "adaptive"][:2] == [{"window": 4}, {"window": 16}]
    assert all(r["speedup_vs_ar"] == 1.0 for r in rows if r["policy"] == "ar")
    # static costs: at batch 1 a verified tree costs a plain step plus its depths' drafts
    fixed = next(r for r in rows if r["batch"] == 1 and r["tree"] == "3,3,8")
    assert fixed["speedup_vs_ar"] > 1.5


def test_a_stream_in_several_orders_with_a_warm_up(setup):
    """--stream R --orders K --warmup: every prompt R times per order, K seeded shuffles (the same
    ones on every run), one row per order, and the ranking's mean and worst over the orders."""
    from specheads.evaluation.policy_sim import rank_settings, stream_order

    _, _, traces = setup
    n = len(PROMPTS)
    assert stream_order(n, 3, 0, 1) == [i % n for i in range(3 * n)]
    orders = [stream_order(n, 3, k, 2) for k in range(2)]
    assert all(sorted(o) == sorted(i % n for i in range(3 * n)) for o in orders) and orders[0] != orders[1]
    assert stream_order(n, 3, 1, 2) == orders[1]
    rows = compare(TIERS, traces, [len(p) for p in PROMPTS], [NEW] * n, [4], settings_grid=grid(["window=4,16"]),
                   fixed_trees=[TIERS[0], TIERS[2]], stream=3, orders=2, warmup=True)
    assert sorted({r["order"] for r in rows}) == [0, 1] and len(rows) == 2 * 5
    assert all(r["tokens"] == 3 * n * NEW for r in rows)  # every request of the stream served once per pass
    ranked = rank_settings(rows)
    assert len(ranked) == 2
    for r in ranked:
        assert r["by_batch_worst"][4] <= r["by_batch"][4] and r["worst"] == r["by_batch_worst"][4]


def test_the_hosts_time_a_row_is_added_to_every_step_and_told_as_the_pace(setup):
    """host_us (drafting, plain): each step costs its rows times that many microseconds more, and a
    policy that takes the steps' pace is told the spacing of two steps of one tier in a row."""
    _, _, traces = setup
    lens, news = [len(p) for p in PROMPTS], [NEW] * len(PROMPTS)
    base = simulate(None, traces, lens, news, 2)
    slow = simulate(None, traces, lens, news, 2, host_us=(0.0, 500.0))
    assert slow.steps == base.steps and slow.cost > base.cost
    # every plain step of two rows (the batch stays full here) costs 2 x 0.5 more
    assert abs((slow.cost - base.cost) - base.steps * 2 * 0.5) < 1e-9
    told = []

    class Pacing(FixedPolicy):
        def paced(self, tier, batch, ms):
            told.append((tier, batch, ms))
    simulate(Pacing(TIERS[0]), traces, lens, news, 2, host_us=(100.0, 0.0))
    assert told and all(t == 1 and b in (1, 2) for t, b, _ in told)
    assert all(abs(ms - (StaticCost().step(b, 0, TIERS[0]) + b * 0.1)) < 1e-9 for _, b, ms in told)


def test_grid_parses_and_refuses():
    assert grid(["window=8,16", "prior_weight=1,2.5"]) == [
        {"window": 8, "prior_weight": 1.0}, {"window": 8, "prior_weight": 2.5},
        {"window": 16, "prior_weight": 1.0}, {"window": 16, "prior_weight": 2.5}]
    assert grid([]) == [{}]
    with pytest.raises(ValueError, match="NAME=V1,V2"):
        grid(["depth=3"])


def test_traces_file_keeps_answers_and_adds_missing_tiers(tmp_path):
    path = tmp_path / "traces.json"
    calls = []

    def answer():
        calls.append("answer")
        return [[1, 2]], [[3, 4, 5]]

    def trace(tiers, prompts, answers):
        calls.append(tuple(map(str, tiers)))
        return {t: [[t.steps] * 2] for t in tiers}

    key = {"split": "validation", "limit": 2}
    first = load_or_trace(path, key, TIERS[:2], answer, trace)
    again = load_or_trace(path, key, TIERS, answer, trace)
    assert calls == ["answer", ("1,1,1",), ("2,1,2",), ("3,3,8",)]
    assert again["traces"]["3,3,8"] == [[3, 3]] and again["answers"] == first["answers"] == [[3, 4, 5]]
    with pytest.raises(ValueError, match="another run"):
        load_or_trace(path, {"split": "test", "limit": 2}, TIERS, answer, trace)


@pytest.mark.parametrize("name", ["traces.json", "traces.json.gz"])
def test_a_run_cut_short_keeps_its_answers_and_finished_tiers(tmp_path, name):
    """Answers are saved before any tracing and each tier as it is traced (a GPU call's time limit
    may stop the run anywhere); a .gz name is read and written compressed."""
    path = tmp_path / name

    def trace(tiers, prompts, answers):
        if str(tiers[0]) == "2,1,2":
            raise TimeoutError("the call's time limit")
        return {t: [[t.steps] * 2] for t in tiers}

    key = {"split": "validation", "limit": 2}
    with pytest.raises(TimeoutError):
        load_or_trace(path, key, TIERS, lambda: ([[1, 2]], [[3, 4, 5]]), trace)
    kept = json.loads(gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_text())
    assert kept["answers"] == [[3, 4, 5]] and set(kept["traces"]) == {"1,1,1"}
    rest = load_or_trace(path, key, TIERS, lambda: pytest.fail("answered again"),
                         lambda tiers, p, a: {t: [[t.steps]] for t in tiers})
    assert rest["traces"] == {"1,1,1": [[1, 1]], "2,1,2": [[2]], "3,3,8": [[3]]}


def test_the_report_may_not_overwrite_the_traces(tmp_path):
    from specheads.evaluation.policy_sim import main

    with pytest.raises(ValueError, match="give them different names"):
        main(["--draft", "x", "--traces", str(tmp_path / "r.json"), "--out", str(tmp_path / "r")])


def test_settings_ranked_by_their_worst_batch(setup):
    from specheads.evaluation.policy_sim import rank_settings, static_cost

    _, _, traces = setup
    rows = compare(TIERS, traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), [1, 4],
                   static_cost(["saturation_tokens=64", "draft_depth_cost=0.07"]),
                   settings_grid=grid(["prior_weight=2,8"]), fixed_trees=list(TIERS))
    ranked = rank_settings(rows)
    assert [sorted(r["by_batch"]) for r in ranked] == [[1, 4], [1, 4]]
    assert ranked[0]["worst"] >= ranked[1]["worst"]
    best_fixed = max(r["tokens_per_cost"] for r in rows if r["batch"] == 1 and r["policy"] == "fixed")
    ada = next(r for r in rows if r["batch"] == 1 and r["settings"] == ranked[0]["settings"])
    assert ranked[0]["by_batch"][1] == pytest.approx(ada["tokens_per_cost"] / best_fixed)
    with pytest.raises(ValueError, match="saturation_tokens=N"):
        static_cost(["depth=3"])


def test_the_ranking_is_plotted(setup, tmp_path):
    """The replay writes a PNG of each setting's ratio by batch size beside its JSON."""
    from specheads.evaluation.policy_sim import plot_ranking, rank_settings, static_cost

    _, _, traces = setup
    rows = compare(TIERS, traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), [1, 4],
                   static_cost(["saturation_tokens=64"]), settings_grid=grid(["prior_weight=2,8"]),
                   fixed_trees=list(TIERS), orders=2)
    png = tmp_path / "replay.png"
    plot_ranking(rank_settings(rows), png, "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_ranking([], tmp_path / "none.png", "test")  # nothing to plot: no file
    assert not (tmp_path / "none.png").exists()


@pytest.mark.parametrize("method", ["ngram", "ngram-host"])
def test_ngram_traces_replay_the_engine(setup, method):
    """A headless drafter (the prompt lookup, `--draft ngram`) is traced without a head, and a
    fixed chain's replay takes the engine's drafting steps and accepted drafts."""
    target = setup[0]
    chain = parse_tiers("5,1,5")[0]
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=90).generate(
        PROMPTS, SamplingParams(max_new_tokens=NEW + chain.steps + 1))]
    traces = tier_traces(target, None, method, [chain], PROMPTS, longer)
    engine = SpecEngine(target, method=method, num_draft_tokens=chain.num_draft, max_len=90, max_batch=2,
                        overlap=False)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    res = simulate(FixedPolicy(chain), traces, [len(p) for p in PROMPTS], [NEW] * len(PROMPTS), 2)
    assert res.drafted_steps == sum(r.steps for r in results)
    assert res.accepted == sum(r.accepted_tokens for r in results)
    assert res.accepted > 3, "the lookup should be accepted at times"


def test_ngram_first_drafts_replay_the_engines_choices(setup):
    """The device n-gram's plain steps tell their first drafts in the engine and in the replay
    alike: the same policy code chooses the same trees (static costs, CPU, no run-ahead)."""
    target = setup[0]
    tiers = parse_tiers("1,1,1;2,1,2;5,1,5")
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=90).generate(
        PROMPTS, SamplingParams(max_new_tokens=NEW + 6))]
    traces = tier_traces(target, None, "ngram", tiers, PROMPTS, longer)
    settings = dict(prior=0.2, probe_every=64)  # mostly plain steps, whose first drafts the policy weighs
    for batch in (1, 3):
        _, accepted, by_tree = engine_run(target, None, "adaptive", batch, method="ngram",
                                          tree=dict(num_draft_tokens=5), **settings)
        lens, new = [len(p) for p in PROMPTS], [NEW] * len(PROMPTS)
        res = simulate(AdaptivePolicy(list(tiers), StaticCost(), **settings), traces, lens, new, batch,
                       first_drafts=True)
        assert sim_by_tree(res, tiers) == by_tree
        assert res.accepted == accepted
        blind = simulate(AdaptivePolicy(list(tiers), StaticCost(), **settings), traces, lens, new, batch)
        assert res.row_steps_by_tier != blind.row_steps_by_tier, "first drafts should change the choices"


def test_assisted_traces_replay_the_engine():
    """The n-gram assist (eagle3+ngram): its tiers are traced as one drafter's tiers over the head's
    own tree, and the fixed and adaptive replays take the engine's steps (a target that loops at
    times, so that the lookup's chains are drafted)."""
    target = make_target(seed=0, vocab=VOCAB, max_positions=128, std=0.2)
    head = train_head(target, TRAIN)
    tiers = parse_tiers("1,1,1;2,1,2;8,3,8")  # the assisted engine's: its full tier as deep as the chain
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=90).generate(
        PROMPTS, SamplingParams(max_new_tokens=NEW + 9))]
    traces = tier_traces(target, head, "eagle3+ngram", tiers, PROMPTS, longer, head_tree=(3, 3, 8))
    assert max(max(t) for t in traces[tiers[-1]]) > 3, "the lookup's chain should run past the head's depth"
    lens, new = [len(p) for p in PROMPTS], [NEW] * len(PROMPTS)
    for batch in (1, 3):
        steps, accepted, _ = engine_run(target, head, "fixed", batch, method="eagle3+ngram")
        res = simulate(FixedPolicy(tiers[-1]), traces, lens, new, batch)
        assert (res.drafted_steps, res.accepted) == (steps, accepted)
        _, accepted, by_tree = engine_run(target, head, "adaptive", batch, method="eagle3+ngram", explore_every=8)
        # (the assist's gate makes the engine's full tier as deep as its gated chain; without a step in
        # flight, overlap off, no step is gated, so its steps are the 8,3,8 tier's)
        by_tree = {("8,3,8" if k == f"{GATE_CHAIN},3,8" else k): v for k, v in by_tree.items()}
        res = simulate(AdaptivePolicy(list(tiers), StaticCost(), explore_every=8), traces, lens, new, batch)
        assert sim_by_tree(res, tiers) == by_tree and res.accepted == accepted
    # the full tier written as the engine names it (as deep as its ladder) or as its gated chain: the same
    # trace, the gated chain's (a trace of each root alone cannot carry the ladder, which follows the step
    # before), never a shallower tier's
    full = [TreeShape(GATE_LONG, 3, 8), TreeShape(GATE_CHAIN, 3, 8)]
    deep = tier_traces(target, head, "eagle3+ngram", full, PROMPTS, longer, head_tree=(3, 3, 8))
    assert deep[full[0]] == deep[full[1]]
    assert all(a >= b for d, t in zip(deep[full[0]], traces[tiers[-1]]) for a, b in zip(d, t))
