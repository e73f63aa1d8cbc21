"""The speculation policy on its own: tiers parsed and checked against the engine's tree, the
adaptive choice following acceptance (bigger trees while drafts are accepted, smaller or none
when they are not, a probe after a run of plain steps), the cost model choosing plain decoding
where speculation loses, and cost profiles saved, loaded and refused with a clear reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specheads.runtime.policy import (AdaptivePolicy, FixedPolicy, PolicyError, SpeculationProfile, StaticCost,
                                      TreeShape, build_policy, default_tiers, resolve_tiers)

FULL = TreeShape(6, 4, 15)
TIERS = default_tiers(FULL)


class TableCost:
    """Step costs from a function of (batch, tier): what a measured profile gives, made up."""

    measured = True

    def __init__(self, fn):
        self.fn = fn

    def step(self, batch, kv, tier, context=None):
        return self.fn(batch, tier)


def gpu_like(batch, tier):
    """A memory-bound card: a step costs 1 until the batch's tokens pass 128, then grows with them;
    each draft depth costs 0.08 (more for wide frontiers at large batches)."""
    tokens = batch * (1 + (tier.num_draft if tier else 0))
    draft = 0.08 * tier.steps * max(1.0, batch * tier.topk / 128) if tier else 0.0
    return max(1.0, tokens / 128) + draft


def observe(policy, row, tier_index, accepted, steps=20):
    tier = policy.tiers[tier_index - 1]
    for _ in range(steps):
        policy.observe([row], tier_index, [tier.steps], [min(accepted, tier.steps)])


def test_default_tiers_are_chains_then_the_full_tree():
    assert [str(t) for t in TIERS] == ["1,1,1", "2,1,2", "4,1,4", "6,4,15"]
    assert [str(t) for t in default_tiers(TreeShape(3, 1, 3))] == ["1,1,1", "2,1,2", "3,1,3"]
    assert default_tiers(TreeShape(1, 1, 1)) == [TreeShape(1, 1, 1)]


def test_tiers_are_parsed_sorted_and_end_with_the_full_tree():
    tiers = resolve_tiers("4,1,4; 1,1,1;2,1,2", FULL, trees=True, can_tier=True)
    assert [str(t) for t in tiers] == ["1,1,1", "2,1,2", "4,1,4", "6,4,15"]
    assert resolve_tiers([(3, 2, 6), (1, 1, 1)], FULL, True, True)[-1] == FULL
    assert resolve_tiers(None, FULL, trees=True, can_tier=False) == [FULL]  # a one-shape drafter


@pytest.mark.parametrize("spec, message", [
    ("", "names no tier; expected tiers as STEPS,TOPK,DRAFT_TOKENS"),
    ("1,1,x", "tier '1,1,x' is not three integers; expected tiers as STEPS,TOPK,DRAFT_TOKENS"),
    ("1,1", "tier 1,1 must be three integers >= 1"),
    ("0,1,0", "tier 0,1,0 must be three integers >= 1"),
    ("8,4,15", r"tier 8,4,15 is larger than this engine's tree 6,4,15 \(--num-steps 6 --topk 4 "
               r"--num-draft-tokens 15\), the maximum"),
    ("2,1,5", "tier 2,1,5 is a chain .* write 2,1,2"),
    ("2,2,9", "a tree 2 deep with topk 2 has 6 candidates, fewer than 9 draft tokens"),
])
def test_bad_tiers_say_what_would_be_right(spec, message):
    with pytest.raises(PolicyError, match=message):
        resolve_tiers(spec, FULL, trees=True, can_tier=True)


def test_chain_drafters_take_chain_tiers_only_and_one_shape_drafters_none():
    with pytest.raises(PolicyError, match="drafts chains only, so topk must be 1"):
        resolve_tiers("3,2,4", TreeShape(8, 1, 8), trees=False, can_tier=True)
    with pytest.raises(PolicyError, match=r"drafts one tree only \(6,4,15\)"):
        resolve_tiers("1,1,1", FULL, trees=True, can_tier=False)


def test_build_policy_names():
    assert isinstance(build_policy("fixed", FULL), FixedPolicy)
    assert build_policy("adaptive", FULL, can_tier=True).tiers == TIERS
    with pytest.raises(PolicyError, match="'sometimes' is not one of fixed, adaptive"):
        build_policy("sometimes", FULL)
    with pytest.raises(PolicyError, match="applies to --speculation-policy adaptive"):
        build_policy("fixed", FULL, tiers="1,1,1")


def test_the_tier_follows_acceptance():
    """At batch 1 (every tier verifies in one pass of the weights) the full tree pays while its
    drafts are accepted; when only the first draft is, a short chain; when none is, plain decoding."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), window=16, explore_every=0, prior_weight=2.0)  # quick to follow
    row = policy.new_row()
    assert policy.choose([(row, 6)], 1, 512) > 0  # before any observation: the prior favours drafting
    observe(policy, row, 4, accepted=6)
    assert policy.choose([(row, 6)], 1, 512) == 4  # 6,4,15
    observe(policy, row, 4, accepted=1, steps=60)  # (deeper depths, no longer reached, keep their record)
    assert policy.tiers[policy.choose([(row, 6)], 1, 512) - 1] == TreeShape(1, 1, 1)
    observe(policy, row, 4, accepted=0, steps=60)  # the chains, never run, take the row's own record
    assert policy.choose([(row, 6)], 1, 512) == 0


def test_a_smaller_tier_must_beat_the_full_tree_by_the_switch_margin():
    """With switch_margin m a chain runs instead of the full tree only where its expected rate is
    more than (1 + m) times the tree's; plain decoding is chosen as before."""
    for margin, full_kept in ((0.0, False), (10.0, True)):
        policy = AdaptivePolicy(TIERS, TableCost(gpu_like), window=16, prior_weight=2.0, switch_margin=margin)
        row = policy.new_row()
        observe(policy, row, 4, accepted=1, steps=60)
        rates = policy.rates([(row, 6)], 1, 512)
        assert int(np.argmax(rates[1:])) + 1 < 4  # a chain promises more
        assert (policy.choose([(row, 6)], 1, 512) == 4) == full_kept
        observe(policy, row, 4, accepted=0, steps=60)
        assert policy.choose([(row, 6)], 1, 512) == 0  # no drafts pay: plain, whatever the margin


def probes(policy, row, steps: int, accepted: int | None = None, twice: bool = False) -> list[int]:
    """The steps (0-based) at which the policy drafted over `steps` steps; a drafting step
    accepts `accepted` drafts where given (observed after it), else is not observed. `twice`:
    each step's plan is made twice, as for a host drafter whose plan ahead was dropped."""
    drafted = []
    for i in range(steps):
        tier = policy.choose([(row, 6)], 1, 512)
        if twice:
            tier = policy.choose([(row, 6)], 1, 512)
        policy.launched(tier)
        if tier:
            drafted.append(i)
            if accepted is not None:
                policy.observe([row], tier, [policy.tiers[tier - 1].steps], [accepted])
    return drafted


def test_the_margin_never_trades_a_tier_that_beats_plain_decoding_for_plain_decoding():
    """The switch margin prefers the full tree to a smaller tier that gains little over it, but only
    where the full tree beats plain decoding too: else the smaller tier runs (it did not, and a row
    whose full tree did not pay decoded plainly though a short chain would have paid)."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), switch_margin=0.15)
    row = policy.new_row()
    policy.rates = lambda *a, **k: np.array([1.0, 1.05, 0.5, 0.5, 0.95])  # plain, the chains, the full tree
    assert policy.choose([(row, FULL.steps)], 1, 256) == 1
    policy.rates = lambda *a, **k: np.array([1.0, 1.05, 0.5, 0.5, 1.01])  # the full tree beats plain: it runs
    assert policy.choose([(row, FULL.steps)], 1, 256) == len(TIERS)


def test_bound_trees_keeps_a_tree_estimate_at_least_the_chains():
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), bound_trees=1)
    rows = [policy.new_row() for _ in range(4)]
    policy.observe(rows, 4, [6] * 4, [0] * 4)  # the full tree: every first draft rejected, once
    for _ in range(40):
        policy.observe(rows, 3, [4] * 4, [4] * 4)  # the 4-deep chain: every draft accepted since
    q = policy.acceptance(rows)
    assert (q[:, 3, :4] >= q[:, 2, :4]).all() and (q[:, 3, 0] > 0.9).all()
    free = AdaptivePolicy(TIERS, TableCost(gpu_like))  # the default: the tree's own record
    rows = [free.new_row() for _ in range(4)]
    free.observe(rows, 4, [6] * 4, [0] * 4)
    for _ in range(40):
        free.observe(rows, 3, [4] * 4, [4] * 4)
    assert (free.acceptance(rows)[:, 3, 0] < free.acceptance(rows)[:, 2, 0]).all()


def test_a_probe_follows_a_run_of_plain_steps():
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), probe_every=4, probe_backoff=1)
    row = policy.new_row()
    for t in range(1, len(TIERS) + 1):
        observe(policy, row, t, accepted=0)
    assert probes(policy, row, 8) == [3, 7]


@pytest.mark.parametrize("twice", [False, True])
def test_probes_that_find_nothing_back_off_and_drafting_on_merit_resets_them(twice):
    """A probe after which plain decoding is still the choice doubles the run before the next
    (4, 8, 16, then 16 plain steps: probe_backoff 4 x probe_every 4); once drafts are accepted again the
    policy drafts on its merits, and the next plain run is probed after probe_every again. A
    plan made twice a step (a host drafter) doubles the run once."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), probe_every=4, probe_backoff=4)
    row = policy.new_row()
    for t in range(1, len(TIERS) + 1):
        observe(policy, row, t, accepted=0)
    assert probes(policy, row, 64, accepted=0, twice=twice) == [3, 11, 27, 43, 59]
    for t in range(1, len(TIERS) + 1):
        observe(policy, row, t, accepted=6, steps=60)
    assert policy.choose([(row, 6)], 1, 512) > 0 and policy.probe_interval == 4  # drafts pay again
    policy.launched(policy.choose([(row, 6)], 1, 512))
    for t in range(1, len(TIERS) + 1):
        observe(policy, row, t, accepted=0, steps=600)
    assert probes(policy, row, 4) == [3]


def test_a_request_cap_and_rows_without_drafts_count():
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    row = policy.new_row()
    observe(policy, row, 4, accepted=6)
    expected = policy.expected_tokens([row, row], [6, 1])
    assert expected[0, -1] > 5  # six drafts accepted almost always
    assert ((1.9 < expected[1]) & (expected[1] <= 2.0)).all()  # capped at depth 1: one draft at most
    rates = policy.rates([(row, 6), None], 1, 512)
    assert rates[0] == pytest.approx(2.0)  # plain: a token per row
    assert policy.choose([None, None], 1, 512) == 0  # nobody drafts


def test_a_step_counts_each_depth_up_to_the_first_rejection():
    """Depth d is a trial where the step reached depth d - 1 and offered d: rows offering 6 (the
    tier's depth), 2 (a request capped at 2) and 6 accepted 2, 2 and 0 drafts."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    rows = [policy.new_row() for _ in range(3)]
    policy.observe(rows, 4, [6, 2, 6], [2, 2, 0])
    count, mean = policy.count[rows, 3], policy.mean[rows, 3]
    assert count.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert mean.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    assert not policy.count[rows, :3].any() and not policy.count[rows, 4:].any()  # the other tiers' lines
    assert policy.tier_count[3].tolist() == [3, 2, 1, 0, 0, 0] and policy.tier_mean[3, :3].tolist() == [2 / 3, 1, 0]
    assert policy.all_count.tolist() == [3, 2, 1, 0, 0, 0]


def test_chains_share_their_records_and_a_tree_keeps_its_own():
    """A chain drafts the same top-1 token at each depth whatever its length, so a step of one
    chain tier is a step of every chain tier (at the depths each reaches); the full tree's top-k
    record stays its own (share_chains=1, the default; 0: every tier its own record)."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    assert policy._shares[0] == [0, 1, 2]
    rows = [policy.new_row() for _ in range(2)]
    policy.observe(rows, 2, [2, 2], [2, 0])  # chain 2: one row accepts both drafts, the other none
    for chain in range(3):  # 1,1,1  2,1,2  4,1,4
        assert policy.count[rows, chain].tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
        assert policy.tier_count[chain].tolist() == [2, 1, 0, 0, 0, 0]
    assert not policy.count[rows, 3].any() and not policy.tier_count[3].any()
    apart = AdaptivePolicy(TIERS, TableCost(gpu_like), share_chains=0)  # each tier its own record
    row = apart.new_row()
    apart.observe([row], 2, [2], [2])
    assert apart.count[row, 1].tolist() == [1, 1, 0, 0, 0, 0] and not apart.count[row, [0, 2, 3]].any()


def test_a_chain_judged_on_one_poor_step_is_judged_again_by_the_chains_that_run():
    """A longer chain whose one step went badly is not starved: the short chain that runs instead
    keeps its first depth's estimate current. (Before, that estimate stayed at the one poor step's
    record and the policy never chose the longer chain again: replayed at batch 8 with the H200's
    step costs, it ran the one-deep chain in 99% of its steps.) With share_chains=1."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), share_chains=1)
    rows = [policy.new_row() for _ in range(8)]
    policy.observe(rows, 3, [4] * 8, [0] * 8)  # 4,1,4: every first draft rejected, once
    for _ in range(40):
        policy.observe(rows, 1, [1] * 8, [1] * 8)  # 1,1,1: every draft accepted since
    q = policy.acceptance(rows)
    assert (q[:, 2, 0] > 0.9).all(), q[:, 2, 0]  # 4,1,4's first depth as the short chain saw it


def test_a_rows_chance_of_drafting_scales_its_expected_drafts():
    """(record, cap, chance): a host drafter's row weighed before its proposal is made; chance 1 is
    the row as it stands, chance 0 one token (as a row that drafts nothing), and between them the
    drafts' expected tokens scale."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    rows = [policy.new_row() for _ in range(2)]
    observe(policy, rows[0], 4, accepted=3, steps=8)
    sure, none = policy.rates([(rows[0], 6), (rows[1], 6)], 2, 512), policy.rates([(rows[0], 6), None], 2, 512)
    assert policy.rates([(rows[0], 6), (rows[1], 6, 1.0)], 2, 512) == pytest.approx(sure)
    assert policy.rates([(rows[0], 6), (rows[1], 6, 0.0)], 2, 512) == pytest.approx(none)
    half = policy.rates([(rows[0], 6), (rows[1], 6, 0.5)], 2, 512)
    assert half[1:] == pytest.approx((sure[1:] + none[1:]) / 2) and half[0] == sure[0]


def test_running_means_forget_beyond_their_window():
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), window=4)
    row = policy.new_row()
    observe(policy, row, 1, accepted=1, steps=10)
    observe(policy, row, 1, accepted=0, steps=4)
    assert policy.count[row, 0, 0] == 4 and policy.mean[row, 0, 0] == pytest.approx((3 / 4) ** 4)
    many = [policy.new_row() for _ in range(100)]  # one step of more rows than the pooled window: their mean
    policy.observe(many, 1, [1] * 100, [1] * 75 + [0] * 25)
    policy.fold()  # (a step wider than FRESH_ROWS is folded in at the refresh)
    assert policy.tier_mean[0, 0] == pytest.approx(0.75) and policy.tier_count[0, 0] == policy.pooled_window


def test_row_records_are_reused_fresh_and_grow():
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    rows = [policy.new_row() for _ in range(20)]
    assert sorted(rows) == list(range(20)) and len(policy.mean) >= 20
    observe(policy, rows[5], 4, accepted=6)
    policy.release(rows[5])
    again = policy.new_row()
    assert again == rows[5] and not policy.count[again].any() and not policy.mean[again].any()


def test_kept_estimates_equal_fresh_ones_as_records_rows_and_caps_change():
    """expected_tokens keeps each row's estimate between observations (plain steps choose from it):
    after every observation, a row's release and reuse and a changed depth cap it must equal the
    estimate worked out from the records again."""
    rng = np.random.default_rng(3)
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=1)  # worked out again after every observation
    rows = [policy.new_row() for _ in range(6)]
    caps = [FULL.steps] * 6
    for step in range(40):
        tier = int(rng.integers(1, len(TIERS) + 1))
        some = [r for r in rows if rng.random() < 0.7]
        if some:
            depth = TIERS[tier - 1].steps
            policy.observe(some, tier, [depth] * len(some), rng.integers(0, depth + 1, len(some)).tolist())
        if step % 7 == 3:  # a request leaves and another takes its slot, fresh
            policy.release(rows[1])
            rows[1] = policy.new_row()
        if step % 5 == 2:
            caps[2] = int(rng.integers(1, FULL.steps + 1))
        for _ in range(2):  # the second call answers from what the first kept
            kept = policy.expected_tokens(rows, caps)
            assert np.array_equal(kept, policy._expected_tokens(np.asarray(rows), caps)), step
    fresh = policy.new_row()  # a new row's estimate is its own, not a released slot's
    assert np.array_equal(policy.expected_tokens([fresh], [FULL.steps]),
                          policy._expected_tokens(np.asarray([fresh]), [FULL.steps]))


def test_a_wide_batch_folds_its_observations_every_refresh_steps():
    """In a batch wider than FRESH_ROWS observations are summed and folded into the records every
    `refresh` of them (the policy's host time is a step's there): records and estimates stand still
    in between, and a fold leaves the records where folding each observation at once would (the
    running means are exact below their windows); every row's estimate is worked out again after
    a fold, a new row's and a changed depth cap's at once. A narrower batch folds at once."""
    from specheads.runtime.policy import FRESH_ROWS

    rng = np.random.default_rng(5)
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    each = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=1)  # folds every observation
    assert policy.refresh == 4
    rows = [policy.new_row() for _ in range(FRESH_ROWS + 4)]
    assert [each.new_row() for _ in rows] == rows
    caps = [FULL.steps] * len(rows)

    def fresh():
        return policy._expected_tokens(np.asarray(rows), caps)

    def observe_some():
        tier = int(rng.integers(1, len(TIERS) + 1))
        depth = TIERS[tier - 1].steps
        accepted = rng.integers(0, depth + 1, len(rows)).tolist()
        for p in (policy, each):
            p.observe(rows, tier, [depth] * len(rows), accepted)

    first = policy.expected_tokens(rows, caps)
    for _ in range(policy.refresh - 1):
        observe_some()
        assert not policy.count.any() and policy.version == 0  # summed, not folded
        assert np.array_equal(policy.expected_tokens(rows, caps), first)
    observe_some()  # the refresh-th: folded
    assert policy.version == 1 and each.version == policy.refresh
    for name in ("mean", "count", "tier_mean", "tier_count", "all_mean", "all_count"):
        assert np.allclose(getattr(policy, name), getattr(each, name)), name
    now = policy.expected_tokens(rows, caps)
    assert np.array_equal(now, fresh()) and not np.allclose(now, first)
    observe_some()
    caps[2] = 2
    policy.release(rows[4])
    rows[4] = policy.new_row()
    kept = policy.expected_tokens(rows, caps)
    assert np.array_equal(kept, fresh())  # the records stood still; row 4 and cap 2 worked out anew
    assert not np.array_equal(kept[2], now[2]) and not np.array_equal(kept[4], now[4])
    few, few_caps = rows[:FRESH_ROWS], caps[:FRESH_ROWS]
    version = policy.version
    policy.observe(few, len(TIERS), [FULL.steps] * len(few), [2] * len(few))  # narrow: folded at once
    assert policy.version == version + 1 and not policy._pend_trials.any()
    assert np.array_equal(policy.expected_tokens(few, few_caps), policy._expected_tokens(np.asarray(few), few_caps))


def test_a_probes_observation_is_folded_at_once_in_a_wide_batch():
    """A wide batch folds every `refresh` observations, but a probe (plain decoding chosen, the best
    tier run once anyway) is the one observation a run of plain steps makes: it is folded at once,
    so the choice after it weighs what it found (waiting for `refresh` probes, each after a doubled
    run of plain steps, kept a record from a stream's first steps for hundreds of steps in the
    replay of the validation traces at batch 64). Other observations of a wide batch still wait."""
    from specheads.runtime.policy import FRESH_ROWS

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), probe_every=4)
    rows = [policy.new_row() for _ in range(4 * FRESH_ROWS)]
    b, asked = len(rows), [(r, FULL.steps) for r in rows]
    for _ in range(policy.refresh):  # nothing accepted anywhere: plain decoding
        for t, shape in enumerate(TIERS, 1):
            policy.observe(rows, t, [shape.steps] * b, [0] * b)
    steps = []
    while not any(steps):
        tier = policy.choose(asked, b, 512)
        policy.launched(tier)
        steps.append(tier)
        if len(steps) > policy.probe_every:
            break
    assert steps[:-1] == [0] * (policy.probe_every - 1) and steps[-1] > 0  # the probe
    version, before = policy.version, policy.tier_mean[steps[-1] - 1].copy()
    depth = TIERS[steps[-1] - 1].steps
    policy.observe(rows, steps[-1], [depth] * b, [depth] * b)  # every draft accepted now
    assert policy.version == version + 1 and not policy._pend_trials.any()
    assert (policy.tier_mean[steps[-1] - 1][:depth] > before[:depth]).all()
    policy.launched(0)
    policy.observe(rows, 1, [1] * b, [1] * b)  # not a probe's: summed until `refresh` of them
    assert policy.version == version + 1 and policy._pending == 1


def test_rates_asked_again_between_folds_are_the_same():
    """A wide batch's choice between folds in the same buckets reuses the rates worked out last,
    whichever rows joined or left meanwhile (they weigh from the next fold); a fold or other buckets
    work them out again. A narrow batch's are kept only for the same rows and caps."""
    from specheads.runtime.policy import FRESH_ROWS

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like))
    rows = [(policy.new_row(), FULL.steps) for _ in range(FRESH_ROWS + 2)]
    slots = [r[0] for r in rows]
    policy.observe(slots, len(TIERS), [FULL.steps] * len(rows), [3] * len(rows))
    policy.fold()
    rates = policy.rates(rows, 16, 256)
    assert policy.rates(rows, 16, 256) is rates
    assert policy.rates(rows[:-1], 16, 256) is rates  # a row left: weighed from the next fold
    joined = rows + [(policy.new_row(), FULL.steps)]
    assert policy.rates(joined, 16, 256) is rates
    assert policy.rates(rows, 16, 512) is not rates
    rates = policy.rates(rows, 16, 256)
    policy.observe(slots, 1, [1] * len(rows), [0] * len(rows))
    assert policy.rates(rows, 16, 256) is rates  # not yet folded
    policy.fold()
    again = policy.rates(rows, 16, 256)
    assert again is not rates and again[1] < rates[1]  # chain 1 rejected everywhere since
    few = rows[:FRESH_ROWS]
    narrow = policy.rates(few, 8, 256)
    assert policy.rates(few, 8, 256) is narrow and policy.rates(few[:-1], 8, 256) is not narrow
    narrow = policy.rates(few, 8, 256)
    policy.new_row()  # (a slot's number may come back with another record)
    assert policy.rates(few, 8, 256) is not narrow


def test_unseen_tiers_and_depths_borrow_from_what_was_seen():
    """A tier no step ran takes all tiers' acceptance at its depths, and a depth no step reached
    takes the one above it: a new row of a well-drafting server starts optimistic, not at the prior."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), prior=0.1, prior_weight=2.0)
    seen = policy.new_row()
    observe(policy, seen, 2, accepted=2, steps=60)  # chain 2 only: depths 1 and 2 always accepted
    q = policy.acceptance([policy.new_row()])[0]
    assert (q[:, :2] > 0.9).all()  # every tier, depths 1-2
    assert (q[3, 2:] > 0.8).all()  # the full tree's depths 3-6, never reached


def test_the_cost_model_decodes_plainly_where_speculation_loses():
    """The same acceptance (every draft accepted): at batch 1 the full tree, at batch 64 a short
    chain (its few verified tokens still fit one pass), at batch 256 (every extra token costs)
    plain decoding."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), explore_every=0)
    slots = [policy.new_row() for _ in range(256)]
    for _ in range(4):
        policy.observe(slots, 4, [6] * 256, [6] * 256)  # a step of 256 rows
    rows = [(r, 6) for r in slots]
    assert policy.choose(rows[:1], 1, 512) == 4
    assert policy.tiers[policy.choose(rows[:64], 64, 512) - 1] == TreeShape(1, 1, 1)
    assert policy.choose(rows, 256, 512) == 0


def test_every_tier_runs_at_the_start_and_again_when_idle():
    """A tier's estimate moves only when it runs: every tier runs once at the start (the full
    tree first) and any tier idle for explore_every drafting steps runs once more; the rest of
    the time the best tier runs. Plain steps (speculation losing) are not interrupted."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), explore_every=8)
    row = policy.new_row()
    choices = []
    for _ in range(24):
        tier = policy.choose([(row, 6)], 1, 512)
        policy.launched(tier)
        if tier:
            observe(policy, row, tier, accepted=1)  # only the first draft is accepted
        choices.append(tier)
    assert choices[:4] == [4, 3, 2, 1]
    best = max(set(choices[4:]), key=choices[4:].count)
    assert policy.tiers[best - 1] == TreeShape(1, 1, 1)  # one draft accepted: the shortest chain pays best
    for t in (2, 3, 4):  # each other tier ran again within every explore_every drafting steps
        runs = [i for i, c in enumerate(choices) if c == t]
        assert len(runs) >= 2 and all(b - a <= 9 for a, b in zip(runs, runs[1:])), (t, choices)
    assert choices.count(1) > 24 / 2
    quiet = AdaptivePolicy(TIERS, TableCost(gpu_like), explore_every=8, probe_every=1000)
    r = quiet.new_row()
    for t in range(1, len(TIERS) + 1):
        observe(quiet, r, t, accepted=0, steps=60)
    assert all(quiet.choose([(r, 6)], 1, 512) == 0 for _ in range(20))  # no draft pays: no exploring either


def test_full_share_runs_the_full_tree_now_and_then_where_a_smaller_tier_is_chosen():
    """full_share s: where a smaller tier is the choice, the full tree runs once its drafting steps
    since it last ran, times s, reach what its step costs over the chosen tier's (its record then
    follows the requests of now); off (0), it never runs there. Plain decoding is never forced."""
    def run(share, steps=200):
        policy = AdaptivePolicy(TIERS, TableCost(lambda b, t: 1.0 + (0.5 if t == FULL else 0.0)), window=16,
                                prior_weight=2.0, full_share=share)
        row = policy.new_row()
        observe(policy, row, 4, accepted=1, steps=60)  # the full tree's record: a chain pays more
        chosen = []
        for _ in range(steps):
            t = policy.choose([(row, 6)], 8, 512)
            policy.launched(t)
            chosen.append(t)
        return policy, chosen
    _, never = run(0.0)
    assert 0 < never[0] < 4 and 4 not in never
    policy, chosen = run(0.05)  # the full step costs 0.5 more: once every 0.5 / 0.05 = 10 drafting steps
    gaps = np.diff([i for i, t in enumerate(chosen) if t == 4])
    assert len(gaps) >= 15 and set(gaps.tolist()) == {11}
    assert set(chosen) - {4} == {never[0]}
    with pytest.raises(PolicyError, match="full_share"):
        build_policy("adaptive", FULL, settings="full_share=-1")


def test_share_all_refreshes_every_dearer_tier_and_never_a_cheaper_one():
    """share_all 1: full_share's rule for every tier dearer than the chosen one, the most overdue first,
    so a middle tier judged on an early stretch is seen again (at chat batch 64 on an H200 chain 4 ran
    16 steps at the start, then never, where it beat the chosen chain 2 by 5%); a cheaper tier is never
    forced (the default). share_all 0: the full tree alone."""
    price = {TIERS[0]: 1.0, TIERS[1]: 1.1, TIERS[2]: 1.3, FULL: 2.0}

    def run(share_all, steps=400):
        policy = AdaptivePolicy(TIERS, TableCost(lambda b, t: price[t] if t else 0.9), window=16,
                                prior_weight=2.0, full_share=0.05, share_all=share_all, share_chains=0)
        row = policy.new_row()
        observe(policy, row, 1, accepted=1, steps=60)  # chain 1 always right: the choice
        for t in (2, 3, 4):
            observe(policy, row, t, accepted=0, steps=60)  # the others judged on a poor stretch
        chosen = []
        for _ in range(steps):
            t = policy.choose([(row, 6)], 8, 512)
            policy.launched(t)
            chosen.append(t)
        return chosen
    old, new = run(0), run(1)
    assert set(old) == {1, 4}
    assert set(new) == {1, 2, 3, 4} and 0 not in new
    # each dearer tier about once its idle steps x 0.05 pay its extra cost over chain 1's
    counts = {t: new.count(t) for t in (2, 3, 4)}
    assert counts[2] > counts[3] > counts[4] >= 1
    assert AdaptivePolicy(TIERS, TableCost(lambda b, t: price[t] if t else 0.9)).share_all == 1
    policy = AdaptivePolicy(TIERS, TableCost(lambda b, t: price[t] if t else 0.9), window=16, prior_weight=2.0,
                            full_share=0.05, share_all=1, share_chains=0)
    row = policy.new_row()
    observe(policy, row, 3, accepted=4, steps=60)  # chain 4 the choice: chains 1 and 2 are cheaper
    for t in (1, 2):
        observe(policy, row, t, accepted=0, steps=60)
    observe(policy, row, 4, accepted=0, steps=60)
    picks = []
    for _ in range(200):
        t = policy.choose([(row, 6)], 8, 512)
        policy.launched(t)
        picks.append(t)
    assert set(picks) == {3, 4}
    with pytest.raises(PolicyError, match="share_all"):
        build_policy("adaptive", FULL, settings="share_all=-1")


def test_share_all_2_refreshes_every_tier_by_the_rate_it_gives_up_in_a_wide_batch():
    """share_all 2: in a batch of more than 16 rows, any tier but the chosen one (cheaper ones too, and
    the smaller tiers while the full tree is chosen) runs once its idle drafting steps x full_share
    reach the share of tokens/s its step would give up on the current estimates: a close rival
    often, a poor one seldom. In a batch of up to 16 rows it is share_all 1."""
    price = {TIERS[0]: 1.0, TIERS[1]: 1.1, TIERS[2]: 1.3, FULL: 2.0}

    def run(share_all, rows, steps=400):
        policy = AdaptivePolicy(TIERS, TableCost(lambda b, t: price[t] if t else 0.9), window=16,
                                prior_weight=2.0, full_share=0.05, share_all=share_all)
        slots = [policy.new_row() for _ in range(rows)]
        for slot in slots:  # one accepted draft under every tier: chain 1, the cheapest, leads
            for t in range(1, len(TIERS) + 1):
                observe(policy, slot, t, accepted=1, steps=20)
        chosen = []
        for _ in range(steps):
            t = policy.choose([(slot, 6) for slot in slots], 32 if rows > 16 else 16, 512)
            policy.launched(t)
            chosen.append(t)
        return chosen
    wide = run(2, 32)
    counts = {t: wide.count(t) for t in (1, 2, 3, 4)}
    # rates 2/1.0, 2/1.1, 2/1.3, 2/2.0: chain 2 gives up 9%, chain 4 23%, the full tree 50%
    assert counts[1] > counts[2] > counts[3] > counts[4] >= 1 and 0 not in wide
    assert run(2, 16) == run(1, 16)
    assert run(2, 32) != run(1, 32)
    with pytest.raises(PolicyError, match="share_all=3 must be 0"):
        build_policy("adaptive", FULL, settings="share_all=3")


def test_a_clear_choice_is_held_without_an_estimate_and_its_observations_kept():
    """With `hold` h a choice leading the option nearest to replacing it by the share L repeats for
    L / h choices (at most HOLD_STEPS) without an estimate, while the rows and buckets stay and fewer
    observations than that came; the observations meanwhile are folded at the next estimate as one
    batch of trials (within the window, the same means as folded one by one)."""
    from specheads.runtime.policy import HOLD_STEPS

    def run(hold):
        policy = AdaptivePolicy(TIERS, TableCost(gpu_like), hold=hold, window=128, pooled_window=128)
        row = policy.new_row()
        observe(policy, row, 4, accepted=6)
        estimates = []
        rates = policy.rates
        policy.rates = lambda *a, **k: (estimates.append(1), rates(*a, **k))[1]
        chosen = []
        for i in range(40):
            chosen.append(policy.choose([(row, 6)], 1, 512))
            policy.observe([row], chosen[-1], [6], [6 if i % 2 else 5])
        policy.fold()
        return policy, chosen, len(estimates)

    base, chosen0, n0 = run(0)
    held, chosen1, n1 = run(0.05)
    assert chosen0 == chosen1 == [4] * 40
    assert n0 == 40 and n1 < 40 / 2
    assert np.allclose(held.mean, base.mean) and np.array_equal(held.count, base.count)
    assert np.allclose(held.tier_mean, base.tier_mean) and np.array_equal(held.all_count, base.all_count)
    # the lead decides the length: the full tree's lead over the best chain past the margin, or plain's
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), hold=0.05)
    row = policy.new_row()
    observe(policy, row, 4, accepted=6)
    rates = policy.rates([(row, 6)], 1, 512)
    lead = rates[4] / max(rates[0], *(rates[1:4] / (1 + policy.switch_margin))) - 1
    assert policy._lead(rates, 4, True) == pytest.approx(lead)
    policy.choose([(row, 6)], 1, 512)
    assert policy._hold_left == min(int(lead / 0.05), HOLD_STEPS)
    # a batch wider than FRESH_ROWS keeps its rates between folds instead: nothing is held there
    wide = AdaptivePolicy(TIERS, TableCost(gpu_like), hold=0.05)
    many = [wide.new_row() for _ in range(12)]
    for r in many:
        observe(wide, r, 4, accepted=6, steps=2)
    wide.choose([(r, 6) for r in many], 16, 512)
    assert wide._hold_left == 0
    # another bucket, other rows or as many observations as held choices end the hold
    for change in ("kv", "rows", "observations"):
        policy.choose([(row, 6)], 1, 512)
        assert policy._hold_left > 0
        if change == "kv":
            rates_fn, estimates = policy.rates, []
            policy.rates = lambda *a, **k: (estimates.append(1), rates_fn(*a, **k))[1]
            policy.choose([(row, 6)], 1, 1024)
            del policy.rates
            assert estimates
        elif change == "rows":
            policy.choose([(row, 6), (policy.new_row(), 6)], 1, 512)
        else:
            for _ in range(HOLD_STEPS):
                policy.observe([row], 4, [6], [6])
            estimates = []
            rates_fn = policy.rates
            policy.rates = lambda *a, **k: (estimates.append(1), rates_fn(*a, **k))[1]
            policy.choose([(row, 6)], 1, 512)
            del policy.rates
            assert estimates and policy._pending == 0  # worked out again, the kept observations folded


def test_a_joining_row_ends_the_hold_and_is_primed_while_prefilled():
    """A slot that comes back (batch 1: every request takes the one the last left) must not let a
    choice held for the rows before match the new request's; `prime` (called while the new row's
    prompt is prefilled) does the deferred fold and the row's estimate, so the next choice is the
    same as without it and works out no estimate of its own."""
    def run(prime):
        policy = AdaptivePolicy(TIERS, TableCost(gpu_like), hold=0.05)
        row = policy.new_row()
        observe(policy, row, 1, accepted=2)
        for _ in range(3):
            tier = policy.choose([(row, 6)], 1, 512)
            policy.observe([row], tier, [policy.tiers[tier - 1].steps], [1])
        assert policy._hold_left > 0 and policy._deferred
        policy.release(row)
        new = policy.new_row()
        assert new == row and policy._hold_left == 0  # the same slot, a new request: nothing held
        computed = []
        inner = policy._expected_tokens
        policy._expected_tokens = lambda *a: (computed.append(1), inner(*a))[1]
        if prime:
            policy.prime([new], [6])
            assert not policy._deferred and computed == [1]
            computed.clear()
        return policy.choose([(new, 6)], 1, 512), computed, policy.version

    (plain, worked, v0), (primed, none, v1) = run(False), run(True)
    assert plain == primed and v0 == v1
    assert worked and not none  # primed: the choice found the new row's estimate made


@pytest.mark.parametrize("share_chains", [0, 1])
def test_noted_observations_sum_as_added_one_by_one(share_chains):
    """Observations noted between folds (rows and tiers that change from step to step, a slot more
    than once) sum into the pending records as adding each step's trials and hits would: into
    every tier sharing the step's tier's record (share_chains 1: every chain's) and once into the
    pooled one."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=100, hold=0, share_chains=share_chains)
    rows = [policy.new_row() for _ in range(12)]
    rng = np.random.default_rng(0)
    want = {k: np.zeros_like(getattr(policy, k)) for k in ("_pend_trials", "_pend_hits", "_pend_k", "_pend_h",
                                                           "_pend_all_k", "_pend_all_h")}
    for _ in range(7):
        some = [int(r) for r in rng.choice(rows, size=int(rng.integers(9, 13)), replace=False)]  # > 8 rows: not folded
        tier = int(rng.integers(1, len(TIERS) + 1))
        depth = TIERS[tier - 1].steps
        offered = [int(x) for x in rng.integers(1, depth + 1, len(some))]
        accepted = [int(rng.integers(0, o + 1)) for o in offered]
        policy.observe(some, tier, offered, accepted)
        trials, hits = policy._trials[offered, accepted], policy._hits[offered, accepted]
        for t in policy._shares[tier - 1]:
            want["_pend_trials"][some, t] += trials
            want["_pend_hits"][some, t] += hits
            want["_pend_k"][t] += trials.sum(0)
            want["_pend_h"][t] += hits.sum(0)
        want["_pend_all_k"] += trials.sum(0)
        want["_pend_all_h"] += hits.sum(0)
    assert len(policy._raw) == 7
    policy._sum_noted()
    for name, value in want.items():
        assert np.allclose(getattr(policy, name), value), name
    same = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=100, hold=0, share_chains=0)  # the same rows and tier each step
    kept = [same.new_row() for _ in range(10)]
    for step in range(3):
        same.observe(kept, 4, [6] * 10, [step] * 10)
    same._sum_noted()
    assert np.allclose(same._pend_trials[kept[0], 3], same._trials[6, 0] + same._trials[6, 1] + same._trials[6, 2])
    assert np.allclose(same._pend_k[3], 10 * (same._trials[6, 0] + same._trials[6, 1] + same._trials[6, 2]))
    chains = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=100, hold=0)  # chains share (the default)
    kept = [chains.new_row() for _ in range(10)]
    for step in range(3):
        chains.observe(kept, 2, [2] * 10, [step] * 10)
    chains._sum_noted()
    one = chains._trials[2, 0] + chains._trials[2, 1] + chains._trials[2, 2]
    for t in (0, 1, 2):  # every chain's record, the tree's not; the pooled one once
        assert np.allclose(chains._pend_trials[kept[0], t], one) and np.allclose(chains._pend_k[t], 10 * one)
    assert not chains._pend_trials[kept[0], 3].any() and np.allclose(chains._pend_all_k, 10 * one)


def test_observations_noted_for_a_slot_stay_with_its_row():
    """Observations wait to be summed until a fold; a slot freed and taken by a new row meanwhile
    starts the new row's record empty, the old row's observations counted in the pooled records."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), refresh=4)
    rows = [policy.new_row() for _ in range(12)]  # a wide batch: folded every 4 observations
    policy.observe(rows, 4, [6] * 12, [6] * 12)
    assert policy._raw and policy.count[rows[0]].sum() == 0
    policy.release(rows[0])
    fresh = policy.new_row()
    assert fresh == rows[0]
    policy.fold()
    assert policy.count[fresh].sum() == 0
    assert policy.count[rows[1], 3, 0] == 1 and policy.tier_count[3, 0] == 12


def test_static_costs_without_measurements():
    cost = StaticCost()
    assert cost.step(1, 128, None) == 1.0
    assert cost.step(1, 128, FULL) == pytest.approx(1 + 0.1 * 6)  # 16 tokens verify in one pass
    assert cost.step(64, 128, FULL) == pytest.approx(64 * 16 / 128 + 0.1 * 6 * 2)
    policy = AdaptivePolicy(TIERS, cost)
    rows = [(policy.new_row(), 6) for _ in range(64)]
    for r, _ in rows:
        observe(policy, r, 4, accepted=0)
        observe(policy, r, 1, accepted=0)
    assert policy.choose(rows, 64, 128) == 0


# ---------------------------------------------------------------------------- profiles
FINGERPRINT = {"target": "llama: 4 layers", "method": "eagle3", "max_tree": "6,4,15", "dtype": "torch.bfloat16"}


def profile():
    p = SpeculationProfile("NVIDIA H100 80GB HBM3", dict(FINGERPRINT))
    for b in (1, 8, 64):
        for kv in (128, 1024):
            p.add(None, b, kv, 5.0 + b / 64 + kv / 1024)
            for t in TIERS:
                p.add(t, b, kv, gpu_like(b, t) * 5.0 + kv / 1024)
    return p


def test_profile_round_trip(tmp_path):
    p = profile()
    path = tmp_path / "costs.json"
    p.save(path)
    loaded = SpeculationProfile.load(path).check(path, p.device, FINGERPRINT, TIERS)
    assert loaded.step_ms == p.step_ms and loaded.device == p.device and loaded.fingerprint == FINGERPRINT
    assert loaded.has(8, 1024, TIERS) and not loaded.has(16, 1024, TIERS)
    # a bucket not timed takes the nearest one (log scale)
    assert loaded.step(16, 1024, FULL) == loaded.step(8, 1024, FULL)
    assert loaded.step(48, 4096, None) == loaded.step(64, 1024, None)
    assert json.loads(path.read_text())["format"] == "specheads-speculation-profile/1"


def test_a_step_is_priced_at_its_longest_rows_context_within_the_bucket(tmp_path):
    """Timed at a bucket's shortest and longest context (the engine's _bucket_fills), a step is
    priced on the line through them at the context asked for (the rows' mean), carried below the
    lowest point where the points lie far enough apart; a bucket with one point, or a profile
    written before the points (no context_ms), prices the bucket's top as before."""
    p = profile()
    for t in [None, *TIERS]:
        p.add_point(t, 32, 2048, 1007, 3.0 if t else 1.5)
        p.add_point(t, 32, 2048, 2032, 5.0 if t else 1.6)
        p.add(t, 32, 2048, 5.0 if t else 1.6)
    assert p.step(32, 2048, FULL) == 5.0 and p.step(32, 2048, FULL, context=2032) == 5.0
    assert p.step(32, 2048, FULL, context=1007) == 3.0 and p.step(32, 2048, FULL, context=9999) == 5.0
    assert p.step(32, 2048, FULL, context=600) == pytest.approx(3.0 - 2.0 * 407 / 1025)  # the line carried down
    assert p.step(32, 2048, FULL, context=-50) == p.step(32, 2048, FULL, context=0)
    p.add_point(FULL, 32, 4096, 4000, 7.0)  # points too close (noise would tilt the line), or falling: not carried
    p.add_point(FULL, 32, 4096, 4079, 7.5)
    p.add(FULL, 32, 4096, 7.5)
    assert p.step(32, 4096, FULL, context=500) == 7.0
    p.add_point(FULL, 32, 2048, 1007, 5.5)
    assert p.step(32, 2048, FULL, context=600) == 5.5
    p.add_point(FULL, 32, 2048, 1007, 3.0)
    assert p.step(32, 2048, FULL, context=1519.5) == pytest.approx(4.0)
    assert p.step(32, 2048, None, context=1519.5) == pytest.approx(1.55)
    assert p.step(8, 1024, FULL, context=100) == p.step(8, 1024, FULL)  # no points there
    path = tmp_path / "costs.json"
    p.save(path)
    loaded = SpeculationProfile.load(path)
    assert loaded.context_ms == p.context_ms and loaded.step_ms == p.step_ms
    assert loaded.step(32, 2048, FULL, context=1519.5) == pytest.approx(4.0)
    old = {k: v for k, v in p.to_json().items() if k != "context_ms"}
    path.write_text(json.dumps(old))
    assert SpeculationProfile.load(path).step(32, 2048, FULL, context=1007) == 5.0
    # the policy passes the context through to the costs, and keeps them per context
    policy = AdaptivePolicy(TIERS, p)
    assert policy.costs(32, 2048, 1007)[-1] == 3.0 and policy.costs(32, 2048)[-1] == 5.0
    rows = [(policy.new_row(), FULL.steps) for _ in range(32)]
    assert policy.rates(rows, 32, 2048, context=1007)[-1] == pytest.approx(policy.rates(rows, 32, 2048)[-1] * 5 / 3)


@pytest.mark.parametrize("edit, message", [
    (lambda d: "not json", "is not JSON"),
    (lambda d: {**d, "format": "other/2"}, "has format 'other/2'; expected 'specheads-speculation-profile/1'"),
    (lambda d: {k: v for k, v in d.items() if k != "step_ms"}, "lacks step_ms; expected the fields"),
    (lambda d: {**d, "step_ms": {"plain": {"1": {"128": -1}}}}, "must map \"plain\" or \"S,K,N\" to"),
    (lambda d: {**d, "step_ms": {"6,4": {"1": {"128": 1}}}}, "must be three integers"),
    (lambda d: {**d, "context_ms": {"plain": {"1": {"128": {"-3": 1}}}}}, "context_ms \\(optional\\) to"),
    (lambda d: {**d, "context_ms": {"plain": {"1": {"128": 2}}}}, "context_ms \\(optional\\) to"),
])
def test_a_bad_profile_file_is_refused(tmp_path, edit, message):
    path = tmp_path / "costs.json"
    data = edit(profile().to_json())
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(PolicyError, match=message) as e:
        SpeculationProfile.load(path)
    assert str(path) in str(e.value)


def test_a_profile_of_another_card_model_or_tiers_is_refused(tmp_path):
    path = tmp_path / "costs.json"
    p = profile()
    with pytest.raises(PolicyError, match="measured on 'NVIDIA H100 80GB HBM3', not this 'NVIDIA H200'"):
        p.check(path, "NVIDIA H200", FINGERPRINT, TIERS)
    with pytest.raises(PolicyError, match=r"another model or drafter \(method: \['eagle3'\] there, \['mtp'\] here\)"):
        p.check(path, p.device, {**FINGERPRINT, "method": "mtp"}, TIERS)
    with pytest.raises(PolicyError, match=r"no times for 3,1,3 \(it holds plain and 1,1,1; 2,1,2; 4,1,4; 6,4,15\)"):
        p.check(path, p.device, FINGERPRINT, [TreeShape(3, 1, 3), FULL])
    # an engine that times its steps (graphs) takes it: the missing tier is timed at the first bucket
    assert p.check(path, p.device, FINGERPRINT, [TreeShape(3, 1, 3), FULL], can_time=True) is p
    with pytest.raises(PolicyError, match="measured on"):  # another card stays refused
        p.check(path, "NVIDIA H200", FINGERPRINT, TIERS, can_time=True)


def test_the_commands_default_is_adaptive_on_a_gpu_and_where_its_options_are_given():
    from specheads.runtime.policy import default_policy

    assert (default_policy(True), default_policy(False)) == ("adaptive", "fixed")
    assert default_policy(False, tiers="1,1,1;2,1,2") == "adaptive"
    assert default_policy(False, profile="costs.json") == "adaptive"
    assert default_policy(False, settings="switch_margin=0.1") == "adaptive"


def test_each_entry_is_priced_at_its_own_context_bucket():
    """rates takes one context bucket for all, or one for plain decoding and one per tier (a plain
    step or a short chain may fit a smaller bucket than the full tree); costs are kept per batch
    and buckets and worked out again once the profile gains a time."""
    profile = SpeculationProfile("card", {})
    for t in [None, *TIERS]:
        for kv, ms in ((512, 1.0), (1024, 1.5)):
            profile.add(t, 64, kv, ms * (1 + (t.num_draft if t else 0) / 16))
    policy = AdaptivePolicy(TIERS, profile)
    rows = [(policy.new_row(), FULL.steps) for _ in range(64)]
    one = policy.costs(64, 1024)
    assert one.tolist() == [profile.step(64, 1024, t) for t in [None, *TIERS]]
    mixed = [512, 512, 512, 1024, 1024]  # plain and the two short chains still fit 512
    assert policy.costs(64, mixed).tolist() == [profile.step(64, kv, t) for kv, t in zip(mixed, [None, *TIERS])]
    r_one, r_mixed = policy.rates(rows, 64, 1024), policy.rates(rows, 64, mixed)
    assert r_mixed[0] == pytest.approx(1.5 * r_one[0]) and r_mixed[-1] == pytest.approx(r_one[-1])
    profile.add(None, 64, 512, 2.0)  # a new time: the kept costs give way
    assert policy.costs(64, mixed)[0] == 2.0
    with pytest.raises(PolicyError, match="one for plain decoding and each of the 4 tiers"):
        policy.costs(64, [512, 1024])



def test_a_draining_batch_ranks_tiers_by_its_slow_end():
    """Once no request waits (generate() has admitted its last prompt) a batch ends with its slowest
    rows: each tier is ranked by the drain_quantile quantile of the rows' expected tokens, times the
    rows, not by their sum. Rows that draft everything beside a few that draft nothing choose a
    smaller tier as the batch drains than while requests wait; drain=0 (the default) keeps the sum."""
    def batch_of(policy):
        fast = [policy.new_row() for _ in range(18)]
        slow = [policy.new_row() for _ in range(2)]
        for _ in range(40):
            policy.observe(fast + slow, len(TIERS), [FULL.steps] * 20, [FULL.steps] * 18 + [0] * 2)
        return [(r, FULL.steps) for r in fast + slow]

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), drain=1)
    rows = batch_of(policy)
    busy = policy.choose(rows, 32, 512)
    assert busy > 0
    rates = policy.rates(rows, 32, 512, draining=True)
    extra = policy.expected_tokens([r for r, _ in rows], [c for _, c in rows]) - 1.0
    costs = policy.costs(32, 512)
    want = len(rows) * (1.0 + np.quantile(extra, policy.drain_quantile, axis=0)) / costs[1:]
    assert np.allclose(rates[1:], want) and rates[0] == pytest.approx(len(rows) / costs[0])
    assert policy.choose(rows, 32, 512, draining=True) < busy
    assert policy.choose(rows[:1], 32, 512, draining=True) > 0  # one row: the sum, its own rate
    off = AdaptivePolicy(TIERS, TableCost(gpu_like))
    assert off.choose(batch_of(off), 32, 512, draining=True) == busy


def test_generate_drains_once_its_last_prompt_is_in():
    """The engine's generate() tells the policy the batch drains from the step after it admits its
    last prompt, and not before; a server's engine (add/step) never drains."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from tests.runtime.spec_helpers import make_target, random_head, random_prompts

    target = make_target(seed=0, vocab=64)
    # (the assist's gate off: a gated step in flight would add its long chain to the context told)
    engine = SpecEngine(target, random_head(target), max_batch=2, max_len=64, num_steps=2, topk=1,
                        num_draft_tokens=2, speculation_policy="adaptive", drafter_options={"ngram_gate": 0})
    seen = []
    choose = engine.policy.choose

    contexts = []

    def spy(rows, batch, kv, host_ms=0.0, draining=False, context=None):
        seen.append((len(rows), draining))
        contexts.append((context, sum(r.committed for r in engine.rows) / len(engine.rows), kv[-1]))
        return choose(rows, batch, kv, host_ms, draining, context)

    engine.policy.choose = spy
    params = SamplingParams(max_new_tokens=6)
    prompts = random_prompts(5, 64, [3, 4, 5, 6, 7])
    engine.generate(prompts, params)
    assert seen[0][1] is False and seen[-1][1] is True
    flips = [i for i in range(1, len(seen)) if seen[i][1] != seen[i - 1][1]]
    assert len(flips) == 1  # not draining while prompts wait, then draining to the end
    assert not engine.draining
    # each choice is told the rows' mean context (with the step in flight's commits), rounded up to
    # a sixteenth of the full tree's context bucket (the profile prices a step there)
    quanta = [(c, mean, max(kv // 16, 1)) for c, mean, kv in contexts]
    assert quanta and all(c >= mean and c % q == 0 and c - mean <= q + 3 for c, mean, q in quanta)
    seen.clear()
    from specheads.runtime.engine import Request

    engine.add(Request(prompts[0], params, frozenset()))
    while engine.has_work:
        engine.step()
    assert seen and not any(d for _, d in seen)


def test_first_drafts_of_plain_steps_are_trials_at_depth_one_of_the_chains():
    """`observe_first` (a plain step's first-draft checks) is a trial at depth 1 of every chain
    tier, for the row and the pooled records, and leaves the tree tier and deeper depths alone; a
    row decoding plainly on a poor record drafts again once its first drafts match."""
    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), hold=0)  # (each observation folded at once: no choice held)
    row = policy.new_row()
    for _ in range(40):  # a poor stretch: the full tree's drafts all rejected
        policy.observe([row], len(TIERS), [FULL.steps], [0])
    assert policy.choose([(row, FULL.steps)], 1, 512) == 0
    mean, count = policy.mean.copy(), policy.count.copy()
    tier_count = policy.tier_count.copy()
    for _ in range(12):
        policy.observe_first([row], [1])
    chains = [i for i, t in enumerate(TIERS) if t.topk == 1]
    assert chains == [0, 1, 2]
    assert np.all(policy.count[row, chains, 0] == count[row, chains, 0] + 12)
    assert np.all(policy.mean[row, chains, 0] > mean[row, chains, 0])
    assert np.array_equal(policy.count[row, 3], count[row, 3])  # the tree: untouched
    assert np.array_equal(policy.count[row, :, 1:], count[row, :, 1:])  # deeper depths: untouched
    assert np.all(policy.tier_count[chains, 0] == tier_count[chains, 0] + 12)
    assert policy.choose([(row, FULL.steps)], 1, 512) > 0
    policy.observe_first([], [])  # nothing to tell: nothing changes
    FixedPolicy(FULL).observe_first([None], [1])


def test_paced_steps_cost_what_the_engine_read():
    """With `pace=1`, a step of a tier costs at least the time the engine measured between such steps'
    results (the host's pace, where it is slower than the card): a tier whose graph is cheap but whose
    steps come slowly loses to one that keeps pace; by default the pace is not taken. Taken in at a
    fold, after PACE_MIN_STEPS steps; a pause counts at most 3x the least time seen; a static cost
    (not in ms) ignores it."""
    from specheads.runtime.policy import PACE_MIN_STEPS

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), pace=1, hold=0)  # (folded at each observation)
    row = policy.new_row()
    deep = len(TIERS)  # the full tree
    observe(policy, row, deep, TIERS[deep - 1].steps)  # every draft accepted
    rows, b = [(row, FULL.steps)], 1
    assert policy.choose(rows, b, 512) == deep
    before = policy.costs(b, 512).copy()
    for _ in range(PACE_MIN_STEPS - 1):
        policy.paced(deep, b, 10 * before[deep])
    policy.fold()
    assert np.array_equal(policy.costs(b, 512), before)  # too few steps seen yet
    policy.paced(deep, b, 10 * before[deep])
    assert np.array_equal(policy.costs(b, 512), before)  # not yet folded
    observe(policy, row, deep, TIERS[deep - 1].steps, steps=1)
    paced = policy.costs(b, 512)
    assert paced[deep] == 10 * before[deep] and np.array_equal(np.delete(paced, deep), np.delete(before, deep))
    assert policy.choose(rows, b, 512) != deep
    # faster than the graph's time: the graph's time stands; a pause is clipped
    policy.paced(1, b, before[1] / 2)
    for _ in range(PACE_MIN_STEPS):
        policy.paced(1, b, before[1] / 2)
    policy.paced(1, b, 1000.0)
    policy.fold()
    assert policy._pace[(1, b)][0] <= 3 * before[1] / 2 and policy.costs(b, 512)[1] == before[1]
    static = AdaptivePolicy(TIERS, StaticCost(), pace=1)
    plain = static.costs(b, 512).copy()
    for _ in range(2 * PACE_MIN_STEPS):
        static.paced(1, b, 100.0)
    static.fold()
    assert np.array_equal(static.costs(b, 512), plain)
    off = AdaptivePolicy(TIERS, TableCost(gpu_like))  # the default: graphs' times alone
    for _ in range(2 * PACE_MIN_STEPS):
        off.paced(deep, b, 10 * before[deep])
    off.fold()
    assert np.array_equal(off.costs(b, 512), before)


def test_an_unpaced_tier_costs_at_least_a_shallower_tiers_pace():
    """A tier not yet paced is priced at least at the pace of any paced tier no deeper than it (a
    deeper step emits as many tokens or more, so makes as much host work or more): otherwise the
    tier that ran, now priced at its pace, would lose to one priced at its graph alone. Shallower
    tiers and plain decoding keep their own costs."""
    from specheads.runtime.policy import PACE_MIN_STEPS

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), pace=1)
    b = 8
    before = policy.costs(b, 512).copy()
    mid = 2
    slow = 5 * before.max()
    for _ in range(PACE_MIN_STEPS):
        policy.paced(mid, b, slow)
    policy.fold()
    after = policy.costs(b, 512)
    depth = [0] + [t.steps for t in TIERS]
    for i in range(len(after)):
        if depth[i] >= depth[mid]:
            assert after[i] == slow
        else:
            assert after[i] == before[i]
    # a deeper tier's own pace, once read, is its cost (even below the shallower tier's)
    for _ in range(PACE_MIN_STEPS):
        policy.paced(len(TIERS), b, before[-1])
    policy.fold()
    assert policy.costs(b, 512)[-1] == before[-1]


def test_records_worked_on_the_depths_in_use_alone_give_the_same_bits():
    """With the ladder the records are 63 deep, but a wide batch's steps offer and weigh at most the
    tree's 15 drafts: folds and estimates work on the first depths alone (`_span`: a multiple of 8,
    so numpy's sums over depth keep their order). Records, estimates and choices equal, bit for bit,
    those of a policy that works on every depth, through chains, the tree, first drafts, rows that
    leave and join, and depth caps that change (63 where the gate's chain may run)."""
    rng = np.random.default_rng(11)
    tiers = [TreeShape(1, 1, 1), TreeShape(2, 1, 2), TreeShape(4, 1, 4), TreeShape(63, 4, 15)]
    span, every = (AdaptivePolicy(tiers, TableCost(gpu_like)) for _ in range(2))
    every._span = lambda depth: every.depth  # (the reference: every depth, as before)
    assert span._span(15) == 16 and span._span(1) == 8 and span._span(57) == 63 and span._span(63) == 63
    assert AdaptivePolicy(TIERS, TableCost(gpu_like))._span(4) == 6  # (a tree 6 deep: every depth)
    rows = [span.new_row() for _ in range(12)]
    assert [every.new_row() for _ in rows] == rows
    caps = [15] * len(rows)
    for step in range(300):
        n = 12 if step < 200 else 3  # a wide batch, then a narrow one (its every observation folded at once)
        for p in (span, every):
            tier = p.choose([(r, c) for r, c in zip(rows[:n], caps)], n, 512, context=300)
            p.launched(tier)
        assert span._last_rates[1].tobytes() == every._last_rates[1].tobytes(), step
        if tier == 0:
            hits = rng.integers(0, 2, n).tolist()
            for p in (span, every):
                p.observe_first(rows[:n], hits)
            continue
        offered = [min(tiers[tier - 1].steps, c) for c in caps[:n]]
        accepted = [int(rng.integers(0, o + 1)) for o in offered]
        for p in (span, every):
            p.observe(rows[:n], tier, offered, accepted)
        if step % 9 == 4:
            i = int(rng.integers(len(rows)))
            for p in (span, every):
                p.release(rows[i])
            rows[i] = span.new_row()
            assert every.new_row() == rows[i]
        if step % 13 == 6:
            caps[int(rng.integers(n))] = int(rng.choice([1, 4, 15, 40, 63]))
    for p in (span, every):
        p.fold()
    for name in ("mean", "count", "tier_mean", "tier_count", "all_mean", "all_count"):
        assert getattr(span, name).tobytes() == getattr(every, name).tobytes(), name
    assert span._expected_tokens(np.asarray(rows), caps).tobytes() == every._expected_tokens(
        np.asarray(rows), caps).tobytes()


def fold_steps(policy, rows, batch, steps, accepted):
    """Choose, launch and observe `steps` steps of these rows (each accepting `accepted(tier)` drafts
    of its tier's depth); returns the steps after which the records were folded and the tiers chosen."""
    folds, picks = [], []
    for step in range(steps):
        version = policy.version
        tier = policy.choose([(r, FULL.steps) for r in rows], batch, 128)
        policy.launched(tier)
        picks.append(tier)
        if tier:
            depth = policy.tiers[tier - 1].steps
            policy.observe(rows, tier, [depth] * len(rows), [min(accepted(tier), depth)] * len(rows))
        if policy.version != version:
            folds.append(step)
    return folds, picks


def test_a_full_batch_that_keeps_its_pick_folds_less_often_and_catches_up_when_it_changes():
    """In a batch wider than BACKOFF_ROWS, each fold whose estimate repeats the pick before it doubles
    the interval to the next fold, up to refresh_max; a new pick brings it back to `refresh`; a new
    batch bucket folds what is pending first. A narrower batch keeps folding every `refresh` (or at
    once), and refresh_max=0 keeps the interval at `refresh`."""
    from specheads.runtime.policy import BACKOFF_ROWS

    policy = AdaptivePolicy(TIERS, TableCost(gpu_like), full_share=0)
    assert (policy.refresh, policy.refresh_max) == (4, 32)
    rows = [policy.new_row() for _ in range(BACKOFF_ROWS + 8)]
    folds, picks = fold_steps(policy, rows, 32, 120, accepted=lambda tier: 6)  # every draft accepted
    gaps = np.diff(folds).tolist()
    assert gaps == [4, 8, 16, 32, 32], gaps  # (the first fold's estimate changed the pick: 4 again)
    assert len(set(picks[4:])) == 1 and picks[-1] > 0
    # the drafts stop being accepted: the records see it at the next fold (32 observations on), the
    # pick changes at most a fold later (the running means take a window to turn), and from then on
    # folds come every `refresh` again
    folds, picks = fold_steps(policy, rows, 32, 60, accepted=lambda tier: 0)
    changed = next(i for i, t in enumerate(picks) if t != picks[0])
    assert folds[0] < changed <= 2 * policy.refresh_max + 1 and picks[changed:] == [0] * (60 - changed)
    assert policy._interval == policy.refresh

    # a new batch bucket folds the pending observations before its choice
    policy.observe(rows, 1, [1] * len(rows), [1] * len(rows))
    assert policy._pending
    policy.choose([(r, FULL.steps) for r in rows], 64, 128)
    assert not policy._pending and policy._interval == policy.refresh

    # off: refresh_max=0 (or at most `refresh`)
    off = AdaptivePolicy(TIERS, TableCost(gpu_like), full_share=0, refresh_max=0)
    wide = [off.new_row() for _ in range(BACKOFF_ROWS + 8)]
    folds, _ = fold_steps(off, wide, 32, 60, accepted=lambda tier: 6)
    assert set(np.diff(folds).tolist()) == {4}
    # a batch of at most BACKOFF_ROWS rows keeps `refresh` too
    narrow = AdaptivePolicy(TIERS, TableCost(gpu_like), full_share=0)
    some = [narrow.new_row() for _ in range(BACKOFF_ROWS)]
    folds, _ = fold_steps(narrow, some, 16, 60, accepted=lambda tier: 6)
    assert set(np.diff(folds).tolist()) == {4}
