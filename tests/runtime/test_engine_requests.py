"""The engine's request API (what the server drives): requests join and leave between steps
and still equal plain decoding, per-request speculation control, seeded sampling that is
the same in any batch and under speculation, aborts, and request errors."""

from __future__ import annotations

import pytest
import torch

from specheads.runtime.engine import EngineError, Request, SpecControl, SpecEngine, prefill_groups
from specheads.runtime.sampling import InvalidRequest, RowParams, SamplingParams, gumbel_noise, sample_rows
from tests.runtime.spec_helpers import make_target, random_prompts, train_head
from tests.kernels.interpret import interpret_triton, needs_triton

VOCAB = 64
PROMPTS = random_prompts(6, VOCAB, [3, 7, 1, 12, 5, 9], seed=11)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def head(target):
    return train_head(target, PROMPTS, new_tokens=40)


def _ar(target, prompts, params):
    return [r.token_ids for r in SpecEngine(target, method="ar", max_len=100).generate(prompts, params)]


def _drive(engine, schedule, params_of, spec_of=lambda i: SpecControl(), prompts=PROMPTS):
    """schedule[i] = the step before which request i (prompts[i]) joins. Returns tokens and outputs per request."""
    tokens, outs, handle_of = {}, {}, {}
    step = 0
    while len(handle_of) < len(schedule) or engine.has_work:
        for i, at in enumerate(schedule):
            if at == step:
                handle_of[engine.add(Request(prompts[i], params_of(i), spec=spec_of(i)))] = i
        for o in engine.step():
            i = handle_of[o.handle]
            tokens.setdefault(i, []).extend(o.new_tokens)
            outs.setdefault(i, []).append(o)
        step += 1
    return [tokens[i] for i in range(len(schedule))], [outs[i] for i in range(len(schedule))]


@pytest.mark.parametrize("method", ["eagle3", "ngram", "ar"])
def test_requests_joining_mid_flight_equal_plain_decoding(target, head, method):
    """Six requests join at different steps into 4 rows (some wait for a free row) with
    different budgets: each output equals its own plain greedy decode."""
    budgets = [20, 8, 25, 5, 14, 11]
    expected = [_ar(target, [p], SamplingParams(max_new_tokens=n))[0] for p, n in zip(PROMPTS, budgets)]
    engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                        num_draft_tokens=8, max_len=100, max_batch=4)
    schedule = [0, 0, 1, 2, 3, 3]
    tokens, handle_of, step = {}, {}, 0
    while len(handle_of) < 6 or engine.has_work:
        for i, at in enumerate(schedule):
            if at <= step and i not in handle_of.values() and engine.free_slots > 0:
                handle_of[engine.add(Request(PROMPTS[i], SamplingParams(max_new_tokens=budgets[i])))] = i
        assert engine.active <= 4
        for o in engine.step():
            tokens.setdefault(handle_of[o.handle], []).extend(o.new_tokens)
        step += 1
    assert [tokens[i] for i in range(6)] == expected


def test_prefill_groups_bound_the_padded_tokens_of_one_forward():
    assert prefill_groups([3, 7, 1, 12, 5], 16) == [[0, 1], [2], [3], [4]]
    assert prefill_groups([4, 4, 4, 4], 16) == [[0, 1, 2, 3]]
    assert prefill_groups([40, 2], 16) == [[0], [1]]  # longer than the budget: alone
    assert prefill_groups([], 16) == []


@pytest.mark.parametrize("method", ["eagle3", "ar"])
def test_many_joining_prompts_prefill_in_bounded_groups(target, head, method, monkeypatch):
    """Six prompts joining at once with a 16-token prefill budget: several forwards, each
    within budget, and every output still equals its own plain decode."""
    expected = _ar(target, PROMPTS, SamplingParams(max_new_tokens=12))
    engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                        num_draft_tokens=8, max_len=100, max_batch=6, prefill_tokens=16)
    sizes = []
    real = SpecEngine._prefill_forward

    def spy(self, start, ids, lens, *args):
        sizes.append(tuple(ids.shape))
        return real(self, start, ids, lens, *args)

    monkeypatch.setattr(SpecEngine, "_prefill_forward", spy)
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12))
    assert [r.token_ids for r in out] == expected
    assert len(sizes) > 1 and all(k * w <= 16 or k == 1 for k, w in sizes)
    with pytest.raises(EngineError, match="prefill_tokens"):
        SpecEngine(target, method="ar", max_len=100, prefill_tokens=0)


def test_speculation_off_per_request(target, head):
    engine = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4)
    params = lambda i: SamplingParams(max_new_tokens=20)  # noqa: E731
    spec = lambda i: SpecControl(enabled=i % 2 == 0)  # noqa: E731
    tokens, outs = _drive(engine, [0, 0, 0, 0], params, spec)
    assert tokens == _ar(target, PROMPTS[:4], SamplingParams(max_new_tokens=20))
    for i, steps in enumerate(outs):
        verify = [o for o in steps if not o.prefill]
        if i % 2:  # off: one token per step, nothing drafted
            assert all(o.drafted == 0 and o.accept_length == 1 and o.draft_depth == 0 for o in verify)
        else:
            assert all(o.drafted == 8 for o in verify) and sum(o.accepted for o in verify) > 0


def test_smaller_tree_per_request(target, head):
    engine = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4)
    _, outs = _drive(engine, [0, 0], lambda i: SamplingParams(max_new_tokens=20),
                     lambda i: SpecControl(num_steps=2, num_draft_tokens=3) if i == 0 else SpecControl())
    small = [o for o in outs[0] if not o.prefill]
    assert all(o.drafted <= 3 and o.draft_depth <= 2 and o.accepted <= 2 for o in small)
    assert max(o.draft_depth for o in outs[1]) > 2  # the full tree goes deeper


def test_seeded_sampling_is_the_same_in_any_batch_and_under_speculation(target, head):
    """The noise for the token at position t of a request is a hash of (seed, t, token), so a
    seeded request gives the same tokens alone, in a batch, and with speculation on."""
    params = lambda i: SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i, max_new_tokens=16)  # noqa: E731
    alone = [_drive(SpecEngine(target, method="ar", max_len=100, max_batch=1), [0],
                    lambda _, i=i: params(i), prompts=PROMPTS[i:])[0][0] for i in range(3)]
    ar_batch, _ = _drive(SpecEngine(target, method="ar", max_len=100, max_batch=4), [0, 1, 0], params)
    spec, outs = _drive(SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4),
                        [0, 1, 0], params)
    assert ar_batch == alone == spec
    assert sum(o.accepted for steps in outs for o in steps) > 0
    other, _ = _drive(SpecEngine(target, method="ar", max_len=100, max_batch=4), [0, 1, 0],
                      lambda i: SamplingParams(temperature=0.8, top_p=0.95, seed=200 + i, max_new_tokens=16))
    assert other != alone


def test_abort_frees_the_row_and_leaves_the_others_exact(target, head):
    engine = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=2)
    params = SamplingParams(max_new_tokens=20)
    a = engine.add(Request(PROMPTS[0], params))
    b = engine.add(Request(PROMPTS[1], params))
    with pytest.raises(EngineError, match="all 2 rows are busy"):
        engine.add(Request(PROMPTS[2], params))
    got = {a: [], b: []}
    for o in engine.step() + engine.step():
        got[o.handle] += o.new_tokens
    engine.abort(a)
    assert engine.free_slots == 1
    c = engine.add(Request(PROMPTS[2], params))
    got[c] = []
    while engine.has_work:
        for o in engine.step():
            assert o.handle != a
            got[o.handle] += o.new_tokens
    expected = _ar(target, PROMPTS[1:3], params)
    assert [got[b], got[c]] == expected


@pytest.mark.parametrize("request_kw, message", [
    (dict(prompt=[]), "prompt is empty"),
    (dict(prompt=[1] * 90, params=SamplingParams(max_new_tokens=20)), r"prompt \(90 tokens\) \+ max_new_tokens \(20\)"),
    (dict(params=SamplingParams(temperature=-1)), "temperature"),
    (dict(spec=SpecControl(num_steps=9)), r"speculation.num_steps must be in 1..4"),
    (dict(spec=SpecControl(num_draft_tokens=0)), r"speculation.num_draft_tokens must be in 1..8"),
])
def test_request_errors(target, head, request_kw, message):
    engine = SpecEngine(target, head, method="eagle3", num_steps=4, topk=3, num_draft_tokens=8, max_len=100,
                        max_batch=2)
    kw = {"prompt": PROMPTS[0], "params": SamplingParams(max_new_tokens=5), **request_kw}
    with pytest.raises(InvalidRequest, match=message):
        engine.add(Request(**kw))
    assert engine.free_slots == 2  # nothing was taken
    engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=5)))
    out = [t for _ in range(6) for o in engine.step() for t in o.new_tokens]
    assert out == _ar(target, PROMPTS[:1], SamplingParams(max_new_tokens=5))[0]


def test_gumbel_noise_is_uniform_and_independent():
    g = gumbel_noise(torch.tensor([1, 2]), torch.tensor([[5, 6], [5, 6]]), 4096)
    u = torch.exp(-torch.exp(-g))  # back to uniforms
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    flat = u.reshape(4, -1)
    corr = torch.corrcoef(flat)
    assert float((corr - torch.eye(4)).abs().max()) < 0.06  # different seeds / positions: unrelated noise
    assert torch.equal(g, gumbel_noise(torch.tensor([1, 2]), torch.tensor([[5, 6], [5, 6]]), 4096))


def test_sample_rows_mixes_greedy_and_sampled_rows():
    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.0]], [[0.0, 3.0, 1.0, 2.0]]])
    rows = RowParams.allocate(2, "cpu")
    rows.set_row(0, SamplingParams(), 0)
    rows.set_row(1, SamplingParams(temperature=1.0, top_k=2), 0)
    draws = [sample_rows(logits, rows, torch.tensor([[p], [p]]), True) for p in range(200)]
    assert all(int(d[0, 0]) == 1 for d in draws)  # greedy row: always the argmax
    second = {int(d[1, 0]) for d in draws}
    assert second == {1, 3}  # top-k 2 keeps tokens 1 and 3, both drawn


@pytest.mark.parametrize("method", ["eagle3", "ngram", "ar"])
def test_graph_bucket_shapes_run_eagerly(target, head, method):
    """The shapes CUDA graphs replay (batch and context rounded up to powers of two, idle
    padding rows stepping along), run eagerly on CPU: outputs equal plain decoding twice in a
    row on one engine, and padding rows stay at an empty context (they used to advance every
    step until their slots ran past the context bucket: a GPU index assert on the next run)."""
    engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                        num_draft_tokens=8, max_len=100, max_batch=8)
    engine.buckets = True
    run = engine._run
    padded = []

    def checked(b, *key):
        n = len(engine.rows)
        padded.append(b > n)
        # (the staging row past the batch, where joins are prefilled, is scratch)
        assert (engine.committed[n:engine.staging] == 0).all(), engine.committed
        return run(b, *key)

    engine._run = checked
    params = SamplingParams(max_new_tokens=30)
    expected = _ar(target, PROMPTS[:3], params)
    for _ in range(2):
        assert [r.token_ids for r in engine.generate(PROMPTS[:3], params)] == expected
    assert any(padded)


def _recording_prefills(target, head, method, max_batch, record):
    """An engine running the graphs' shapes eagerly whose prefill forwards are recorded: (engine,
    the list of record(start, ids, lens) per forward)."""
    engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                        num_draft_tokens=8, max_len=100, max_batch=max_batch)
    engine.buckets = True
    seen = []
    real = engine._prefill_forward

    def recording(start, ids, lens, *args):
        seen.append(record(start, ids, lens))
        return real(start, ids, lens, *args)

    engine._prefill_forward = recording
    return engine, seen


@pytest.mark.parametrize("method", ["eagle3", "ar"])
def test_single_joins_prefill_at_bucket_widths(target, head, method):
    """A request joining alone runs its prefill at the graph's bucket width (prompt padded on
    the right, into slots nobody reads before they are rewritten) in the staging row, then
    moves to its row (also beside a running row): outputs equal plain decoding."""
    engine, widths = _recording_prefills(target, head, method, 2, lambda start, ids, lens: (
        start, ids.shape[1], lens.tolist()))
    params = SamplingParams(max_new_tokens=20)
    prompts = PROMPTS[:4]
    got = []
    for p in prompts:  # one at a time: every join is a single request
        got += [r.token_ids for r in engine.generate([p], params)]
    both = engine.generate(prompts[:3], params)  # two rows: the third joins alone into a freed row
    assert got == _ar(target, prompts, params)
    assert [r.token_ids for r in both] == got[:3]
    single = [w for w in widths if len(w[2]) == 1]
    assert single and all(w[1] >= 16 and w[1] & (w[1] - 1) == 0 and w[1] >= w[2][0] for w in single)
    assert any(w[1] > w[2][0] for w in single)  # padded
    # prefilled in the staging row (one graph per width serves every row), then moved
    assert all(w[0] == engine.staging == engine.max_batch for w in single)


@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_a_few_joins_prefill_alone_at_bucket_widths(target, head, method, monkeypatch):
    """Up to STAGED_PREFILL_PROMPTS prompts joining at one step each replay the captured prefill
    of one prompt (the staging row, bucket widths), not one eager forward of them all; more go
    in one forward. Outputs equal plain decoding either way."""
    import specheads.runtime.engine as engine_module

    engine, calls = _recording_prefills(target, head, method, 4, lambda start, ids, lens: (start, ids.shape[0]))
    params = SamplingParams(max_new_tokens=20)
    prompts = PROMPTS[:4]
    expected = _ar(target, prompts, params)
    assert [r.token_ids for r in engine.generate(prompts, params)] == expected
    assert calls == [(engine.staging, 1)] * 4  # four joined at once: four single prefills
    monkeypatch.setattr(engine_module, "STAGED_PREFILL_PROMPTS", 3)
    calls.clear()
    assert [r.token_ids for r in engine.generate(prompts, params)] == expected
    assert calls == [(0, 4)]  # more than the limit: one forward of the four, in their rows


def _run_requests(engine, requests):
    """Add every request at once, step to the end: per request its tokens, finish reason and the
    first token's logprobs (where asked)."""
    handles = [engine.add(r) for r in requests]
    got = {h: [[], None, None] for h in handles}
    while engine.has_work:
        for o in engine.step():
            entry = got[o.handle]
            entry[0] += o.new_tokens
            entry[1] = o.finish_reason or entry[1]
            if o.prefill:
                entry[2] = o.logprobs
    return [got[h] for h in handles]


def test_staged_joins_queue_their_prefills_and_read_them_together(target, head, monkeypatch):
    """Prompts joining at one step, each through its width's prefill in the staging row, are all
    queued before their first tokens are read in one sync (one read for the four here); a request
    that ends at its first token, one that asks for logprobs and a seeded sampled one among them
    get what an engine prefilling them in their own rows (one forward) gives."""
    requests = [Request(PROMPTS[0], SamplingParams(max_new_tokens=12)),
                Request(PROMPTS[1], SamplingParams(max_new_tokens=1)),
                Request(PROMPTS[3], SamplingParams(max_new_tokens=12), top_logprobs=2),
                Request(PROMPTS[4], SamplingParams(max_new_tokens=12, temperature=1.0, seed=5))]
    staged = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4)
    staged.buckets = True
    reads = []
    real = staged._read_prefill
    monkeypatch.setattr(staged, "_read_prefill", lambda joined: reads.append(len(joined.rows)) or real(joined))
    got = _run_requests(staged, requests)
    want = _run_requests(SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100,
                                    max_batch=4), requests)
    assert reads == [4]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert got[1][1] == "length" and len(got[1][0]) == 1
    assert got[0][0] == _ar(target, [PROMPTS[0]], SamplingParams(max_new_tokens=12))[0]
    (lp, top), (want_lp, want_top) = got[2][2][0], want[2][2][0]
    assert [t for t, _ in top] == [t for t, _ in want_top]
    assert lp == pytest.approx(want_lp, abs=1e-4)


def test_no_row_drafting_runs_plain_decode_steps(target, head, monkeypatch):
    """When every active request has speculation off, a step is a plain decode (no drafting
    work at all); a drafting request joining later still drafts and stays exact."""
    engine = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4)
    calls = []
    propose = engine.drafter.propose
    monkeypatch.setattr(engine.drafter, "propose", lambda *a: calls.append(1) or propose(*a))
    params = SamplingParams(max_new_tokens=20)
    off = engine.add(Request(PROMPTS[0], params, spec=SpecControl(enabled=False)))
    got = {off: []}
    for _ in range(5):
        for o in engine.step():
            got[o.handle] += o.new_tokens
    assert calls == []
    on = engine.add(Request(PROMPTS[1], params))
    got[on] = []
    while engine.has_work:
        for o in engine.step():
            got[o.handle] += o.new_tokens
    assert calls  # the drafting request drafted
    assert [got[off], got[on]] == _ar(target, PROMPTS[:2], params)


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=needs_triton)])
def test_fused_kernels_in_the_engine_keep_output_exact(target, head, kernels, monkeypatch):
    """On CUDA the engine fuses the target's and the head's projections and runs the fused
    kernels: on CPU their torch references, and the Triton kernels themselves (interpreted:
    fused layers, tree attention, the draft loop's input and frontier kernels, the KV commit).
    The output equals plain decoding either way."""
    import copy

    if kernels == "triton":
        interpret_triton(monkeypatch)
    fused_target, fused_head = copy.deepcopy(target), copy.deepcopy(head)
    fused_target.fuse_for_inference()
    fused_head.fuse_for_inference(lm_head_int8=False)  # the bf16 lm_head here (int8: the next test)
    n, new = (4, 25) if kernels == "torch" else (2, 12)
    engine = SpecEngine(fused_target, fused_head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=n)
    params = SamplingParams(max_new_tokens=new)
    res = engine.generate(PROMPTS[:n], params)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert [r.token_ids for r in res] == _ar(target, PROMPTS[:n], params)
    assert sum(r.accepted_tokens for r in res) > 0


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=needs_triton)])
def test_int8_draft_lm_head_keeps_output_exact(target, head, kernels, monkeypatch):
    """The draft's lm_head in int8 (Eagle3Head.fuse_for_inference(lm_head_int8=True), the
    default) changes what is drafted at most, never the output; the drafts still get accepted."""
    import copy

    if kernels == "triton":
        interpret_triton(monkeypatch)
    fused_target, fused_head = copy.deepcopy(target), copy.deepcopy(head)
    fused_target.fuse_for_inference()
    fused_head.fuse_for_inference(lm_head_int8=True)  # (the engine fuses on CUDA only)
    n, new = (4, 25) if kernels == "torch" else (2, 12)
    engine = SpecEngine(fused_target, fused_head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=n)
    params = SamplingParams(max_new_tokens=new)
    res = engine.generate(PROMPTS[:n], params)
    assert fused_head._lm_int8 is not None and fused_head._lm_int8[0].dtype == torch.int8
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert [r.token_ids for r in res] == _ar(target, PROMPTS[:n], params)
    assert sum(r.accepted_tokens for r in res) > 0


@pytest.mark.parametrize("method", ["eagle3", "ngram", "ar"])
def test_graph_warm_up_restores_every_state_tensor(target, head, method):
    """Before a CUDA graph is captured, the step runs twice eagerly and the engine restores the
    per-row state it changed (`_state()`). Emulated on CPU before every step: a tensor missing
    from `_state()` would advance twice and change the output or, for the drafter's state,
    the drafts (and so what gets accepted)."""
    def build():
        return SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                          num_draft_tokens=8, max_len=100, max_batch=4)

    params = SamplingParams(max_new_tokens=25)
    plain = build().generate(PROMPTS[:3], params)
    engine = build()
    run = engine._run

    def warmed(*key):
        state = engine._state()
        saved = [t.clone() for t in state]
        for _ in range(2):
            with torch.no_grad():
                engine._step(*key)
            for t, s in zip(state, saved):
                t.copy_(s)
        return run(*key)

    engine._run = warmed
    res = engine.generate(PROMPTS[:3], params)
    assert [r.token_ids for r in res] == [r.token_ids for r in plain] == _ar(target, PROMPTS[:3], params)
    assert [r.accept_per_position for r in res] == [r.accept_per_position for r in plain]


@pytest.mark.parametrize("method", ["eagle3", "ar"])
@pytest.mark.parametrize("buckets", [False, True], ids=["exact", "buckets"])
def test_overlapped_steps_equal_sequential_steps(target, head, method, buckets):
    """With overlap the next step is launched before the current one is read, so rows that
    finish (budget, stop token, abort) run one step too many and rows move while a step is
    in flight. Every request's outputs (tokens, stats, finish reasons) equal those of the
    sequential engine, rows run to the cache's end, and steps did run ahead."""
    stop = _ar(target, [PROMPTS[2]], SamplingParams(max_new_tokens=12))[0][9]

    def run(overlap):
        engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                            num_draft_tokens=8, max_len=40, max_batch=4, overlap=overlap)
        engine.buckets = buckets
        ahead = []
        launch = engine._launch
        engine._launch = lambda ahead=0, plan=None, _log=ahead: _log.append(ahead) or launch(ahead=ahead, plan=plan)
        budgets = [33, 9, 20, 30, 6, 25]  # clipped to the 40-token cache below
        schedule = [0, 0, 1, 3, 4, 6]
        got, handle_of, step, aborted_after = {}, {}, 0, []
        while len(handle_of) < 6 or engine.has_work:
            for i, at in enumerate(schedule):
                if at <= step and i not in handle_of.values() and engine.free_slots > 0:
                    n = min(budgets[i], 40 - len(PROMPTS[i]))
                    h = engine.add(Request(PROMPTS[i], SamplingParams(max_new_tokens=n), frozenset({stop})))
                    handle_of[h] = i
                    got[i] = []
            for o in engine.step():
                got[handle_of[o.handle]].append((o.new_tokens, o.finish_reason, o.drafted, o.accepted, o.prefill))
                # request 3 leaves (unfinished, after a decode step) while a step may be in flight
                if handle_of[o.handle] == 3 and len(got[3]) >= 2 and o.finish_reason is None and not aborted_after:
                    engine.abort(o.handle)
                    aborted_after.append(len(got[3]))
            step += 1
        return [got[i] for i in range(6)], ahead, aborted_after

    sequential, ahead_off, aborted_off = run(False)
    overlapped, ahead_on, aborted_on = run(True)
    assert overlapped == sequential and aborted_on == aborted_off
    assert aborted_off and len(sequential[3]) == aborted_off[0] and sequential[3][-1][1] is None  # nothing after abort
    assert set(ahead_off) == {0} and ahead_on.count(1) >= 3
    reasons = [steps[-1][1] for steps in sequential if steps[-1][1]]
    assert "stop" in reasons and "length" in reasons
    if method == "eagle3":
        assert sum(s[3] for steps in sequential for s in steps) > 0


def test_capture_common_needs_an_idle_engine(target, head):
    """The server's start-up capture: nothing to capture without CUDA graphs (CPU), and it
    refuses to run under live requests (its warm-up steps would touch their rows)."""
    engine = SpecEngine(target, head, num_steps=2, topk=2, num_draft_tokens=4, max_len=64, max_batch=2)
    assert engine.capture_common((1,)) == 0
    engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=4)))
    with pytest.raises(EngineError, match="idle engine"):
        engine.capture_common((1,))


def test_capture_common_covers_every_bucket_a_lone_request_reaches(target, head, monkeypatch):
    """The graphs captured at start are exactly the shapes one client's steps and prefills
    ask for (capture itself needs CUDA: recorded here instead)."""
    from specheads.runtime.engine import next_pow2

    engine = SpecEngine(target, head, num_steps=2, topk=2, num_draft_tokens=4, max_len=120, max_batch=4)
    engine.use_graphs = True
    monkeypatch.setattr(engine, "_capture", lambda *key: ("step",) + key)
    widths = []
    monkeypatch.setattr(engine, "_prefill_graph", lambda width, sampled: widths.append((width, sampled)))
    n = engine.capture_common((1,))
    steps = {k for k in engine.graphs if k[0] != "prefill"}
    assert n == len(steps) and all(not key[2] for key in steps)  # greedy
    for need in range(1, engine.cap + 1):  # the context bucket _launch picks for any length
        kv = min(max(next_pow2(need), 128), engine.cap)
        # the tree, a plain step, and a plain step right after a drafting one (its wide keep-up)
        assert {(1, kv, False, 1), (1, kv, False, 0), (1, kv, False, 0, False, True)} <= steps
    for length in range(1, engine.max_len):  # the width bucket _prefill picks for any prompt
        assert (min(max(16, next_pow2(length)), engine.max_len), False) in widths


@pytest.mark.parametrize("method", ["eagle3", "ar", "ngram-host"])
def test_requests_joining_behind_a_step_in_flight_launch_the_next_step_before_their_read(target, head, method):
    """A request that joins while a step is in flight is prefilled behind that step, and the next
    step (its row included) is launched before the host reads the step or the prefill (device
    drafters; a host drafter waits for the tokens); requests that end at their first token (a
    budget of 1, a stop) or at their second, and joins into rows freed by that very step, all equal
    plain decoding, in buckets and without."""
    stop = _ar(target, [PROMPTS[5]], SamplingParams(max_new_tokens=1))[0][0]  # PROMPTS[5]'s first token
    budgets = [9, 6, 12, 1, 2, 7]  # (the first three join at once, the rest behind steps in flight)
    want = [_ar(target, [p], SamplingParams(max_new_tokens=n))[0] for p, n in zip(PROMPTS, budgets)]
    want[5] = []  # its first token is its stop
    for buckets in (False, True):
        engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                            num_draft_tokens=8, max_len=100, max_batch=3)
        engine.buckets = buckets
        order = []
        launch, read = engine._launch, engine._read_prefill
        engine._launch = lambda *a, **k: order.append("launch") or launch(*a, **k)
        engine._read_prefill = lambda joined: order.append("read") or read(joined)
        tokens, handle_of, joins_behind = {}, {}, 0
        while len(handle_of) < 6 or engine.has_work:
            behind = engine._inflight is not None
            for i in range(6):
                if i not in handle_of.values() and engine.free_slots > 0:
                    handle_of[engine.add(Request(PROMPTS[i], SamplingParams(max_new_tokens=budgets[i]),
                                                 frozenset([stop]) if i == 5 else frozenset()))] = i
                    joins_behind += behind
            order.clear()
            for o in engine.step():
                tokens.setdefault(handle_of[o.handle], []).extend(o.new_tokens)
            if behind and "read" in order and method != "ngram-host":
                assert order.index("launch") < order.index("read")  # the next step went first
        assert joins_behind >= 2 or method == "ngram-host"  # (its drafting steps are read before the next call)
        assert [tokens.get(i, []) for i in range(6)] == want, (method, buckets)
        assert not engine.rows and engine._inflight is None


def test_a_prefill_that_fails_leaves_its_requests_abortable(target, head, monkeypatch):
    """A prefill that raises (a failed capture, memory) leaves the requests not yet joined waiting, so
    the server's abort of the step's requests finds every one and the engine serves the next."""
    engine = SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_len=100, max_batch=4)
    engine.buckets = True
    handles = [engine.add(Request(p, SamplingParams(max_new_tokens=5))) for p in PROMPTS[:3]]
    real, calls = engine._queue_prefill, []

    def failing(new):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return real(new)

    monkeypatch.setattr(engine, "_queue_prefill", failing)
    with pytest.raises(RuntimeError, match="stand-in"):
        engine.step()
    assert len(engine.rows) == 1 and [r.handle for r in engine.waiting] == handles[1:]
    for h in handles:
        engine.abort(h)
    assert not engine.has_work
    monkeypatch.setattr(engine, "_queue_prefill", real)
    got = engine.generate([PROMPTS[3]], SamplingParams(max_new_tokens=6))[0].token_ids
    assert got == _ar(target, [PROMPTS[3]], SamplingParams(max_new_tokens=6))[0]


@pytest.mark.parametrize("method", ["eagle3", "ar"])
def test_requests_joining_an_idle_engine_start_behind_their_prefill(target, head, method):
    """On an idle engine the first step is launched behind the joining prompts' prefill, before their
    first tokens are read; none is launched where every request ends at its first token (a budget of
    1), and one whose every request stops at its first token is read at once. Outputs stay plain."""
    def engine_with_spy():
        engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=4, topk=3,
                            num_draft_tokens=8, max_len=100, max_batch=3)
        order = []
        launch, read = engine._launch, engine._read_prefill
        engine._launch = lambda *a, **k: order.append("launch") or launch(*a, **k)
        engine._read_prefill = lambda joined: order.append("read") or read(joined)
        return engine, order

    def run(engine, requests):
        handles = [engine.add(r) for r in requests]
        got = {h: [] for h in handles}
        first = engine.step()
        for o in first:
            got[o.handle] += o.new_tokens
        while engine.has_work:
            for o in engine.step():
                got[o.handle] += o.new_tokens
        assert engine._inflight is None or not engine.rows
        return [got[h] for h in handles]

    engine, order = engine_with_spy()
    out = run(engine, [Request(PROMPTS[0], SamplingParams(max_new_tokens=9)),
                       Request(PROMPTS[1], SamplingParams(max_new_tokens=1))])
    assert order[:2] == ["launch", "read"]
    assert out == [_ar(target, [PROMPTS[0]], SamplingParams(max_new_tokens=9))[0],
                   _ar(target, [PROMPTS[1]], SamplingParams(max_new_tokens=1))[0]]
    engine, order = engine_with_spy()
    assert run(engine, [Request(PROMPTS[2], SamplingParams(max_new_tokens=1))]) == \
        _ar(target, [PROMPTS[2]], SamplingParams(max_new_tokens=1))
    assert order == ["read"]  # (its one token is the prefill's: no step)
    stop = _ar(target, [PROMPTS[3]], SamplingParams(max_new_tokens=1))[0][0]
    engine, order = engine_with_spy()
    assert run(engine, [Request(PROMPTS[3], SamplingParams(max_new_tokens=9), frozenset([stop]))]) == [[]]
    assert order == ["launch", "read"] and engine._inflight is None  # (the step behind it, read and dropped)


def test_a_moving_row_takes_all_its_small_state_and_a_cleared_row_none(target):
    """The rows' small tensors (committed, root, limits, sampling parameters) live in one block per
    dtype: a row moves in one copy a block and clears in one fill, every tensor included."""
    engine = SpecEngine(target, method="ar", max_len=64, max_batch=4)
    engine._allocate()
    small = {"committed": engine.committed, "root": engine.root, "depth_limit": engine.depth_limit,
             "draft_limit": engine.draft_limit,
             **dict(zip(("temperature", "top_p", "top_k", "seed"), engine.row_params.tensors()))}
    for i, t in enumerate(small.values()):
        t[2].fill_(i + 0.5 if t.is_floating_point() else 10 + i)
    engine._move_row(2, 0, 0)
    assert all(t[0].item() == t[2].item() for t in small.values())
    engine._clear_row(0)
    cleared = ("committed", "root", "depth_limit", "draft_limit")
    assert all((t[0].item() == 0) == (name in cleared) for name, t in small.items())
    assert all(t[2].item() != 0 for t in small.values())  # (the row moved from is untouched)
