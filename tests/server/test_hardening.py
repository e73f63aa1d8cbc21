"""Requests a hostile client or an unlucky operator would send: each is a 4xx naming the field
(or a 413 / 401 before the body is read), fails no other request, and leaves the server as it
was; admission fills every free slot; shutdown drains with 503 + Retry-After for newcomers."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from specheads.server.app import ServerConfig, create_app
from tests.helpers import WORDS
from tests.server.conftest import running_server
from tests.server.fake_engine import FakeEngine
from tests.server.test_scheduler import stream_during_shutdown

MODEL = "fake"
KEY = "s3cret"


def make_app(tokenizer, step_delay=0.01, max_batch=4, tok=None, **config):
    words = sorted({i for w in WORDS for i in tokenizer(" " + w)["input_ids"]})
    engine = FakeEngine(words, max_batch=max_batch, step_delay=step_delay)
    return create_app(engine, tok or tokenizer, ServerConfig(MODEL, **config)), engine


def post(url, path="/v1/completions", key=None, **body):
    payload = {"model": MODEL, "prompt": "the cat", "max_tokens": 4, "temperature": 0, **body}
    if "chat" in path:
        payload.pop("prompt")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + path, json=payload, headers=headers, timeout=30)


def error(r) -> dict:
    return r.json()["error"]


class Tokenizer:
    """The test tokenizer, with `on_call(text)` run before each encoding (to slow it down, count
    the calls or make it fail)."""

    def __init__(self, tok, on_call):
        self.tok, self.on_call = tok, on_call

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __len__(self):
        return len(self.tok)

    def __call__(self, text, *a, **k):
        self.on_call(text)
        return self.tok(text, *a, **k)


@pytest.fixture(scope="module")
def server(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.002)
    with running_server(app) as (url, _):
        yield url, engine


# ------------------------------------------------------------------ fields
BAD_FIELDS = {  # case: (request fields, the param named)
    "seed of 2**64": (dict(seed=2**64), "seed"),
    "seed below -2**63": (dict(seed=-(2**63) - 1), "seed"),
    "top_k of 2**63": (dict(top_k=2**63), "top_k"),
    "top_k above the vocabulary": (dict(top_k=10**9), "top_k"),
    "max_tokens true": (dict(max_tokens=True), "max_tokens"),
    "max_tokens as a string": (dict(max_tokens="8"), "max_tokens"),
    "temperature as a string": (dict(temperature="0.5"), "temperature"),
    "stream as 1": (dict(stream=1), "stream"),
    "n as a float": (dict(n=1.0), "n"),
    "seed as a float": (dict(seed=3.5), "seed"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_bad_field_is_a_400_naming_it(server, case):
    url, _ = server
    fields, param = BAD_FIELDS[case]
    r = post(url, **fields)
    assert r.status_code == 400, r.text
    assert error(r)["param"] == param and param in error(r)["message"]
    assert post(url).status_code == 200  # the server goes on


def test_a_huge_seed_beside_a_running_request_fails_only_itself(server):
    """A seed of 2**64 once failed inside the engine step, and with it every request in the batch."""
    url, engine = server
    results = {}

    def long_one():
        results["long"] = post(url, max_tokens=60, seed=7, temperature=0.8)

    t = threading.Thread(target=long_one)
    t.start()
    time.sleep(0.05)
    bad = post(url, seed=2**64, temperature=0.8)
    t.join(30)
    assert bad.status_code == 400 and error(bad)["param"] == "seed"
    assert results["long"].status_code == 200
    assert results["long"].json()["usage"]["completion_tokens"] == 60


@pytest.mark.parametrize("content, where", [
    ([{"type": "text", "text": 5}], "messages.0.content"),
    ([{"type": "image_url", "image_url": {"url": "http://x"}}], "messages.0.content"),
    ("Hi \ud800 there", "messages.0.content"),
])
def test_bad_message_content_is_a_400_without_internals(server, content, where):
    url, _ = server
    body = json.dumps({"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": content}]},
                      ensure_ascii=True)  # keeps a lone surrogate as the escape \ud800 on the wire
    r = httpx.post(url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = error(r)
    assert err["param"] == "messages" and err["message"].startswith(where)
    assert "Traceback" not in err["message"] and "Error:" not in err["message"].split(":", 1)[0]


def test_lone_surrogate_in_a_prompt_or_stop_string(server):
    url, _ = server
    for field, value in (("prompt", "a \udfff b"), ("stop", ["x\ud800"])):
        body = json.dumps({"model": MODEL, "max_tokens": 3, "prompt": "hi", field: value})
        r = httpx.post(url + "/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and error(r)["param"] == field and "surrogate" in error(r)["message"]


def test_internal_error_returns_a_request_id_not_the_exception(tokenizer, caplog):
    def fail(text):
        raise KeyError("secret internal state /home/me/.cache/x")

    app, _ = make_app(tokenizer, tok=Tokenizer(tokenizer, fail))
    with running_server(app) as (url, _):
        r = post(url)
    assert r.status_code == 500
    err = error(r)
    assert "request id" in err["message"] and "secret" not in err["message"] and "KeyError" not in err["message"]
    rid = err["message"].split("request id ")[1].split(")")[0]
    assert any(rid in rec.getMessage() for rec in caplog.records), "the log names the same id with the details"


# ------------------------------------------------------------------ body size, API key, event loop
def _raw(url: str, head: bytes, body: bytes = b"", wait: float = 10.0) -> bytes:
    """Send raw bytes; the reply as it arrives, once its headers and announced body are in."""
    host, port = url.removeprefix("http://").split(":")
    reply = b""
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head + body)
        s.settimeout(wait)
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return reply
            reply += chunk
            top, sep, rest = reply.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in top.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if not chunk or (sep and len(rest) >= length):
                return reply


def test_body_over_the_limit_is_a_413_before_it_is_read(tokenizer):
    app, _ = make_app(tokenizer, max_request_bytes=1000)
    with running_server(app) as (url, _):
        # the header alone announces 100 MB: the answer comes without any of the body sent
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000000\r\n\r\n")
        t0 = time.monotonic()
        reply = _raw(url, head)
        assert reply.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 3
        # a chunked body is cut off once it passes the limit
        big = json.dumps({"model": MODEL, "prompt": "x " * 2000, "max_tokens": 2}).encode()
        r = httpx.post(url + "/v1/completions", content=iter([big[:500], big[500:]]),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "--max-request-bytes" in error(r)["message"]
        assert post(url).status_code == 200


def test_api_key_is_checked_before_the_body_is_read_and_bearer_is_case_insensitive(tokenizer):
    app, _ = make_app(tokenizer, api_key=KEY)
    with running_server(app) as (url, _):
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                b"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n")
        reply = _raw(url, head)
        assert reply.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in reply
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                           headers={"Authorization": f"{scheme} {KEY}"})
            assert r.status_code == 200, scheme
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Basic " + KEY}).status_code == 401


def test_templating_a_large_body_does_not_stall_health(tokenizer):
    def slow(text):  # tokenizing this prompt takes a while (as 10 MB of chat did)
        if "word word" in text:
            time.sleep(2.0)

    app, _ = make_app(tokenizer, tok=Tokenizer(tokenizer, slow))
    with running_server(app) as (url, _):
        t = threading.Thread(target=lambda: post(url, "/v1/chat/completions", messages=[
            {"role": "user", "content": "word " * 60}]))
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        assert httpx.get(url + "/health").status_code == 200
        assert time.monotonic() - t0 < 1.0, "the event loop was busy tokenizing"
        t.join(30)


# ------------------------------------------------------------------ admission and shutdown
def test_admission_uses_every_free_slot(tokenizer):
    """max_batch 2 and max_queue 3, one request running: of 20 that arrive while the engine
    steps, one takes the free slot and 3 wait. Waiting jobs were once counted against the queue
    before the free slots took them, so one fewer got in (and 4 of 20 from an idle server)."""
    app, engine = make_app(tokenizer, step_delay=1.0, max_batch=2, max_queue=3)
    codes = []
    with running_server(app) as (url, _):
        first = threading.Thread(target=lambda: codes.append(post(url, max_tokens=6).status_code))
        first.start()
        deadline = time.monotonic() + 10
        while engine.steps < 1:  # the first request is in, and the worker inside its first step
            assert time.monotonic() < deadline
            time.sleep(0.005)
        start = threading.Barrier(20)

        def one():
            start.wait()
            codes.append(post(url, max_tokens=2).status_code)

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads + [first]:
            t.join(60)
    assert sorted(codes) == [200] * 5 + [429] * 16


def test_shutdown_drains_newcomers_get_503_with_retry_after(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.03, shutdown_grace=20)
    late = []
    with running_server(app) as (url, server):  # the listener is still open during the drain
        events = stream_during_shutdown(url, server, 40, during=lambda: late.extend([post(url), httpx.get(
            url + "/health")]))
    assert events[-1]["choices"][0]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 40
    newcomer, health = late
    assert newcomer.status_code == 503 and error(newcomer)["code"] == "shutting_down"
    assert newcomer.headers["Retry-After"] == "5"
    assert health.status_code == 503


def test_a_text_too_long_for_the_context_is_refused_before_tokenizing(tokenizer):
    calls = []

    app, engine = make_app(tokenizer, tok=Tokenizer(tokenizer, lambda t: calls.append(len(t))), max_request_bytes=2**22)
    with running_server(app) as (url, _):
        r = post(url, "/v1/chat/completions", messages=[{"role": "user", "content": "word " * 200_000}])
        assert r.status_code == 400 and error(r)["code"] == "context_length_exceeded"
        assert error(r)["param"] == "messages" and "--max-len" in error(r)["message"]
        r = post(url, prompt="word " * 200_000)
        assert r.status_code == 400 and error(r)["param"] == "prompt"
    assert not any(n > 100_000 for n in calls), "the long texts were tokenized"


# ------------------------------------------------------------------ fields clients send by default
NO_OP_DEFAULTS = dict(tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=False, top_logprobs=0,
                      stream_options={"include_usage": True}, user="me", presence_penalty=0, frequency_penalty=0.0,
                      logit_bias={}, parallel_tool_calls=True, store=False, metadata={"run": "a"})


def test_fields_clients_send_by_default_are_accepted(server):
    import openai

    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       temperature=0, **NO_OP_DEFAULTS)
    assert r.choices[0].message.content is not None
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, echo=False, best_of=1, logprobs=None,
                                  suffix=None, temperature=0)
    assert r.usage.completion_tokens >= 1


@pytest.mark.parametrize("field, value", [
    ("top_logprobs", 5), ("top_logprobs", 21), ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "required"), ("response_format", {"type": "json_object"}), ("logit_bias", {"5": 10}),
    ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("best_of", 9), ("echo", True), ("suffix", "end"),
    ("functions", [{"name": "f"}]), ("modalities", ["audio"]), ("made_up_option", 1),
])
def test_an_option_the_server_does_not_implement_is_a_400_naming_it(server, field, value):
    url, _ = server
    path = "/v1/completions" if field in ("best_of", "echo", "suffix") else "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {}
    if field == "top_logprobs" and value > 20:
        body["logprobs"] = True  # (5 without logprobs is refused for that)
    r = post(url, path, **body, **{field: value})
    assert r.status_code == 400, r.text
    assert error(r)["param"] == field and error(r)["message"].startswith(field)


# ------------------------------------------------------------------ n > 1 as rows of the batch
def test_n_choices_are_admitted_together_or_not_at_all(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.3, max_batch=2, max_queue=0)
    sched = app.state.scheduler
    with running_server(app) as (url, _):
        first = threading.Thread(target=lambda: post(url, max_tokens=12))
        first.start()
        deadline = time.monotonic() + 10
        while engine.steps < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        r = post(url, n=2, max_tokens=4)  # one slot free, no queue: only one of the two would fit
        assert r.status_code == 429
        first.join(30)
        # nothing of it was left to run (the first request's job leaves `running` just after its response)
        deadline = time.monotonic() + 10
        while sched.running and all(job.finished for job in sched.running.values()):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert not sched.pending and not sched.running and engine.active == 0
        assert post(url, n=2, max_tokens=4).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert "specheads_choices_total 3.0" in metrics  # the first request's one and the last one's two


def test_a_client_leaving_an_n_stream_frees_every_choice(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.05, max_batch=4)
    with running_server(app) as (url, _):
        body = {"model": MODEL, "prompt": "the cat", "max_tokens": 200, "temperature": 0, "stream": True, "n": 3}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # hang up after the first piece
        deadline = time.monotonic() + 10
        while engine.active:
            assert time.monotonic() < deadline, "choices kept running after the client left"
            time.sleep(0.02)
        assert len(engine.aborted) == 3
