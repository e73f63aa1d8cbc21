"""The OpenAI-compatible app: /v1/chat/completions, /v1/completions, /v1/models, /health,
/metrics. Requests are checked here against the loaded model's limits, then handed to the
scheduler; every error leaves in the OpenAI shape with a 4xx/5xx status."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specheads.server.metrics import Metrics
from specheads.server.scheduler import Job, Scheduler
from specheads.server.schemas import APIError, ChatCompletionRequest, CompletionRequest
from specheads.server.tokens import Detokenizer, StopMatcher

COMPLETION_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    served_model_name: str
    api_key: str | None = None
    max_queue: int = 256
    request_timeout: float = 600.0  # seconds from arrival, queue included
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish on shutdown
    max_request_bytes: int = 4 * 2**20  # a larger body is a 413, refused before it is read


@dataclass
class RequestStats:
    prompt_tokens: int
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    step_tokens: int = 0

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    @staticmethod
    def combined(parts: list["RequestStats"]) -> "RequestStats":
        """A request of several choices: the prompt once, the rest summed over the choices."""
        out = RequestStats(prompt_tokens=parts[0].prompt_tokens)
        for p in parts:
            out.completion_tokens += p.completion_tokens
            out.draft_tokens += p.draft_tokens
            out.accepted_tokens += p.accepted_tokens
            out.steps += p.steps
            out.step_tokens += p.step_tokens
        return out

    def speculation(self) -> dict:
        return {"draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens, "steps": self.steps,
                "mean_acceptance_length": round(self.step_tokens / self.steps, 4) if self.steps else 0.0}


def create_app(engine, tokenizer, config: ServerConfig) -> FastAPI:
    from specheads.target.chat import stop_token_ids
    from specheads.runtime.engine import Request as EngineRequest
    from specheads.runtime.engine import SpecControl
    from specheads.runtime.sampling import InvalidRequest, SamplingParams

    metrics = Metrics()
    scheduler = Scheduler(engine, metrics, config.max_queue, config.request_timeout)
    stop_ids = frozenset(stop_token_ids(tokenizer))
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        scheduler.close()

    app = FastAPI(title="specheads", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.config = scheduler, metrics, config
    app.add_middleware(Guard, api_key=config.api_key, max_bytes=config.max_request_bytes, metrics=metrics)

    # ------------------------------------------------------------------ errors
    def error_response(request: Request, err: APIError) -> JSONResponse:
        metrics.requests.labels(endpoint=request.url.path, status=str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=error_headers(err.status))

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return error_response(request, err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error_response(request, validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(request, APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception):
        # the client gets an id to quote; the details (which may hold internals) go to the log
        rid = uuid.uuid4().hex[:16]
        log.error("internal error, request %s (%s %s)", rid, request.method, request.url.path, exc_info=exc)
        return error_response(request, APIError(500, f"internal error (request id {rid}); the server log has "
                                                     "the details", type="server_error", code="internal_error"))

    # ------------------------------------------------------------------ checks against the model's limits
    def check_model(body) -> None:
        if body.model != config.served_model_name:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                                f"{config.served_model_name!r} (GET /v1/models)", param="model", code="model_not_found")

    vocab = len(tokenizer)

    def token_text(token: int) -> str:
        return tokenizer.decode([token])

    # a token covers at most this many bytes of text (byte-level vocabularies: its string's length),
    # so a text of more than longest * max_len bytes cannot fit the context: refused untokenized
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1) + 1

    def check_fits(text_bytes: int, field: str) -> None:
        if text_bytes > longest * engine.max_len:
            raise APIError(400, f"{field} has {text_bytes} bytes of text, at least {text_bytes // longest} tokens; "
                                f"this server's context is {engine.max_len} tokens (prompt + max_tokens, server "
                                "--max-len)", param=field.split(".")[0], code="context_length_exceeded")

    def engine_request(body, prompt: list[int], max_tokens: int | None, prompt_field: str, max_field: str):
        if body.n > engine.max_batch:
            raise APIError(400, f"n must be at most {engine.max_batch} (the server's --max-batch: every choice is a "
                                f"row of the batch), got {body.n}", param="n")
        best_of = body.candidates()
        if best_of < body.n or best_of > engine.max_batch:
            raise APIError(400, f"best_of must be in n..{engine.max_batch} (n = {body.n}; the server's --max-batch "
                                f"bounds the candidates decoded together), got {best_of}", param="best_of")
        if best_of > body.n and body.stream:
            raise APIError(400, "best_of above n cannot stream (the best are known only at the end)", param="best_of")
        if body.top_k > vocab:
            raise APIError(400, f"top_k must be at most the vocabulary size {vocab} (0 disables it), got {body.top_k}",
                           param="top_k")
        if not prompt:
            raise APIError(400, f"{prompt_field} is empty", param=prompt_field)
        room = engine.max_len - len(prompt)
        if room <= 0:
            raise APIError(400, f"{prompt_field} has {len(prompt)} tokens; this server's context is {engine.max_len} "
                                "tokens (prompt + max_tokens, server --max-len)", param=prompt_field,
                           code="context_length_exceeded")
        if max_tokens is not None and max_tokens > room:
            raise APIError(400, f"{max_field} {max_tokens} is above the limit: the prompt has {len(prompt)} tokens "
                                f"and the context {engine.max_len}, so at most {room}", param=max_field)
        try:
            params = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
                                    max_new_tokens=max_tokens or room).validate()
        except InvalidRequest as e:
            raise APIError(400, str(e), param=str(e).split()[0]) from e
        wanted = body.top_logprobs_wanted()
        if best_of > body.n and wanted is None:
            wanted = 0  # candidates are ranked by their tokens' log-probabilities
        return EngineRequest(prompt=prompt, params=params, stop_ids=stop_ids, spec=spec_control(body.speculation),
                             top_logprobs=wanted)

    def spec_control(spec):
        if spec is None:
            return SpecControl(enabled=True)
        if spec.method in ("off", "ar"):
            return SpecControl(enabled=False)
        if spec.method not in (None, engine.method):
            raise APIError(400, f"speculation.method {spec.method!r}: this server drafts with {engine.method!r}; "
                                f"use that or 'off'", param="speculation.method")
        for name in ("num_steps", "num_draft_tokens"):
            value, limit = getattr(spec, name), getattr(engine, name)
            if value is not None and value > limit:
                raise APIError(400, f"speculation.{name} {value} is above the server's limit {limit}",
                               param=f"speculation.{name}")
        return SpecControl(enabled=spec.enabled, num_steps=spec.num_steps, num_draft_tokens=spec.num_draft_tokens,
                           min_acceptance=spec.min_acceptance, window=spec.window, probe_every=spec.probe_every)

    # ------------------------------------------------------------------ generation
    async def deltas(job: Job, stats: RequestStats, stops: list[str], arrival: float):
        """(text, finish_reason, logprobs) as the job's outputs arrive; the last item has a
        finish_reason; logprobs: [(token, log-probability, top alternatives)] of the tokens received
        since the last item (the request asked), else None. Leaving early (stop string, client
        gone, error) aborts the request in the engine."""
        detok, matcher = Detokenizer(tokenizer), StopMatcher(stops)
        last = None
        pending: list | None = [] if job.request.top_logprobs is not None else None
        try:
            while True:
                kind, item = await job.events.get()
                if kind == "error":
                    raise item
                now = time.monotonic()
                if item.new_tokens:
                    if last is None:
                        metrics.ttft.observe(now - arrival)
                    else:
                        for _ in item.new_tokens:
                            metrics.itl.observe((now - last) / len(item.new_tokens))
                    last = now
                stats.completion_tokens += len(item.new_tokens)
                stats.draft_tokens += item.drafted
                stats.accepted_tokens += item.accepted
                if item.accept_length and not item.prefill:
                    stats.steps += 1
                    stats.step_tokens += item.accept_length
                if item.finish_reason is not None:
                    job.finished = True
                if pending is not None and item.logprobs:
                    pending += [(t, lp, top) for t, (lp, top) in zip(item.new_tokens, item.logprobs)]
                text, stopped = matcher.push(detok.add(item.new_tokens))
                if not stopped and item.finish_reason is not None:
                    tail, stopped = matcher.push(detok.flush())
                    text += tail + ("" if stopped else matcher.flush())
                if stopped or item.finish_reason is not None:
                    metrics.e2e.observe(now - arrival)
                    yield text, "stop" if stopped else item.finish_reason, pending
                    return
                if text or pending:
                    yield text, None, pending
                    pending = [] if pending is not None else None
        finally:
            if not job.finished:
                scheduler.cancel(job)

    def new_shape(body, kind: str) -> "Shape":
        return Shape(("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex, config.served_model_name, kind,
                     token_text if body.top_logprobs_wanted() is not None else None)

    async def hung_up(request: Request, streams) -> Response:
        """The client left before an answer: close its streams (their jobs leave the engine)."""
        for stream in streams:
            await stream.aclose()
        metrics.requests.labels(endpoint=request.url.path, status="499").inc()
        return Response(status_code=499)

    async def generate(request: Request, body, prompt: list[int], max_tokens, kind: str):
        arrival = time.monotonic()
        check_model(body)
        prompt_field, max_field = ("messages", "max_tokens") if kind == "chat" else ("prompt", "max_tokens")
        engine_req = engine_request(body, prompt, max_tokens, prompt_field, max_field)
        if body.candidates() > 1:
            return await generate_choices(request, body, prompt, engine_req, kind, arrival)
        job = scheduler.submit(engine_req, asyncio.get_running_loop())
        metrics.prompt_tokens.inc(len(prompt))
        metrics.choices.inc()
        stats = RequestStats(prompt_tokens=len(prompt))
        items = deltas(job, stats, body.stop_strings(), arrival)
        shape = new_shape(body, kind)
        # wait for the first piece (streamed) or all of it while watching the client: a client that
        # hangs up frees its slot, and errors before any token keep their own status
        result = await until_disconnect(request, anext(items) if body.stream else collect(items))
        if result is None:
            return await hung_up(request, [items])
        metrics.requests.labels(endpoint=request.url.path, status="200").inc()
        if body.stream:
            return StreamingResponse(sse(shape, result, items, stats), media_type="text/event-stream")
        return shape.response([result], stats)

    async def generate_choices(request: Request, body, prompt: list[int], engine_req, kind: str, arrival: float):
        """n > 1: each choice decodes as its own row of the batch, with its own seed derived from the
        request's (choice 0 keeps it, so n=1 and the first of n agree)."""
        loop = asyncio.get_running_loop()
        jobs = []
        try:
            for i in range(body.candidates()):
                params = replace(engine_req.params, seed=choice_seed(engine_req.params.seed, i))
                jobs.append(scheduler.submit(replace(engine_req, params=params), loop))
        except APIError:  # all choices or none: the ones already queued are withdrawn
            for job in jobs:
                scheduler.cancel(job)
            raise
        metrics.prompt_tokens.inc(len(prompt))
        metrics.choices.inc(len(jobs))
        stats = [RequestStats(prompt_tokens=len(prompt)) for _ in jobs]
        streams = [deltas(job, st, body.stop_strings(), arrival) for job, st in zip(jobs, stats)]
        shape = new_shape(body, kind)
        if body.stream:
            events = merged(streams)
            result = await until_disconnect(request, anext(events))
        else:
            events = None
            result = await until_disconnect(request, asyncio.gather(*(collect(st) for st in streams)))
        if result is None:
            return await hung_up(request, [events] if events is not None else streams)
        metrics.requests.labels(endpoint=request.url.path, status="200").inc()
        if body.stream:
            return StreamingResponse(sse_choices(shape, result, events, stats), media_type="text/event-stream")
        if len(result) > body.n:  # best_of: the n candidates of highest mean log-probability per token
            def score(choice):
                lps = choice[2] or []
                return sum(lp for _, lp, _ in lps) / max(len(lps), 1)
            result = sorted(result, key=score, reverse=True)[: body.n]
        return shape.response(result, RequestStats.combined(stats))

    async def sse_choices(shape: "Shape", first, events, stats: list[RequestStats]):
        n, finished = len(stats), 0
        try:
            if shape.kind == "chat":
                for i in range(n):
                    yield shape.event(shape.chunk({"role": "assistant", "content": ""}, None, index=i))
            i, text, reason, lps = first
            while True:
                finished += reason is not None
                if text or lps or reason is not None:  # the last choice to finish carries the totals
                    yield shape.event(shape.chunk(text, reason, RequestStats.combined(stats) if finished == n else None,
                                                  index=i, lps=lps))
                if finished == n:
                    break
                i, text, reason, lps = await anext(events)
        except APIError as err:
            yield shape.event(err.body())
        finally:
            await events.aclose()
        yield "data: [DONE]\n\n"

    async def collect(items) -> tuple[str, str, list | None]:
        texts, lps = [], None
        async for text, reason, lp in items:
            texts.append(text)
            if lp is not None:
                lps = (lps or []) + lp
            if reason is not None:
                return "".join(texts), reason, lps
        raise RuntimeError("the request ended without a finish reason")

    async def sse(shape: "Shape", first, items, stats: RequestStats):
        try:
            if shape.kind == "chat":
                yield shape.event(shape.chunk({"role": "assistant", "content": ""}, None))
            text, reason, lps = first
            while True:
                if text or lps or reason is not None:
                    yield shape.event(shape.chunk(text, reason, stats if reason is not None else None, lps=lps))
                if reason is not None:
                    break
                text, reason, lps = await anext(items)
        except APIError as err:  # after the 200 went out: the error travels as an event
            yield shape.event(err.body())
        finally:
            await items.aclose()
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------------ routes
    def chat_prompt(messages: list[dict]) -> list[int]:
        from specheads.target.chat import render

        try:
            text = render(tokenizer, messages, add_generation_prompt=True)
        except Exception as e:
            raise APIError(400, f"messages: the chat template rejected them ({type(e).__name__}: {e})",
                           param="messages") from e
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        for i, m in enumerate(messages):
            check_unicode(m["content"], f"messages.{i}.content")
        for stop in body.stop_strings():
            check_unicode(stop, "stop")
        check_fits(sum(len(m["content"].encode()) for m in messages), "messages")
        # templating and tokenizing a long body takes seconds: off the event loop, so that /health
        # and the streams of other requests go on meanwhile
        prompt = await asyncio.to_thread(chat_prompt, messages)
        return await generate(request, body, prompt, body.max_completion_tokens or body.max_tokens, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        for stop in body.stop_strings():
            check_unicode(stop, "stop")
        if isinstance(prompt, str):
            check_unicode(prompt, "prompt")
            check_fits(len(prompt.encode()), "prompt")
            prompt = (await asyncio.to_thread(tokenizer, prompt))["input_ids"]
        if any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
        return await generate(request, body, list(prompt), body.max_tokens, "text")

    @app.get("/v1/models")
    async def models(request: Request):
        return {"object": "list", "data": [{"id": config.served_model_name, "object": "model", "created": created,
                                            "owned_by": "specheads", "max_model_len": engine.max_len}]}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if scheduler.admitting else "shutting_down", "running": len(scheduler.running),
                "queued": len(scheduler.pending)}
        return JSONResponse(body, status_code=200 if scheduler.admitting else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def choice_seed(seed: int | None, i: int) -> int | None:
    """Choice i's seed (a 64-bit integer): the request's own for choice 0, well-mixed others after."""
    if seed is None or i == 0:
        return seed
    mixed = (seed * 6364136223846793005 + 1442695040888963407 * i) % 2**64
    return mixed - 2**64 if mixed >= 2**63 else mixed


async def merged(streams):
    """(choice index, text, finish_reason, logprobs) from several delta streams as their pieces arrive; an
    error in one ends them all (and is raised); closing it closes every stream."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        try:
            async for text, reason, lps in stream:
                await queue.put((i, text, reason, lps, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, None, None, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    left = len(streams)
    try:
        while left:
            i, text, reason, lps, err = await queue.get()
            if err is not None:
                raise err
            left -= reason is not None
            yield i, text, reason, lps
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def error_headers(status: int) -> dict | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if status in (429, 503):  # a full queue drains in seconds; a shutting-down server is replaced soon
        return {"Retry-After": "1" if status == 429 else "5"}
    return None


def check_unicode(text: str, field: str) -> None:
    """JSON lets a string hold a lone surrogate (\\ud800); no tokenizer can encode one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start: e.end].encode("unicode_escape").decode()
        raise APIError(400, f"{field}: not valid Unicode at character {e.start} ({bad}: a lone surrogate); send "
                            "UTF-8 text", param=field.split(".")[0]) from None


class Guard:
    """ASGI middleware in front of the app: the API key is checked from the headers before any
    of the body is read, and a body over `max_bytes` is refused with 413 (from its Content-Length
    at once, or as soon as a chunked body passes the limit)."""

    def __init__(self, app, api_key: str | None, max_bytes: int, metrics: Metrics):
        self.app, self.api_key, self.max_bytes, self.metrics = app, api_key, max_bytes, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and path.startswith("/v1/") and not self._authorized(headers):
            return await self._refuse(scope, send, APIError(
                401, "Authorization header: missing or wrong API key (send 'Authorization: Bearer <key>' with the "
                     "server's --api-key)", param="api_key", code="invalid_api_key"))
        too_large = APIError(413, f"the request body is over {self.max_bytes} bytes (server --max-request-bytes)",
                             code="request_too_large")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(scope, send, too_large)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise StarletteHTTPException(413, too_large.message)
            return message

        return await self.app(scope, limited_receive, send)

    def _authorized(self, headers: dict) -> bool:
        scheme, _, token = headers.get("authorization", "").strip().partition(" ")
        # the scheme is case-insensitive (RFC 9110 11.1)
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def _refuse(self, scope, send, err: APIError) -> None:
        self.metrics.requests.labels(endpoint=scope["path"], status=str(err.status)).inc()
        response = JSONResponse(err.body(), status_code=err.status, headers=error_headers(err.status))
        await response(scope, _no_body, send)


async def _no_body():
    return {"type": "http.disconnect"}


class Shape:
    """The OpenAI response and chunk shapes of one request."""

    def __init__(self, rid: str, model: str, kind: str, token_text=None):
        self.rid, self.model, self.kind, self.created = rid, model, kind, int(time.time())
        self.token_text = token_text  # token id -> its text, where the request asked for logprobs

    def logprobs(self, lps: list | None, offset: int = 0) -> dict | None:
        """The OpenAI `logprobs` object of some tokens: chat's `content` list, or the completions'
        parallel lists (with text offsets from `offset`)."""
        if lps is None or self.token_text is None:
            return None
        text = self.token_text
        if self.kind == "chat":
            def entry(t, lp):
                s = text(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
            return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in top]} for t, lp, top in lps]}
        tokens = [text(t) for t, _, _ in lps]
        offsets = []
        for s in tokens:
            offsets.append(offset)
            offset += len(s)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in lps],
                "top_logprobs": [{text(a): v for a, v in top} for _, _, top in lps], "text_offset": offsets}

    def _base(self, obj: str) -> dict:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def response(self, choices: list[tuple[str, str, list | None]], stats: RequestStats) -> dict:
        """choices: (text, finish_reason, logprobs) of each choice, in index order."""
        if self.kind == "chat":
            out = self._base("chat.completion")
            listed = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                       "logprobs": self.logprobs(lps)} for i, (text, reason, lps) in enumerate(choices)]
        else:
            out = self._base("text_completion")
            listed = [{"index": i, "text": text, "finish_reason": reason, "logprobs": self.logprobs(lps)}
                      for i, (text, reason, lps) in enumerate(choices)]
        return {**out, "choices": listed, "usage": stats.usage(), "speculation": stats.speculation()}

    def chunk(self, delta, reason: str | None, stats: RequestStats | None = None, index: int = 0,
              lps: list | None = None) -> dict:
        if self.kind == "chat":
            delta = delta if isinstance(delta, dict) else ({"content": delta} if delta else {})
            out = {**self._base("chat.completion.chunk"),
                   "choices": [{"index": index, "delta": delta, "finish_reason": reason,
                                "logprobs": self.logprobs(lps)}]}
        else:
            out = {**self._base("text_completion"),
                   "choices": [{"index": index, "text": delta, "finish_reason": reason,
                                "logprobs": self.logprobs(lps)}]}
        if stats is not None:  # the last chunk carries the request's totals
            out["usage"], out["speculation"] = stats.usage(), stats.speculation()
        return out

    @staticmethod
    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def until_disconnect(request: Request, awaitable):
    """The awaitable's result, or None if the client hung up first (the awaitable is cancelled)."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, StopAsyncIteration):
            pass
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def validation_error(exc: RequestValidationError) -> APIError:
    """pydantic's first complaint, naming the field the way the OpenAI API does."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}")
    if not loc:
        return APIError(400, f"the request body must be a JSON object ({err['msg']})")
    param = ".".join(loc[:2]) if loc[0] in ("speculation", "stream_options") and len(loc) > 1 else loc[0]
    where = ".".join(x for x in loc if not x.startswith(("str", "list[", "int", "function-")))
    msg = err["msg"].removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "this server does not implement this field (it is refused rather than ignored)"
    return APIError(400, f"{where or param}: {msg}", param=param)
