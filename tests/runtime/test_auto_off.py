"""Per-request auto-off: a request whose drafts are rarely accepted stops drafting (its row
verifies only its next token) and probes again later; output stays the target's own."""

from __future__ import annotations

import pytest

from specheads.runtime.engine import Request, SpecControl, SpecEngine
from specheads.runtime.sampling import InvalidRequest, SamplingParams
from tests.runtime.spec_helpers import ar_tokens, make_target, random_head, random_prompts

VOCAB = 64
PROMPTS = random_prompts(4, VOCAB, [5, 9, 3, 7], seed=2)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


def _run(engine, requests):
    handles = [engine.add(r) for r in requests]
    got = {h: [] for h in handles}
    reasons = {h: [] for h in handles}
    while engine.has_work:
        for out in engine.step():
            got[out.handle] += out.new_tokens
            if not out.prefill:
                reasons[out.handle].append((out.draft_depth, out.no_draft_reason))
    return [got[h] for h in handles], [reasons[h] for h in handles]


def test_a_request_below_its_threshold_stops_drafting_and_probes_again(target):
    head = random_head(target, seed=1)  # random weights: drafts are almost never accepted
    params = SamplingParams(max_new_tokens=40)
    ref = ar_tokens(target, PROMPTS, params.max_new_tokens)
    engine = SpecEngine(target, head, num_steps=3, topk=2, num_draft_tokens=6, max_len=64, max_batch=4)
    auto = SpecControl(enabled="auto", min_acceptance=0.5, window=3, probe_every=5)
    requests = [Request(PROMPTS[0], params, spec=auto), Request(PROMPTS[1], params),
                Request(PROMPTS[2], params, spec=SpecControl(enabled=False)), Request(PROMPTS[3], params, spec=auto)]
    outs, reasons = _run(engine, requests)
    assert outs == ref
    for r in (reasons[0], reasons[3]):
        kinds = [reason for _, reason in r]
        assert "auto" in kinds, "a request whose drafts fail should switch drafting off"
        first_off = kinds.index("auto")
        assert first_off >= 3  # not before a full window of drafting steps
        # a probe: drafting again after probe_every plain steps
        assert None in kinds[first_off:], kinds
    assert all(reason is None for _, reason in reasons[1])  # enabled: always drafts
    assert all(reason == "request" and depth == 0 for depth, reason in reasons[2])


def test_auto_keeps_drafting_while_acceptance_holds(target):
    from tests.runtime.spec_helpers import train_head

    head = train_head(target, random_prompts(8, VOCAB, [5, 9, 3, 7, 4, 6, 8, 2], seed=2), new_tokens=40)
    params = SamplingParams(max_new_tokens=30)
    auto = SpecControl(enabled="auto", min_acceptance=0.05, window=2, probe_every=4)
    engine = SpecEngine(target, head, num_steps=3, topk=2, num_draft_tokens=6, max_len=64, max_batch=2)
    _, reasons = _run(engine, [Request(PROMPTS[0], params, spec=auto)])
    assert all(reason is None for _, reason in reasons[0])


def test_bad_auto_settings_are_refused(target):
    engine = SpecEngine(target, random_head(target), max_len=64)
    for spec, msg in ((SpecControl(enabled="sometimes"), "true, false or \"auto\""),
                      (SpecControl(enabled="auto", min_acceptance=1.5), "min_acceptance must be in"),
                      (SpecControl(enabled="auto", window=0), "window must be in")):
        with pytest.raises(InvalidRequest, match=msg):
            engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=4), spec=spec))
