"""The speculative engine: greedy output equals plain decoding token for token (eagle3
dynamic / chain / static trees, ngram, oracle trees with deep acceptance and non-trivial KV
commits, torch and Triton commit), sampled output follows the target's distribution
(chi-square), and user errors are clear and leave the engine usable.

Targets are tiny random Llamas held in memory (hidden 32, 4 layers, vocab 64 or 16).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import specheads.runtime.engine as engine_mod
from specheads.runtime.engine import EngineError, SpecEngine
from specheads.runtime.sampling import SamplingParams, warp_probs
from tests.kernels.interpret import interpreted_commit_kernel
from tests.runtime.spec_helpers import (
    OracleDrafter,
    TopDrafter,
    make_target,
    random_head,
    random_prompts,
    train_head,
)

VOCAB = 64
MAX_LEN = 100
NEW = 30
# prompts of different lengths; the trained head saw the target's continuations of all of them
TRAIN_PROMPTS = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
PROMPTS = TRAIN_PROMPTS[:4]

CONFIGS = {
    "dynamic": dict(method="eagle3", num_steps=4, topk=3, num_draft_tokens=8),
    "chain": dict(method="eagle3", num_steps=4, topk=1),
    "static": dict(method="eagle3", static_tree="0;1;0,0;0,1;1,0;0,0,0"),
    "ngram": dict(method="ngram", num_draft_tokens=6),
}
EAGLE = ["dynamic", "chain", "static"]


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def heads(target):
    return {"random": random_head(target, seed=1), "trained": train_head(target, TRAIN_PROMPTS, new_tokens=40)}


@pytest.fixture(scope="module")
def ar_outputs(target):
    res = SpecEngine(target, method="ar", max_len=MAX_LEN).generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    outs = [r.token_ids for r in res]
    assert all(len(o) == NEW for o in outs) and {r.finish_reason for r in res} == {"length"}
    for o in outs:  # the random target is not degenerate: many different tokens, no single repeat
        assert len(set(o)) >= 8, o
    return outs


def _engine(target, heads, config, head="random", max_len=MAX_LEN):
    kw = dict(CONFIGS[config])
    h = heads[head] if kw["method"] == "eagle3" else None
    return SpecEngine(target, h, max_len=max_len, **kw)


def _check_stats(results):
    for r in results:
        assert r.accepted_tokens == sum(r.accept_per_position[1:])
        assert r.accept_per_position[0] == 0
        if r.token_ids:
            # the first token comes from the prefill; each step emits its accepted drafts + 1
            assert len(r.token_ids) <= 1 + r.steps + r.accepted_tokens


# ------------------------------------------------------------------ greedy == ar
GREEDY_CASES = [(c, h) for c in EAGLE for h in ("random", "trained")] + [("ngram", None)]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("config, head", GREEDY_CASES, ids=lambda x: str(x))
def test_greedy_equals_ar(target, heads, ar_outputs, config, head, batch):
    prompts = PROMPTS[:batch]
    res = _engine(target, heads, config, head or "random").generate(prompts, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in res] == ar_outputs[:batch]
    assert [r.finish_reason for r in res] == ["length"] * batch
    _check_stats(res)
    if head == "trained":
        assert sum(r.accepted_tokens for r in res) > 0, "a trained head must get some drafts accepted"
        assert sum(r.steps for r in res) < sum(len(r.token_ids) for r in res)


def test_trained_head_beats_random_head(target, heads):
    params = SamplingParams(max_new_tokens=NEW)
    acc = {h: sum(r.accepted_tokens for r in _engine(target, heads, "dynamic", h).generate(PROMPTS, params))
           for h in ("random", "trained")}
    assert acc["trained"] > acc["random"] + 10, acc


def test_ngram_accepts_on_repetitive_output(tiny_target):
    """The conftest tiny target repeats itself: prompt lookup drafts it, output stays exact."""
    model, _ = tiny_target
    prompts = [[5, 9, 13, 5, 9, 13, 5, 9], [40, 41, 42, 43]]
    params = SamplingParams(max_new_tokens=24)
    ar = SpecEngine(model, method="ar", max_len=128).generate(prompts, params)
    ng = SpecEngine(model, method="ngram", num_draft_tokens=5, max_len=128).generate(prompts, params)
    assert [r.token_ids for r in ng] == [r.token_ids for r in ar]
    assert all(r.accepted_tokens >= 10 for r in ng)
    assert all(r.mean_accept_length >= 1.9 for r in ng)
    _check_stats(ng)


def test_ngram_drafts_a_full_window_on_a_repeated_token():
    from specheads.drafters import DraftContext
    from specheads.drafters.ngram import NgramDrafter

    tree = NgramDrafter(num_draft_tokens=5).propose(DraftContext(1, 0, torch.tensor([9]), [[4, 7, 9, 9, 9, 9]]))
    assert tree.tokens.tolist() == [[9, 9, 9, 9, 9, 9]]
    assert tree.valid.tolist() == [[True] * 6]


# ------------------------------------------------------------------ cache end and stops
END_PROMPTS = random_prompts(4, VOCAB, [5, 20, 33, 39], seed=3)
END_LEN = 40


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cache_end_stops_at_max_len(target, heads, config):
    """prompt + max_new_tokens > max_len: output stops at max_len tokens in all (a prompt of
    max_len - 1 tokens gets exactly one), equal to ar, finish_reason "length"."""
    params = SamplingParams(max_new_tokens=NEW)
    ar = SpecEngine(target, method="ar", max_len=END_LEN).generate(END_PROMPTS, params)
    res = _engine(target, heads, config, max_len=END_LEN).generate(END_PROMPTS, params)
    budgets = [min(NEW, END_LEN - len(p)) for p in END_PROMPTS]
    assert budgets == [30, 20, 7, 1]
    assert [len(r.token_ids) for r in ar] == budgets
    assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    assert [r.finish_reason for r in res] == ["length"] * 4
    for p, r in zip(END_PROMPTS[1:], res[1:]):
        assert len(p) + len(r.token_ids) == END_LEN
    # alone, the row that fills the cache gives the same tokens
    alone = _engine(target, heads, config, max_len=END_LEN).generate([END_PROMPTS[2]], params)
    assert alone[0].token_ids == ar[2].token_ids


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cache_end_at_the_targets_position_limit(config):
    """A tree verified at the end of the cache reaches `depth` positions past it: max_len must
    leave that room (a clear error otherwise), the default max_len is the largest allowed, and
    decoding up to it equals ar (no rotary-table overflow)."""
    target = make_target(seed=0, vocab=VOCAB, max_positions=48)
    kw = dict(CONFIGS[config])
    head = random_head(target, seed=1) if kw["method"] == "eagle3" else None
    with pytest.raises(EngineError, match=r"max_len 48 is too long: the target has 48 positions"):
        SpecEngine(target, head, max_len=48, **kw)
    eng = SpecEngine(target, head, **kw)  # default max_len
    limit = eng.max_len
    assert 30 < limit < 48
    prompts = random_prompts(3, VOCAB, [limit - 3, limit - 12, limit - 1], seed=4)
    params = SamplingParams(max_new_tokens=NEW)
    ar = SpecEngine(target, method="ar", max_len=limit).generate(prompts, params)
    assert [len(r.token_ids) for r in ar] == [3, 12, 1]
    for engine in (eng, SpecEngine(target, head, max_len=limit, **kw)):
        res = engine.generate(prompts, params)
        assert [r.token_ids for r in res] == [r.token_ids for r in ar]
        assert [r.finish_reason for r in res] == ["length"] * 3


def test_ar_can_use_the_whole_context():
    from specheads.runtime.engine import decode

    target = make_target(seed=0, vocab=VOCAB, max_positions=48)
    prompts = random_prompts(1, VOCAB, [40], seed=4)
    res = SpecEngine(target, method="ar", max_len=48).generate(prompts, SamplingParams(max_new_tokens=NEW))
    assert res[0].token_ids == decode(target, prompts, SamplingParams(max_new_tokens=8))[0]


@pytest.mark.parametrize("config", list(CONFIGS) + ["ar"])
def test_stop_tokens(target, heads, ar_outputs, config):
    stops = {ar_outputs[0][6], ar_outputs[2][2]}
    expected, reasons = [], []
    for out in ar_outputs:
        cut = next((i for i, t in enumerate(out) if t in stops), None)
        expected.append(out if cut is None else out[:cut])
        reasons.append("length" if cut is None else "stop")
    assert "stop" in reasons and len({len(e) for e in expected}) > 1  # rows finish at different steps
    params = SamplingParams(max_new_tokens=NEW)
    eng = SpecEngine(target, method="ar", max_len=MAX_LEN) if config == "ar" else _engine(target, heads, config)
    res = eng.generate(PROMPTS, params, sorted(stops))
    assert [r.token_ids for r in res] == expected
    assert [r.finish_reason for r in res] == reasons


@pytest.mark.parametrize("config", list(CONFIGS))
def test_stop_on_the_first_token(target, heads, ar_outputs, config):
    res = _engine(target, heads, config).generate(PROMPTS, SamplingParams(max_new_tokens=NEW), {ar_outputs[1][0]})
    assert res[1].token_ids == [] and res[1].finish_reason == "stop"
    for i in (0, 2, 3):
        out = ar_outputs[i]
        cut = out.index(ar_outputs[1][0]) if ar_outputs[1][0] in out else len(out)
        assert res[i].token_ids == out[:cut]


# ------------------------------------------------------------------ oracle trees: deep acceptance
ORACLE_NEW = 33
ORACLE_LEN = 40  # the 12-token prompt gets 28 tokens: it leaves the batch early


# the commit kernel (and the step's other kernels) interpreted in the harder order only: an
# interpreted run is slow (the plain-decoding reference runs on torch)
@pytest.mark.parametrize("commit,race", [("torch", False), ("torch", True), ("triton", True)],
                         ids=["random-order-torch", "race-order-torch", "race-order-triton"])
def test_oracle_tree_accepts_three_levels(target, monkeypatch, commit, race):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    params = SamplingParams(max_new_tokens=ORACLE_NEW)
    ar = SpecEngine(target, method="ar", max_len=ORACLE_LEN).generate(PROMPTS, params)  # the reference: torch
    if commit == "triton":
        triton_calls = interpreted_commit_kernel(monkeypatch)
    budgets = [min(ORACLE_NEW, ORACLE_LEN - len(p)) for p in PROMPTS]
    assert [len(r.token_ids) for r in ar] == budgets and len(set(budgets)) > 1

    oracle = OracleDrafter(PROMPTS, [r.token_ids for r in ar], VOCAB, seed=5, race=race)
    eng = SpecEngine(target, method="ngram", max_len=ORACLE_LEN)
    eng.drafter = oracle  # duck-typed drafter: num_draft, reset/select/commit/propose
    commits = []
    real_commit = engine_mod.commit_kv

    def recording(cache, base, src, n_acc):
        commits.append((src.cpu().clone(), n_acc.cpu().clone(), [list(p) for p in oracle.paths]))
        return real_commit(cache, base, src, n_acc)

    monkeypatch.setattr(engine_mod, "commit_kv", recording)
    res = eng.generate(PROMPTS, params)

    assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    assert [r.finish_reason for r in res] == ["length"] * 4
    for r, budget in zip(res, budgets):
        steps = math.ceil((budget - 1) / 4)  # one token from the prefill, then 4 per step
        assert r.steps == steps
        # every step accepted all 3 drafts; the last one's count only what the budget took
        last = budget - 1 - 4 * (steps - 1) - 1
        assert r.accepted_tokens == 3 * (steps - 1) + last == budget - 1 - steps
        assert r.accept_per_position[1:4] == [steps - 1 + (last >= k) for k in (1, 2, 3)]
        assert r.mean_accept_length == pytest.approx((budget - 1) / steps)
    # every commit moved the oracle's correct path; some paths were not in place already
    assert commits and all(torch.equal(n, torch.full_like(n, 4)) for _, n, _ in commits)
    for src, _, paths in commits[::2]:  # k and v commits come in pairs
        assert src.tolist() == paths
    if race:
        assert all(row == [0, 2, 3, 4] for src, _, _ in commits for row in src.tolist())
    else:
        assert any(row != [0, 1, 2, 3] for src, _, _ in commits for row in src.tolist())
    if commit == "triton":
        assert len(triton_calls) == len(commits)


# ------------------------------------------------------------------ sampling: chi-square
Z_999 = 3.090232306167813  # standard normal 0.999 quantile
SAMPLES = 2000
SVOCAB = 16
SPROMPT = [3, 7, 1, 12]


def chi2_critical(df: int, z: float = Z_999) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic over cells with expected count >= min_expected, the remaining
    cells lumped into one (when that one reaches min_expected too). Returns (stat, df)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    expected = n * probs
    big = expected >= min_expected
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() >= min_expected:
        obs = torch.cat([obs, counts[~big].sum()[None]])
        exp = torch.cat([exp, expected[~big].sum()[None]])
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, len(obs) - 1


def test_chi2_critical_values():
    for df, table in [(5, 20.515), (10, 29.588), (50, 86.661), (100, 149.449)]:  # tables; poor below df 5
        assert chi2_critical(df) == pytest.approx(table, rel=0.015)


@pytest.fixture(scope="module")
def starget():
    return make_target(seed=1, vocab=SVOCAB, std=0.3, max_positions=64)


def _exact_joint(target, params) -> torch.Tensor:
    """p(t1, t2, t3 | prompt) under the warped target distribution, [V, V, V]."""
    v, n = SVOCAB, len(SPROMPT)
    t1 = torch.arange(v).repeat_interleave(v)
    t2 = torch.arange(v).repeat(v)
    ids = torch.cat([torch.tensor(SPROMPT).expand(v * v, -1), t1[:, None], t2[:, None]], 1)
    with torch.no_grad():
        logits = target(ids).logits
    p1 = warp_probs(logits[0, n - 1], params)
    p2 = warp_probs(logits[::v, n], params)  # [t1, t2]
    p3 = warp_probs(logits[:, n + 1], params).reshape(v, v, v)
    return p1[:, None, None] * p2[:, :, None] * p3


def _sample_triples(engine, params) -> tuple[torch.Tensor, int]:
    """Counts of the sampled (t1, t2, t3) and the drafts the verify steps accepted (past t3 too)."""
    raw = _recording(engine)
    res = engine.generate([SPROMPT] * SAMPLES, params)
    assert all(len(r.token_ids) == 3 for r in res)
    toks = torch.tensor([r.token_ids for r in res])
    counts = torch.bincount(toks[:, 0] * SVOCAB * SVOCAB + toks[:, 1] * SVOCAB + toks[:, 2],
                            minlength=SVOCAB ** 3).reshape(SVOCAB, SVOCAB, SVOCAB)
    return counts, sum(o.accepted for o in raw)


def _assert_matches(counts, exact):
    assert int(counts[exact == 0].sum()) == 0, "sampled a token the warped distribution excludes"
    for name, c, p in [("(t1, t2)", counts.sum(2), exact.sum(2)), ("(t1, t2, t3)", counts, exact)]:
        stat, df = chi_square(c, p)
        assert df >= 5, name
        assert stat < chi2_critical(df), f"{name}: chi2 {stat:.1f} >= {chi2_critical(df):.1f} (df {df})"


SAMPLING_CASES = {
    "t1": SamplingParams(temperature=1.0, seed=0, max_new_tokens=3),
    "topk-topp": SamplingParams(temperature=0.9, top_k=6, top_p=0.8, seed=1, max_new_tokens=3),
}


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_matches_target_distribution_eagle3(starget, case):
    """t1 comes from the prefill, t2 from the first step's root, t3 from the accepted child
    when t2 was drafted (else from the next step's root): the joint of all three must be
    the target's own."""
    params = SAMPLING_CASES[case]
    head = random_head(starget, seed=2)
    eng = SpecEngine(starget, head, method="eagle3", num_steps=3, topk=3, num_draft_tokens=8, max_len=16)
    counts, accepted = _sample_triples(eng, params)
    assert accepted > 100, "too few accepted drafts for the test to say anything about acceptance"
    _assert_matches(counts, _exact_joint(starget, params))


@pytest.mark.parametrize("case, shape", [("t1", (3, 3, 8)), ("t1", (3, 1, 3)), ("topk-topp", (3, 3, 8))],
                         ids=["tree", "chain", "tree-topk-topp"])
def test_sampling_matches_target_distribution_mtp(starget, case, shape):
    """The same joint with an MTP head drafting a tree or a chain (every drafter goes through one
    verify), at temperature 1 and with temperature, top-k and top-p."""
    params = SAMPLING_CASES[case]
    head = random_head(starget, seed=3, kind="mtp", num_modules=3)
    steps, topk, n = shape
    eng = SpecEngine(starget, head, num_steps=steps, topk=topk, num_draft_tokens=n, max_len=16)
    counts, accepted = _sample_triples(eng, params)
    assert accepted > 100, "too few accepted drafts for the test to say anything about acceptance"
    _assert_matches(counts, _exact_joint(starget, params))


def test_sampling_matches_target_distribution_deep_tree(starget):
    """A drafter proposing the target's own top tokens (4 children, 2 grandchildren each):
    most rows accept, the distribution must still be the target's."""
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=3)
    eng = SpecEngine(starget, method="ngram", max_len=16)
    eng.drafter = TopDrafter(starget, widths=(4, 2))
    counts, accepted = _sample_triples(eng, params)
    assert accepted > SAMPLES  # many rows accept t3 and beyond in one step
    _assert_matches(counts, _exact_joint(starget, params))


def test_chi_square_catches_a_biased_sampler(starget):
    params = SAMPLING_CASES["t1"]
    exact = _exact_joint(starget, params)
    # (1) draws from a slightly sharpened distribution
    biased = exact.flatten() ** 1.3
    biased = biased / biased.sum()
    draws = torch.multinomial(biased, SAMPLES, replacement=True, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=SVOCAB ** 3).reshape(exact.shape)
    stat, df = chi_square(counts, exact)
    assert stat > chi2_critical(df), (stat, chi2_critical(df))
    # while draws from the exact distribution pass
    draws = torch.multinomial(exact.flatten(), SAMPLES, replacement=True, generator=torch.Generator().manual_seed(0))
    stat, df = chi_square(torch.bincount(draws, minlength=SVOCAB ** 3), exact)
    assert stat < chi2_critical(df)
    # (2) the engine itself at the wrong temperature
    head = random_head(starget, seed=2)
    eng = SpecEngine(starget, head, method="eagle3", num_steps=3, topk=3, num_draft_tokens=8, max_len=16)
    counts, _ = _sample_triples(eng, SamplingParams(temperature=0.8, seed=0, max_new_tokens=3))
    stat, df = chi_square(counts, exact)
    assert stat > chi2_critical(df), (stat, chi2_critical(df))


# ------------------------------------------------------------------ errors
def test_construction_errors(target):
    with pytest.raises(EngineError, match=re.escape("method 'hydra' is not one of ar, ngram, ngram-host, draft_model, eagle3, mtp, medusa, eagle")):
        SpecEngine(target, method="hydra")
    with pytest.raises(EngineError, match=r"eagle3 needs a draft head"):
        SpecEngine(target, None, method="eagle3", max_len=64)
    with pytest.raises(EngineError, match=r"max_len 129 .*the target has 128 positions"):
        SpecEngine(target, method="ar", max_len=129)
    with pytest.raises(EngineError, match=r"max_len 128 is too long: the target has 128 positions.*at most 123"):
        SpecEngine(target, random_head(target), method="eagle3", num_steps=4, max_len=128)


def _mismatched_heads():
    return {
        "hidden": (random_head(make_target(hidden=48)), "head expects target hidden size 48, target has 32"),
        "vocab": (random_head(make_target(vocab=80)), "head expects vocab 80, target has 64"),
        "layers": (random_head(make_target(layers=8)), "head reads target layers [1, 3, 4], target has 4"),
    }


@pytest.mark.parametrize("which", ["hidden", "vocab", "layers"])
def test_head_target_mismatch(target, which):
    head, message = _mismatched_heads()[which]
    with pytest.raises(EngineError, match="draft head does not match the target: .*" + re.escape(message)):
        SpecEngine(target, head, method="eagle3", max_len=64)


def test_head_target_mismatch_lists_every_problem(target):
    head = random_head(make_target(vocab=80, layers=8))
    with pytest.raises(EngineError) as e:
        SpecEngine(target, head, max_len=64)
    assert "head expects vocab 80, target has 64" in str(e.value)
    assert "head reads target layers [1, 3, 4], target has 4" in str(e.value)


def test_head_hidden_size_mismatch_is_an_engine_error(target):
    """The head consumes the target's token embeddings: its hidden size must be the target's
    (it used to pass the check and fail mid-generation with a shape RuntimeError)."""
    head = random_head(target, hidden_size=48, num_attention_heads=4, head_dim=12, intermediate_size=64)
    with pytest.raises(EngineError, match=r"head hidden size 48 differs from the target's embedding width 32"):
        SpecEngine(target, head, max_len=64)


@pytest.mark.parametrize("config", list(CONFIGS) + ["ar"])
def test_generate_errors_leave_the_engine_usable(target, heads, ar_outputs, config):
    eng = SpecEngine(target, method="ar", max_len=MAX_LEN) if config == "ar" else _engine(target, heads, config)
    params = SamplingParams(max_new_tokens=NEW)
    # a first good run, so that errors come after state exists
    assert [r.token_ids for r in eng.generate(PROMPTS, params)] == ar_outputs
    too_long = [1] * MAX_LEN
    with pytest.raises(EngineError, match=re.escape(f"prompt 1 has {MAX_LEN} tokens; the cache holds {MAX_LEN}")):
        eng.generate([PROMPTS[0], too_long], params)
    with pytest.raises(EngineError, match=re.escape(f"prompt 0 has {MAX_LEN + 5} tokens; the cache holds {MAX_LEN}")):
        eng.generate([[2] * (MAX_LEN + 5)], params)
    with pytest.raises(EngineError, match="prompt 2 is empty"):
        eng.generate([PROMPTS[0], PROMPTS[1], []], params)
    for bad, field in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                       ({"top_k": -2}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens")]:
        with pytest.raises(ValueError, match=field):
            eng.generate(PROMPTS, SamplingParams(**{"max_new_tokens": NEW, **bad}))
    # the same engine still decodes exactly, in a different batch shape too
    assert [r.token_ids for r in eng.generate(PROMPTS, params)] == ar_outputs
    assert [r.token_ids for r in eng.generate(PROMPTS[2:0:-1], params)] == [ar_outputs[2], ar_outputs[1]]
    # a prompt of max_len - 1 tokens is allowed: one token
    one = eng.generate([[3] * (MAX_LEN - 1)], params)[0]
    assert len(one.token_ids) == 1 and one.finish_reason == "length"


@pytest.mark.parametrize("config", list(CONFIGS) + ["ar"])
def test_empty_batch(target, heads, config):
    eng = SpecEngine(target, method="ar", max_len=MAX_LEN) if config == "ar" else _engine(target, heads, config)
    assert eng.generate([], SamplingParams(max_new_tokens=4)) == []
    assert [r.token_ids for r in eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))] == [
        SpecEngine(target, method="ar", max_len=MAX_LEN).generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))[0]
        .token_ids]


def test_memory_plan_counts_what_the_engine_allocates():
    target = make_target()
    head = random_head(target)
    engine = SpecEngine(target, head, **CONFIGS["dynamic"], max_len=MAX_LEN, max_batch=3)
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))  # allocates
    plan = engine.memory_plan()
    kv = engine.cache.kv
    assert plan["kv_cache"] == kv.numel() * kv.element_size()
    d = engine.drafter
    held = sum(t.numel() * t.element_size() for t in (d.k, d.v, d.pending_aux))
    assert held <= plan["drafter"] <= 1.1 * held + 2 * 4 * d.masks.numel()
    assert plan["step"] > 0


def test_a_cache_the_card_cannot_hold_is_refused_before_allocating(monkeypatch):
    target = make_target()
    engine = SpecEngine(target, random_head(target), **CONFIGS["dynamic"], max_len=MAX_LEN, max_batch=64)
    need = sum(engine.memory_plan().values())
    monkeypatch.setattr(engine, "device", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (need // 4, 2 * need))
    with pytest.raises(EngineError, match=r"max_batch 64 x max_len 100 needs .* lower --max-batch \(about 1[0-9] fit"):
        engine._check_memory(65)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (need + 1, 2 * need))
    engine._check_memory(65)  # fits: no error


def test_host_drafter_rows_never_used_step_as_a_lone_root():
    """A padded batch (3 requests in a bucket of 4) steps row 3, which no request has used: its
    tree must be the root alone at depth 0, so its accepted path is [0] (a root at depth 1 gave
    the path [-1, ...]: the commit read the slot before the cache, an illegal address on the GPU
    when it was row 0 during graph capture)."""
    target = make_target()
    engine = SpecEngine(target, method="ngram-host", num_draft_tokens=4, max_len=MAX_LEN, max_batch=4)
    engine.buckets = True  # the graphs' shapes, eagerly: batch bucket 4 for 3 rows
    engine._allocate()
    t = engine.tree_in
    assert (t.depth[:, 0] == 0).all() and (t.parents[:, 0] == -1).all() and not t.valid.any()
    engine.overlap = False
    for p in PROMPTS[:3]:
        engine.add(engine_mod.Request(p, SamplingParams(max_new_tokens=5)))
    engine.step()  # prefill + one step over the bucket of 4
    assert engine.out[3, 0].item() == 1, "the unused row accepts its root only"
    assert engine.out[3, 4].item() == 0 and (engine.out[3, 5:] == 0).all()


def test_acceptance_counts_only_what_the_last_step_produced(target, heads, ar_outputs):
    """A request's last verify step may accept drafts past its token budget or its stop token;
    GenerationResult counts only what the step produced, so every returned token (and a stop)
    is the prefill's, a verify step's bonus or a counted draft: tokens = 1 + steps + accepted."""
    overshoot = 0
    for budget in (5, 7, 11, 13):
        for stop_at in (None, 3):  # no stop token; the 4th token of each plain output as a stop
            for p, out in zip(PROMPTS, ar_outputs):
                engine = SpecEngine(target, heads["trained"], max_len=MAX_LEN, num_steps=4, topk=1)
                raw = _recording(engine)
                stops = () if stop_at is None else (out[stop_at],)
                r = engine.generate([p], SamplingParams(max_new_tokens=budget), stop_ids=stops)[0]
                cut = min(budget, out.index(stops[0]) if stops else budget)
                assert r.token_ids == out[:cut]
                stopped = r.finish_reason == "stop"
                assert stopped == (bool(stops) and out.index(stops[0]) < budget)
                assert len(r.token_ids) + stopped == 1 + r.steps + r.accepted_tokens
                last = [o for o in raw if o.finish_reason is not None and not o.prefill]
                overshoot += sum(o.accepted > len(o.new_tokens) + (o.finish_reason == "stop") - 1 for o in last)
    assert overshoot > 0, "no last step accepted past its budget or stop: the case is not exercised"


def _recording(engine) -> list:
    """Every StepOutput the engine's steps return from now on (generate() calls engine.step)."""
    raw, step = [], engine.step

    def recorded():
        outs = step()
        raw.extend(outs)
        return outs

    engine.step = recorded
    return raw
