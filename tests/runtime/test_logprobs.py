"""Log-probabilities of the emitted tokens: the target's own raw distribution at each token (as a
plain forward over the prefix computes it), the same with speculation on and off, for greedy and
sampled requests; rows that do not ask get none."""

from __future__ import annotations

import pytest

from specheads.runtime.engine import InvalidRequest, Request, SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.runtime.spec_helpers import assert_targets_logprobs, make_target, random_head, random_prompts

VOCAB = 64
PROMPTS = random_prompts(3, VOCAB, [5, 9, 3], seed=4)
CONFIGS = {
    "ar": dict(method="ar"),
    "eagle3": dict(method="eagle3", num_steps=3, topk=2, num_draft_tokens=5),
    "ngram": dict(method="ngram", num_draft_tokens=4),
}


@pytest.fixture(scope="module")
def target():
    return make_target(seed=2, vocab=VOCAB)


def run(target, config, temperature, top=3, new=12, buckets=False):
    head = random_head(target) if config["method"] == "eagle3" else None
    engine = SpecEngine(target, head, **config, max_len=64, max_batch=4)
    engine.buckets = buckets  # the CUDA graphs' shapes (a padded batch), run eagerly
    handles = {}
    for i, p in enumerate(PROMPTS):
        want = top if i != 1 else None  # the middle request does not ask
        h = engine.add(Request(p, SamplingParams(temperature=temperature, seed=11 + i, max_new_tokens=new),
                               top_logprobs=want))
        handles[h] = i
    tokens, lps = {i: [] for i in handles.values()}, {i: [] for i in handles.values()}
    while engine.has_work:
        for out in engine.step():
            i = handles[out.handle]
            tokens[i] += out.new_tokens
            if i == 1:
                assert out.logprobs is None
            else:
                assert out.logprobs is not None and len(out.logprobs) == len(out.new_tokens)
                lps[i] += out.logprobs
    return tokens, lps


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("method", list(CONFIGS))
def test_logprobs_are_the_targets_own(target, method, temperature):
    tokens, lps = run(target, CONFIGS[method], temperature)
    for i in (0, 2):
        assert_targets_logprobs(target, PROMPTS[i], tokens[i], lps[i], 3)


@pytest.mark.parametrize("buckets", [False, True])
def test_logprobs_equal_with_and_without_speculation(target, buckets):
    plain_tok, plain = run(target, CONFIGS["ar"], 0.8, buckets=buckets)
    spec_tok, spec = run(target, CONFIGS["eagle3"], 0.8, buckets=buckets)
    assert spec_tok == plain_tok
    for i in (0, 2):
        assert [lp for lp, _ in spec[i]] == pytest.approx([lp for lp, _ in plain[i]], abs=1e-5)


def test_top_logprobs_out_of_range_is_refused(target):
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=2)
    with pytest.raises(InvalidRequest, match="top_logprobs must be in 0..20"):
        engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=2), top_logprobs=21))
