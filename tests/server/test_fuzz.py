"""Schemathesis against the server's own OpenAPI schema, positive and negative cases at a fixed
seed, with a canary request streaming beside them: no case gets a 5xx, the server keeps
answering, and the canary's output equals its solo run (no request can hurt another).

The engine is a real SpecEngine (EAGLE-3 head, float32) over a tiny random target with a short
context, so the cases that pass validation decode for real but quickly. Hypothesis draws every
case first (with the generate phase only, what it draws does not depend on the test's outcome:
the same cases as when each was sent as drawn), then SENDERS threads send them, so the engine
decodes several at once as a served model does."""

from __future__ import annotations

import collections
import queue
import threading

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from specheads.runtime.engine import SpecEngine  # noqa: E402
from specheads.server.app import ServerConfig, create_app  # noqa: E402
from tests.runtime.spec_helpers import make_target, random_head  # noqa: E402
from tests.server.conftest import running_server  # noqa: E402

MODEL = "tiny"
KEY = "fuzz-key"
CASES = {  # (operation, mode): examples; 5,000 in all
    ("POST", "/v1/chat/completions", GenerationMode.POSITIVE): 1400,
    ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE): 1100,
    ("POST", "/v1/completions", GenerationMode.POSITIVE): 1400,
    ("POST", "/v1/completions", GenerationMode.NEGATIVE): 1100,
}
SENDERS = 8  # cases in flight at once (twice the engine's max_batch: the refused ones need not wait)
CANARY = {"model": MODEL, "messages": [{"role": "user", "content": "the canary sings"}], "max_tokens": 16,
          "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def fuzz_server(tokenizer):
    model = make_target(seed=1, vocab=len(tokenizer), max_positions=128, std=0.5)
    engine = SpecEngine(model, random_head(model), method="eagle3", num_steps=3, topk=2, num_draft_tokens=4,
                        max_len=40, max_batch=4)
    app = create_app(engine, tokenizer, ServerConfig(MODEL, api_key=KEY, max_queue=64, request_timeout=60,
                                                     max_request_bytes=64 * 1024))
    with running_server(app) as (url, _):
        yield url, app


def canary_text(url: str) -> str:
    text = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=CANARY, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                import json

                delta = json.loads(line[6:])["choices"][0]["delta"]
                text.append(delta.get("content") or "")
    return "".join(text)


def test_fuzzed_requests_get_no_5xx_and_do_not_disturb_a_canary(fuzz_server):
    url, app = fuzz_server
    solo = canary_text(url)
    assert solo, "the canary's solo run produced text"
    schema = schemathesis.openapi.from_dict(app.openapi())  # (from_asgi would start the app a second time)
    ops = {(op.ok().method.upper(), op.ok().path): op.ok() for op in schema.get_all_operations()}
    statuses = collections.Counter()
    server_errors = []
    canaries, canary_errors = [], []
    stop = threading.Event()

    def sing():  # canaries stream one after another for as long as the fuzzing lasts
        while not stop.is_set():
            try:
                canaries.append(canary_text(url))
            except Exception as e:  # noqa: BLE001 - reported below
                canary_errors.append(repr(e))
            stop.wait(0.2)  # leave the two CI cores mostly to the fuzzing

    cases = []  # (method, path, request kwargs, body) of every case, drawn before any is sent
    for (method, path, mode), n in CASES.items():
        op = ops[(method, path)]

        @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(mode))
        def draw(case):
            if mode == GenerationMode.POSITIVE and isinstance(case.body, dict):
                case.body["model"] = MODEL  # else nearly every valid body names an unknown model (404)
            kwargs = case.as_transport_kwargs(base_url=url)
            kwargs.pop("url", None)
            headers = {**(kwargs.pop("headers", None) or {}), "Authorization": f"Bearer {KEY}"}
            cases.append((kwargs.pop("method"), path, {"headers": headers, **{
                k: v for k, v in kwargs.items() if k in ("json", "content", "params", "data")}}, case.body))

        draw()
    assert len(cases) == sum(CASES.values())

    lock = threading.Lock()
    send_errors = []
    pending = queue.Queue()
    for case in cases:
        pending.put(case)

    def send():  # each case is one request; its status (or a failure to get one) is recorded
        with httpx.Client(base_url=url, timeout=60) as client:
            while True:
                try:
                    method, path, kwargs, body = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    r = client.request(method, path, **kwargs)
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        send_errors.append((repr(e), body))
                    continue
                with lock:
                    statuses[r.status_code // 100] += 1
                    if r.status_code >= 500:
                        server_errors.append((r.status_code, r.text[:300], body))

    singer = threading.Thread(target=sing, daemon=True)
    singer.start()
    senders = [threading.Thread(target=send, daemon=True) for _ in range(SENDERS)]
    try:
        for t in senders:
            t.start()
        for t in senders:
            t.join(1800)
    finally:
        stop.set()
        singer.join(120)
    total = sum(statuses.values())
    print(f"fuzzed {total} requests: status classes {dict(statuses)}; {len(canaries)} canaries equal their solo run")
    assert not any(t.is_alive() for t in senders), "a sender did not finish"
    assert not send_errors, f"{len(send_errors)} cases got no response, e.g. {send_errors[:3]}"
    assert total >= 5000, statuses
    assert not server_errors, f"{len(server_errors)} cases got a 5xx, e.g. {server_errors[:3]}"
    assert statuses[2] > 50 and statuses[4] > 1000, statuses  # both valid and invalid requests were made
    assert not canary_errors, canary_errors[:3]
    assert canaries and all(c == solo for c in canaries), "a canary's output changed beside the fuzzing"
    assert httpx.get(url + "/health").status_code == 200
