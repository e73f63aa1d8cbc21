"""gpu_runs/policy_steps.py's step timers wrap the engine's own methods: they must keep up with
their signatures (the script once stopped at its first step when the engine's launch took a plan)
and count every launch by tier without changing the output."""

import pytest
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.helpers import load_script
from tests.runtime.spec_helpers import make_target, random_head, random_prompts



@pytest.mark.parametrize("name", ["ar", "adaptive", "adaptive-pace", "chain2", "ngram-adaptive", "plain-ngram", "plain-eagle3",
                                  "ngram-host-adaptive", "assist-adaptive", "assist", "assist-adaptive-gated",
                                  "assist-adaptive-full", "assist-adaptive-gated-hold", "assist-chain2",
                                  "assist-chain4", "assist-adaptive-share0", "assist-adaptive-share1",
                                  "assist-adaptive-share2"])
def test_the_step_timers_follow_the_engine(name):
    steps = load_script("gpu_runs/policy_steps.py")
    target = make_target(seed=0, vocab=64)
    prompts = random_prompts(4, 64, [5, 3, 7, 4], seed=3)
    params = SamplingParams(max_new_tokens=12)
    kw = steps.METHODS[name]
    head = random_head(target) if kw["method"].startswith("eagle3") else None
    want = [r.token_ids for r in SpecEngine(target, method="ar", max_len=64).generate(prompts, params)]
    engine = steps.engine_for(name, target, head, max_len=64, max_batch=2)
    tally = steps.instrument(engine, trace=True)
    got = [r.token_ids for r in engine.generate(prompts, params)]
    assert got == want
    assert tally["n"]["launch"] == sum(tally["tiers"].values()) > 0
    assert tally["n"]["finish"] >= tally["n"]["launch"] - 1 and tally["n"]["prefill"] > 0
    assert tally["n"]["run"] >= tally["n"]["launch"]  # every launch replays (or runs) its step
    if engine.policy is not None and name != "ar":
        assert tally["n"]["choose"] > 0
    if name.startswith("plain-"):  # the policy that never drafts
        assert set(tally["tiers"]) == {0}
    if name in ("assist", "assist-adaptive-gated", "assist-adaptive-gated-hold"):  # batch 2: its gate checks the steps of one row
        assert engine.gate_rows == 1 and tally["n"]["gate"] > 0
        assert tally["n"]["gated"] == sum(s["gated"] for s in tally["steps"])
    # the trace: one entry a step read, tokens as emitted after the prefills, a choice per plan
    assert len(tally["steps"]) == tally["n"]["finish"]
    assert sum(s["tokens"] for s in tally["steps"]) == sum(len(t) for t in got) - len(prompts)
    if getattr(engine.policy, "name", None) == "adaptive" and not name.startswith("plain-"):
        assert tally["choices"] and all(len(c["rates"]) == len(engine.policy.tiers) + 1 for c in tally["choices"])
        # each choice names its launch, which is the step read at that index (launch order);
        # choice_audit.py joins them
        steps_by_i = {s["i"]: s for s in tally["steps"]}
        assert [s["i"] for s in tally["steps"]] == list(range(len(tally["steps"])))
        last = {c["i"]: c for c in tally["choices"]}  # (a dropped plan ahead is chosen again at launch)
        assert all(i in steps_by_i for i in last)
        if not engine._host_drafts:  # (a host drafter's launch with nothing proposed asks no choice)
            assert all(steps_by_i[i]["tier"] == c["tier"] for i, c in last.items())
        assert all(len(c["costs"]) == len(c["rates"]) for c in tally["choices"])


def test_the_choice_audit_sets_expected_tokens_against_emitted():
    """choice_audit.py: per tier chosen, the tokens expected (rate x cost) against those emitted,
    and the time between two steps of that tier's results."""
    audit = load_script("gpu_runs/choice_audit.py").audit
    cell = {"steps": [{"i": 0, "t_ms": 1.0, "tier": 2, "tokens": 8}, {"i": 1, "t_ms": 3.0, "tier": 2, "tokens": 4},
                      {"i": 2, "t_ms": 4.0, "tier": 1, "tokens": 3}],
            "choices": [{"i": 0, "tier": 2, "rates": [1.0, 2.0, 5.0], "costs": [1.0, 1.0, 2.0]},
                        {"i": 1, "tier": 2, "rates": [1.0, 2.0, 5.0], "costs": [1.0, 1.0, 2.0]},
                        {"i": 2, "tier": 1, "rates": [1.0, 2.0, 3.0], "costs": [1.0, 1.5, 2.0]}]}
    rows = {r["tier"]: r for r in audit(cell)}
    assert rows[2]["steps"] == 2 and rows[2]["expected_tokens"] == 10.0 and rows[2]["emitted_tokens"] == 6.0
    assert rows[2]["emitted_over_expected"] == 0.6 and rows[2]["gap_ms"] == 2.0
    assert rows[1]["expected_tokens"] == 3.0 and rows[1]["gap_ms"] is None and rows[1]["priced_ms"] == 1.5
    buckets = load_script("gpu_runs/choice_audit.py").by_bucket(
        {"steps": [{"tier": 2, "b": 64}, {"tier": 2, "b": 64}, {"tier": 1, "b": 8}, {"tier": 2, "b": 4}]})
    assert buckets == {1: {8: 1}, 2: {4: 1, 64: 2}}


def test_shuffled_orders_are_permutations_seeded_by_the_run():
    """--shuffle: each timed run its own order of every prompt, the same for a run index everywhere
    (old and new code meet the same orders), run 0 not the set's order for any useful size."""
    steps = load_script("gpu_runs/policy_steps.py")
    orders = [steps.run_order(64, r) for r in range(3)]
    assert all(sorted(o) == list(range(64)) for o in orders)
    assert orders[0] != list(range(64)) and orders[0] != orders[1] != orders[2]
    assert steps.run_order(64, 1) == orders[1]
