"""scripts/bench.py's timed run: tokens/s over the wall clock, and a request's mean time from its
admission to its last token (GenerationResult.seconds), which a batch that ends together can
separate from tokens/s."""

import time

from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.helpers import load_script
from tests.runtime.spec_helpers import make_target, random_prompts


def test_a_run_times_its_requests_from_their_admission():
    bench = load_script("scripts/bench.py")
    target = make_target(seed=0, vocab=64)
    prompts = random_prompts(5, 64, [5, 3, 7, 4, 6], seed=3)
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    t0 = time.perf_counter()
    results = engine.generate(prompts, SamplingParams(max_new_tokens=10))
    wall = time.perf_counter() - t0
    assert all(0 < r.seconds <= wall for r in results)
    # five requests on two rows: the last admitted waited for a row, so it was admitted after the
    # first finished and is timed from then
    assert results[4].seconds < wall - min(r.seconds for r in results[:2]) + 1e-3
    res, outs = bench.run_ours(engine, prompts, SamplingParams(max_new_tokens=10), ())
    assert outs == [r.token_ids for r in results]
    assert 0 < res["request_s_mean"] <= res["wall_s"] and res["tokens_per_s"] > 0


def test_a_run_reports_what_may_stall_it():
    """Each timed run counts the collector's passes and the step costs timed mid-run, and hands
    the engine its own method back."""
    import gc

    bench = load_script("scripts/bench.py")
    target = make_target(seed=0, vocab=64)
    prompts = random_prompts(3, 64, [5, 3, 7], seed=3)
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a pass on every allocation: the run sees some
    try:
        res, _ = bench.run_ours(engine, prompts, SamplingParams(max_new_tokens=6), ())
    finally:
        gc.set_threshold(*threshold)
    stalls = res["stalls"]
    assert sum(stalls["gc_passes"].values()) > 0 and 0 < stalls["gc_max_ms"] <= stalls["gc_ms"]
    assert stalls["costs_timed"] == 0 and "_measure_costs" not in vars(engine)
    assert not any(isinstance(getattr(cb, "__self__", None), bench.Stalls) for cb in gc.callbacks)


def test_a_methods_profile_is_named_by_its_drafter_options_too():
    # (a run of the same method with other drafter options builds another drafter, whose profile an
    # engine refuses to share: each gets its own file, named in the characters a device call returns)
    bench = load_script("scripts/bench.py")
    plain = bench.profile_name("eagle3+ngram-tree@6,4,15", {})
    chained = bench.profile_name("eagle3+ngram-tree@6,4,15", {"ngram_gate": 1, "ngram_gate_chain": 31})
    assert plain == "eagle3_ngram-tree_6-4-15.json"
    assert chained == "eagle3_ngram-tree_6-4-15_ngram_gate-1_ngram_gate_chain-31.json" != plain
    assert all(c.isalnum() or c in "._-" for c in chained)


def test_a_run_counts_the_steps_the_card_waited_for_the_host():
    """Of the steps planned behind one in flight, those whose step in flight was already done (the
    host fell behind the card) are counted; the engine gets its own methods back. CPU steps have no
    event: a stand-in answers `query` done at every other ask."""
    bench = load_script("scripts/bench.py")
    target = make_target(seed=0, vocab=64)
    prompts = random_prompts(3, 64, [5, 3, 7], seed=3)
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    asked = []

    class Event:
        def query(self):
            asked.append(len(asked) % 2 == 1)
            return asked[-1]

        def synchronize(self):
            pass

    launch = engine._launch

    def with_event(*a, **k):
        out = launch(*a, **k)
        out.event = Event()
        return out

    engine._launch = with_event
    res, outs = bench.run_ours(engine, prompts, SamplingParams(max_new_tokens=6), ())
    stalls = res["stalls"]
    assert stalls["planned_behind"] == len(asked) > 0 and stalls["card_idle_behind"] == sum(asked) > 0
    assert stalls["launches"] >= stalls["planned_behind"]
    assert not {"_plan_ahead", "_launch", "_measure_costs"} & set(vars(engine))
    engine2 = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    assert outs == [r.token_ids for r in engine2.generate(prompts, SamplingParams(max_new_tokens=6))]


def test_interleaved_runs_take_every_method_in_turn_both_ways():
    """Interleaved (the default): each round runs every method once, even rounds forward and odd ones backward, so
    each method holds every place of the order equally often over an even number of rounds (a drift
    of the card over a cell then falls on all of them alike); a method's figures are its median run's."""
    bench = load_script("scripts/bench.py")
    orders = bench.interleaved_orders(3, 4)
    assert orders == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    assert all(sorted(o) == [0, 1, 2] for o in orders)
    places = [sum(o.index(m) for o in orders) for m in range(3)]
    assert len(set(places)) == 1  # the same mean place for every method
    runs = [({"tokens_per_s": v, "stalls": {}}, [[v]]) for v in (5.0, 9.0, 7.0)]
    res, outs = bench.median_run(runs)
    assert res["tokens_per_s"] == 7.0 and outs == [[7.0]]
    assert res["tokens_per_s_runs"] == [5.0, 9.0, 7.0]
    assert res["identical_across_repeats"] is False


def test_each_run_records_the_cards_and_hosts_clocks(monkeypatch):
    """After each timed run: the card's SM clock, temperature and power (nvidia-smi) and the host's core
    clock, so a drift over a process shows whether the machine moved; nothing where neither tells."""
    import subprocess

    bench = load_script("scripts/bench.py")

    class Done:
        stdout = "1980, 45, 120.5\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    state = bench.machine_state()  # (specheads/evaluation/machine.py, which `specheads evaluate` reads too)
    assert (state["card_sm_mhz"], state["card_temp_c"], state["card_power_w"]) == (1980.0, 45.0, 120.5)

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert not any(k.startswith("card_") for k in bench.machine_state())
    target = make_target(seed=0, vocab=64)
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    res, _ = bench.run_ours(engine, random_prompts(2, 64, [5, 3], seed=3), SamplingParams(max_new_tokens=4), ())
    assert isinstance(res["machine"], dict)
    assert bench.median_run([(res, [])])[0]["machine_runs"] == [res["machine"]]
