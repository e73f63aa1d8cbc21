"""Scheduler cases that need control over time, on a stand-in engine whose steps take a set
time (tests/server/fake_engine.py): per-request timeout, client disconnect, a full queue,
graceful shutdown (in-flight requests finish; past the grace period they get a clear error)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from specheads.server.app import ServerConfig, create_app
from tests.helpers import WORDS
from tests.server.conftest import running_server
from tests.server.fake_engine import FakeEngine

MODEL = "fake"


def make_app(tokenizer, step_delay=0.02, max_batch=4, **config):
    words = sorted({i for w in WORDS for i in tokenizer(" " + w)["input_ids"]})
    engine = FakeEngine(words, max_batch=max_batch, step_delay=step_delay)
    return create_app(engine, tokenizer, ServerConfig(MODEL, **config)), engine


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def completion(url, max_tokens, stream=False, timeout=30.0):
    return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "the cat", "max_tokens": max_tokens,
                                                     "temperature": 0, "stream": stream}, timeout=timeout)


def test_fake_engine_output_is_served_exactly(tokenizer):
    """The stand-in's own reference is what the server returns (the fake is itself sound)."""
    app, engine = make_app(tokenizer, step_delay=0)
    with running_server(app) as (url, _):
        r = client(url).completions.create(model=MODEL, prompt="the cat", max_tokens=20, temperature=0)
    want = engine.reference(tokenizer("the cat")["input_ids"], 20)
    assert r.choices[0].text == tokenizer.decode(want) and r.usage.completion_tokens == 20


def test_timeout_stops_the_request_and_frees_its_slot(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.05, request_timeout=0.3)
    with running_server(app) as (url, _):
        r = completion(url, 200)
        assert r.status_code == 504
        err = r.json()["error"]
        assert err["code"] == "timeout" and "--request-timeout" in err["message"]
        wait_for(lambda: engine.active == 0, "the slot to free")
        assert engine.aborted == [0]
        assert completion(url, 2).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_frees_the_slot(tokenizer, stream):
    app, engine = make_app(tokenizer, step_delay=0.05)
    with running_server(app) as (url, _):
        if stream:
            body = {"model": MODEL, "prompt": "the cat", "max_tokens": 200, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                next(r.iter_lines())  # the first chunk, then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                completion(url, 200, timeout=0.5)
        wait_for(lambda: engine.aborted == [0], "the engine to abort the request")
        assert engine.active == 0 and not app.state.scheduler.running
        assert completion(url, 2).status_code == 200


def test_full_queue_answers_429(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.02, max_batch=1, max_queue=1)
    sched = app.state.scheduler
    with running_server(app) as (url, _):
        results = []
        threads = [threading.Thread(target=lambda: results.append(completion(url, 30).status_code))]
        threads[0].start()
        wait_for(lambda: engine.active == 1, "the first request to run")
        threads.append(threading.Thread(target=lambda: results.append(completion(url, 30).status_code)))
        threads[1].start()
        wait_for(lambda: len(sched.pending) == 1, "the second request to queue")
        r = completion(url, 2)
        for t in threads:
            t.join(30)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    assert "--max-queue" in r.json()["error"]["message"]
    assert results == [200, 200]


def stream_during_shutdown(url, server, max_tokens, during=None) -> list[dict]:
    """A streamed completion whose first event is followed by a shutdown (as SIGTERM starts one);
    `during()` runs at the fifth event, while the server drains. Returns the JSON events."""
    body = {"model": MODEL, "prompt": "the cat", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line:
                continue
            events.append(line)
            if len(events) == 1:
                server.should_exit = True  # as SIGTERM does
            if len(events) == 5 and during is not None:
                during()
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def test_shutdown_lets_in_flight_requests_finish(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.03, shutdown_grace=20)
    with running_server(app) as (url, server):
        events = stream_during_shutdown(url, server, 40)
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-1]["usage"]["completion_tokens"] == 40
        assert not app.state.scheduler.admitting


def test_shutdown_past_the_grace_period_ends_requests_with_an_error(tokenizer):
    app, engine = make_app(tokenizer, step_delay=0.03, shutdown_grace=0.3)
    with running_server(app) as (url, server):
        events = stream_during_shutdown(url, server, 10_000 // 50)
    err = events[-1]["error"]
    assert err["code"] == "shutting_down" and "grace period" in err["message"]
    assert engine.active == 0


def test_no_new_requests_while_shutting_down(tokenizer):
    app, _ = make_app(tokenizer)
    app.state.scheduler.stop_admitting()

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as c:
            return await c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}), \
                await c.get("/health")

    r, health = asyncio.run(post())
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
