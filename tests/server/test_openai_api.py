"""The real `openai` client against a real uvicorn server on loopback, serving a tiny random
target with an EAGLE-3 head trained a few dozen steps: chat and completions, streamed and
not, equal the target's own greedy output; concurrent clients; every bad input gets its
4xx and the server keeps serving; metrics move with the requests."""

from __future__ import annotations

import json
import random
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specheads.data.chat import render
from specheads.data.regenerate import stop_token_ids
from specheads.heads.registry import head_kind
from specheads.runtime.engine import SpecEngine
from specheads.runtime.engine import decode
from specheads.runtime.sampling import SamplingParams
from specheads.server.app import ServerConfig, create_app
from tests.helpers import random_sentence
from tests.runtime.spec_helpers import make_target, train_head
from tests.server.conftest import running_server

MODEL = "tiny-chat"
KEY = "test-key"
MAX_LEN = 128
NEW = 12
rng = random.Random(3)
QUESTIONS = [random_sentence(rng, 2, 6) for _ in range(16)]


def chat_ids(tok, question: str) -> list[int]:
    text = render(tok, [{"role": "user", "content": question}], add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def served(tokenizer):
    """(base url, target, tokenizer, app) of a server with an EAGLE-3 head that has seen the
    target's answers to QUESTIONS (so it drafts some tokens right). The target's weights are
    large random draws: its greedy answers differ per prompt and split characters across
    byte-level tokens (the conftest target answers every prompt with newlines)."""
    tok = tokenizer
    model = make_target(seed=0, vocab=len(tok), max_positions=256, std=0.5)
    head = train_head(model, [chat_ids(tok, q) for q in QUESTIONS], new_tokens=NEW + 4, steps=40,
                      draft_vocab=min(200, len(tok)))
    engine = SpecEngine(model, head, method="eagle3", num_steps=3, topk=2, num_draft_tokens=6, max_len=MAX_LEN,
                        max_batch=4)
    app = create_app(engine, tok, ServerConfig(MODEL, api_key=KEY, max_queue=64, request_timeout=120))
    with running_server(app) as (url, _):
        yield url, model, tok, app


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def greedy(served, prompt_ids: list[int], max_new: int = NEW) -> tuple[str, int, str]:
    """(text, tokens, finish_reason) of the target's own plain greedy decoding."""
    _, model, tok, _ = served
    ids = decode(model, [prompt_ids], SamplingParams(max_new_tokens=max_new), stop_token_ids(tok))[0]
    return tok.decode(ids, skip_special_tokens=True), len(ids), "length" if len(ids) == max_new else "stop"


def chat(client, question, stream=False, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=kw.pop("max_tokens", NEW), temperature=kw.pop("temperature", 0),
                                          stream=stream, **kw)


def streamed_chat(client, question, **kw) -> tuple[str, object]:
    chunks = list(chat(client, question, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1]


def metrics(url) -> dict:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            key = s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else "")
            out[key] = s.value
    return out


# ------------------------------------------------------------------ correctness
def test_chat_streamed_and_not_equal_the_targets_greedy_output(served, client):
    _, _, tok, _ = served
    for q in QUESTIONS[:3]:
        text, n, reason = greedy(served, chat_ids(tok, q))
        full = chat(client, q)
        assert full.choices[0].message.content == text and len(set(text)) > 3
        assert full.choices[0].finish_reason == reason
        assert full.usage.completion_tokens == n and full.usage.prompt_tokens == len(chat_ids(tok, q))
        spec = full.model_extra["speculation"]
        assert spec["draft_tokens"] > 0 and 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
        assert spec["mean_acceptance_length"] >= 1
        streamed, last = streamed_chat(client, q)
        assert streamed == text
        assert last.choices[0].finish_reason == reason
        assert last.usage.completion_tokens == n and last.model_extra["speculation"] == spec


def test_completion_streamed_and_not_equal_the_targets_greedy_output(served, client):
    _, _, tok, _ = served
    for prompt in ("the cat sat on", "Hello world, how are"):
        text, n, reason = greedy(served, tok(prompt)["input_ids"])
        full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, temperature=0)
        assert full.choices[0].text == text and full.choices[0].finish_reason == reason
        assert full.usage.completion_tokens == n
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks) == text
        assert chunks[-1].choices[0].finish_reason == reason and chunks[-1].usage.completion_tokens == n
        # token ids as the prompt: the same request
        ids = client.completions.create(model=MODEL, prompt=tok(prompt)["input_ids"], max_tokens=NEW, temperature=0)
        assert ids.choices[0].text == text


def test_stream_ends_with_done(served):
    url = served[0]
    body = {"model": MODEL, "prompt": "the cat", "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "speculation" in last


def test_speculation_off_and_smaller_trees_give_the_same_text(served, client):
    _, _, tok, _ = served
    q = QUESTIONS[4]
    text, _, _ = greedy(served, chat_ids(tok, q))
    off = chat(client, q, extra_body={"speculation": {"enabled": False}})
    assert off.choices[0].message.content == text
    assert off.model_extra["speculation"]["draft_tokens"] == 0
    assert off.model_extra["speculation"]["mean_acceptance_length"] == 1
    small = chat(client, q, extra_body={"speculation": {"num_steps": 1, "num_draft_tokens": 2}})
    assert small.choices[0].message.content == text
    steps = small.model_extra["speculation"]["steps"]
    assert 0 < small.model_extra["speculation"]["draft_tokens"] <= 2 * steps


def test_stop_string_cuts_the_text_streamed_and_not(served, client):
    _, _, tok, _ = served
    q = QUESTIONS[5]
    text, _, _ = greedy(served, chat_ids(tok, q))
    assert len(text) > 6
    stop = text[3:6]
    want = text[: text.index(stop)]
    full = chat(client, q, stop=[stop, "never-there"])
    assert full.choices[0].message.content == want and full.choices[0].finish_reason == "stop"
    streamed, last = streamed_chat(client, q, stop=stop)
    assert streamed == want and last.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(served, client):
    q = QUESTIONS[6]
    a = chat(client, q, temperature=0.9, seed=7, max_tokens=NEW)
    b, _ = streamed_chat(client, q, temperature=0.9, seed=7, max_tokens=NEW)
    assert a.choices[0].message.content == b


def test_16_concurrent_clients_get_their_own_answers(served, client):
    _, _, tok, _ = served
    want = {q: greedy(served, chat_ids(tok, q))[0] for q in QUESTIONS}
    assert len(set(want.values())) == len(QUESTIONS)  # a mixed-up answer would show
    got, errors = {}, []

    def one(i, q):
        try:
            extra = {"speculation": {"enabled": False}} if i % 4 == 3 else None
            if i % 2:
                got[q] = streamed_chat(client, q, extra_body=extra)[0]
            else:
                got[q] = chat(client, q, extra_body=extra).choices[0].message.content
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i, q)) for i, q in enumerate(QUESTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert got == want


# ------------------------------------------------------------------ bad input
LONG_PROMPT = "the cat sat on the mat " * 60
BAD_INPUT = {  # case: (status, param, request fields)
    "unknown model": (404, "model", dict(model="gpt-4")),
    "prompt longer than the context": (400, "prompt", dict(prompt=LONG_PROMPT)),
    "max_tokens 0": (400, "max_tokens", dict(max_tokens=0)),
    "max_tokens above the context": (400, "max_tokens", dict(max_tokens=MAX_LEN)),
    "negative temperature": (400, "temperature", dict(temperature=-0.5)),
    "n above the batch": (400, "n", dict(n=5)),
    "top_p 0": (400, "top_p", dict(top_p=0)),
    "speculation deeper than the server's": (400, "speculation.num_steps",
                                             dict(extra_body={"speculation": {"num_steps": 99}})),
    "another speculation method": (400, "speculation.method", dict(extra_body={"speculation": {"method": "medusa"}})),
    "two prompts": (400, "prompt", dict(prompt=["a", "b"])),
}


def _ok(client):
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1 or r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_gets_an_openai_error_naming_the_field(served, client, case):
    status, param, fields = BAD_INPUT[case]
    assert len(served[2](LONG_PROMPT)["input_ids"]) > MAX_LEN
    args = dict(model=MODEL, prompt="hello there", max_tokens=4, temperature=0)
    args.update(fields)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert param.split(".")[-1] in err["message"]
    _ok(client)


def test_malformed_json_and_wrong_key(served, client):
    url = served[0]
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(url + "/v1/chat/completions", content=b'{"model": "tiny-chat", "messages": [', headers=auth)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
                   headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    assert "API key" in e.value.body["message"]
    assert httpx.get(url + "/v1/models").status_code == 401
    _ok(client)


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.get(served[0] + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


# ------------------------------------------------------------------ metrics
def test_metrics_move_with_requests(served, client):
    url = served[0]
    before = metrics(url)
    r = chat(client, QUESTIONS[7])
    s = list(chat(client, QUESTIONS[8], stream=True))
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    after = metrics(url)

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    ok = 'specheads_requests_total{"endpoint": "/v1/chat/completions", "status": "200"}'
    assert delta(ok) == 2
    assert delta('specheads_requests_total{"endpoint": "/v1/completions", "status": "404"}') == 1
    tokens = r.usage.completion_tokens + s[-1].usage.completion_tokens
    assert delta("specheads_generation_tokens_total") == tokens
    assert delta("specheads_prompt_tokens_total") == r.usage.prompt_tokens + s[-1].usage.prompt_tokens
    spec = [r.model_extra["speculation"], s[-1].model_extra["speculation"]]
    assert delta("specheads_draft_tokens_total") == sum(x["draft_tokens"] for x in spec) > 0
    assert delta("specheads_accepted_tokens_total") == sum(x["accepted_tokens"] for x in spec) > 0
    assert delta("specheads_spec_steps_total") == sum(x["steps"] for x in spec)
    assert delta("specheads_time_to_first_token_seconds_count") == 2
    assert delta("specheads_inter_token_latency_seconds_count") == tokens - 2
    assert delta('specheads_draft_position_offered_total{"position": "1"}') == sum(x["steps"] for x in spec)
    accepted_1 = delta('specheads_draft_position_accepted_total{"position": "1"}')
    assert 0 <= accepted_1 <= sum(x["steps"] for x in spec)
    assert after["specheads_mean_acceptance_length"] >= 1
    assert after["specheads_queue_length"] == 0 and after["specheads_running_requests"] == 0


# ------------------------------------------------------------------ n > 1
def test_n_choices_are_rows_with_seeds_derived_from_the_requests(served, client):
    """Each choice decodes as its own row with its own seed (choice 0 keeps the request's), so a
    seeded n=3 repeats, equals three n=1 requests with those seeds, and counts every choice."""
    from specheads.server.app import choice_seed

    q = QUESTIONS[5]
    kw = dict(temperature=0.9, max_tokens=NEW)
    one = [chat(client, q, seed=choice_seed(5, i), **kw) for i in range(3)]
    three = chat(client, q, seed=5, n=3, **kw)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.message.content for c in three.choices] == [r.choices[0].message.content for r in one]
    assert three.usage.completion_tokens == sum(r.usage.completion_tokens for r in one)
    assert three.usage.prompt_tokens == one[0].usage.prompt_tokens
    again = chat(client, q, seed=5, n=3, **kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in three.choices]
    assert len({c.message.content for c in three.choices}) > 1, "three samples of a random target differ"
    # streamed: the same choices, by index, and the last chunk carries the request's totals
    texts = {0: "", 1: "", 2: ""}
    chunks = list(chat(client, q, seed=5, n=3, stream=True, **kw))
    finished = set()
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason is not None:
                finished.add(ch.index)
    assert finished == {0, 1, 2} and [texts[i] for i in range(3)] == [c.message.content for c in three.choices]
    assert chunks[-1].usage.completion_tokens == three.usage.completion_tokens


def test_n_greedy_choices_are_the_targets_greedy_output(served, client):
    q = QUESTIONS[6]
    want, _, _ = greedy(served, chat_ids(served[2], q))
    r = chat(client, q, n=2)
    assert [c.message.content for c in r.choices] == [want, want]
    r = client.completions.create(model=MODEL, prompt="hello there", max_tokens=4, temperature=0, n=2)
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text


# ------------------------------------------------------------------ logprobs
def _reference_logprobs(served, prompt_ids: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """The target's greedy tokens and their log-probabilities from one plain forward."""
    import torch

    _, model, tok, _ = served
    ids = decode(model, [prompt_ids], SamplingParams(max_new_tokens=max_new), stop_token_ids(tok))[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].float()
    lsm = torch.log_softmax(logits, -1)
    start = len(prompt_ids) - 1
    return ids, [lsm[start + j, t].item() for j, t in enumerate(ids)]


def test_chat_logprobs_are_the_targets_with_speculation_on_and_off(served, client):
    q = QUESTIONS[9]
    ids, want = _reference_logprobs(served, chat_ids(served[2], q), NEW)
    on = chat(client, q, logprobs=True, top_logprobs=3)
    off = chat(client, q, logprobs=True, top_logprobs=3, extra_body={"speculation": {"enabled": False}})
    for r in (on, off):
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens == len(ids)
        assert [c.logprob for c in content] == pytest.approx(want, abs=1e-4)
        for c in content:  # greedy: the emitted token is the most likely one
            assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)
            assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob
            assert bytes(c.bytes).decode("utf-8", "replace") == c.token
    assert [c.logprob for c in on.choices[0].logprobs.content] == pytest.approx(
        [c.logprob for c in off.choices[0].logprobs.content], abs=1e-5)
    streamed = []
    for chunk in chat(client, q, stream=True, logprobs=True, top_logprobs=3):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in on.choices[0].logprobs.content],
                                                          abs=1e-6)
    assert chat(client, q).choices[0].logprobs is None  # not asked, none given


def test_completion_logprobs(served, client):
    _, _, tok, _ = served
    prompt = "hello there"
    ids, want = _reference_logprobs(served, tok(prompt)["input_ids"], 6)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want, abs=1e-4) and len(lp.tokens) == len(ids)
    assert all(len(alts) <= 2 for alts in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_best_of_returns_the_candidates_of_highest_mean_logprob(served, client):
    kw = dict(model=MODEL, prompt="the cat sat", max_tokens=8, temperature=1.0, seed=5)
    cands = client.completions.create(n=3, logprobs=0, **kw).choices
    mean = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in cands]
    best = client.completions.create(best_of=3, **kw)
    assert len(best.choices) == 1 and best.choices[0].text == cands[mean.index(max(mean))].text
    assert best.choices[0].logprobs is None  # ranked by them, but not asked for
    assert best.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in cands)  # every candidate counts
    two = client.completions.create(n=2, best_of=3, logprobs=1, **kw).choices
    assert [c.text for c in two] == [cands[i].text for i in sorted(range(3), key=lambda i: -mean[i])[:2]]
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(n=2, best_of=1, **kw)


# ------------------------------------------------------------------ other head kinds
@pytest.mark.parametrize("kind, size", [("mtp", {"num_modules": 3}), ("medusa", {"num_heads": 3, "steps": 80})])
def test_a_server_with_an_mtp_or_medusa_head_answers_with_the_targets_text(served, kind, size):
    """The head's kind picks its drafter: concurrent chat requests, streamed and not, give the
    target's own greedy text, with drafts accepted."""
    _, model, tok, _ = served
    head = train_head(model, [chat_ids(tok, q) for q in QUESTIONS], new_tokens=NEW + 4,
                      draft_vocab=min(200, len(tok)), kind=kind, **size)
    engine = SpecEngine(model, head, num_steps=3, topk=2, num_draft_tokens=6, max_len=MAX_LEN, max_batch=4)
    assert engine.method == head_kind(kind).default_method  # medusa: with the n-gram assist
    app = create_app(engine, tok, ServerConfig(MODEL, api_key=KEY, max_queue=64, request_timeout=120))
    with running_server(app) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        questions = QUESTIONS[:4]
        results = [None] * len(questions)

        def ask(i):
            results[i] = chat(client, questions[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted = 0
        for q, full in zip(questions, results):
            text, n, _ = greedy(served, chat_ids(tok, q))
            assert full.choices[0].message.content == text and full.usage.completion_tokens == n
            accepted += full.model_extra["speculation"]["accepted_tokens"]
        assert streamed_chat(client, questions[0])[0] == greedy(served, chat_ids(tok, questions[0]))[0]
        assert accepted > 0


def test_auto_speculation_over_http(served, client):
    """"enabled": "auto" with a threshold no draft can reach: the text is the target's, the
    request soon decodes without drafts, and the metric counts those steps by reason."""
    url, _, tok, _ = served
    q = QUESTIONS[5]
    text, n, _ = greedy(served, chat_ids(tok, q))
    key = "specheads_steps_without_drafts_total" + json.dumps({"reason": "auto"})
    before = metrics(url).get(key, 0)
    body = {"speculation": {"enabled": "auto", "min_acceptance": 1.0, "window": 1, "probe_every": 100}}
    full = chat(client, q, extra_body=body)
    assert full.choices[0].message.content == text
    assert metrics(url)[key] > before
    for bad in ({"enabled": "sometimes"}, {"enabled": "auto", "min_acceptance": 2}, {"window": 0}):
        r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": MODEL, "messages": [{"role": "user", "content": q}], "speculation": bad})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("speculation."), r.text
