"""Continuous batching: one worker thread owns the engine; requests join and leave between
speculative steps.

The engine is not thread-safe and blocks while it steps, so only the worker touches it.
The event loop hands jobs over through a bounded queue and asks for aborts through flags
(client gone, stop string reached, shutdown); the worker applies them between steps and
sends each job's outputs back with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specheads.runtime.sampling import InvalidRequest
from specheads.server.schemas import APIError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    request: object  # specheads.runtime.engine.Request
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic()
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("out", StepOutput) | ("error", APIError)
    handle: int | None = None
    cancelled: bool = False  # set from the event loop; the worker aborts the request
    error: APIError | None = None  # sent to the client when the worker drops the job
    finished: bool = False

    def send(self, kind: str, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, item))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class Scheduler:
    def __init__(self, engine, metrics, max_queue: int = 256, request_timeout: float = 600.0):
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        self.pending: deque[Job] = deque()
        self.running: dict[int, Job] = {}
        self.cond = threading.Condition()
        self.admitting = True
        self.stopped = False
        self.thread = threading.Thread(target=self._work, name="specheads-scheduler", daemon=True)
        metrics.queue_length.set_function(lambda: len(self.pending))
        metrics.running.set_function(lambda: len(self.running))

    # ------------------------------------------------------------------ event loop side
    def start(self) -> None:
        self.thread.start()

    def submit(self, request, loop: asyncio.AbstractEventLoop) -> Job:
        job = Job(request, loop, time.monotonic() + self.request_timeout)
        with self.cond:
            if not self.admitting:
                raise APIError(503, "the server is shutting down and accepts no new requests", type="server_error",
                               code="shutting_down")
            # the free slots take waiting jobs at the worker's next turn: they are not queue places
            free = max(self.engine.max_batch - len(self.running), 0)
            if len(self.pending) >= self.max_queue + free:
                raise APIError(429, f"the request queue is full ({self.max_queue} waiting, server --max-queue); "
                                    "retry later", type="rate_limit_error", code="queue_full")
            self.pending.append(job)
            self.cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        with self.cond:
            job.cancelled = True
            self.cond.notify()

    def stop_admitting(self) -> None:
        with self.cond:
            self.admitting = False

    def fail_all(self, message: str) -> None:
        """Every queued and running request ends with `message` (shutdown past its grace period)."""
        with self.cond:
            for job in list(self.pending) + list(self.running.values()):
                job.error = job.error or APIError(503, message, type="server_error", code="shutting_down")
                job.cancelled = True
            self.cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        self.stop_admitting()
        self.fail_all("the server stopped before this request finished")
        with self.cond:
            self.stopped = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    # ------------------------------------------------------------------ worker thread
    def _work(self) -> None:
        while True:
            with self.cond:
                while not (self.stopped or self.pending or self.running):
                    self.cond.wait()
                if self.stopped and not self.pending and not self.running:
                    return
                admit = self._drop_and_take()
            for job in admit:
                self._add(job)
            self._abort_cancelled()
            if not self.running:
                continue
            try:
                outs = self.engine.step()
            except Exception as e:  # a broken step fails the requests in it, not the server
                log.exception("engine step failed")
                for handle in list(self.running):
                    try:
                        self.engine.abort(handle)
                    except Exception:
                        pass
                    self._drop(handle, APIError(500, f"the engine failed: {type(e).__name__}: {e}",
                                                type="server_error"))
                continue
            for out in outs:
                job = self.running.get(out.handle)
                if job is None:
                    continue
                self.metrics.generation_tokens.inc(len(out.new_tokens))
                if not out.prefill:  # the prompt's own token is no speculative step
                    self.metrics.record_step(out.drafted, out.accepted, out.accept_length, out.draft_depth,
                                             out.no_draft_reason, out.draft_tree)
                job.send("out", out)
                if out.finish_reason is not None:  # the engine freed its slot
                    del self.running[out.handle]

    def _drop_and_take(self) -> list[Job]:
        """Under the lock: fail cancelled / expired queued jobs, pop as many as there are free slots."""
        now = time.monotonic()
        keep = deque()
        for job in self.pending:
            if job.cancelled or now > job.deadline:
                error = job.error or (None if job.cancelled else self._timeout_error())
                if error is not None:
                    job.send("error", error)
            else:
                keep.append(job)
        self.pending = keep
        admit = []
        free = self.engine.free_slots
        while self.pending and len(admit) < free:
            admit.append(self.pending.popleft())
        return admit

    def _add(self, job: Job) -> None:
        try:
            job.handle = self.engine.add(job.request)
        except InvalidRequest as e:
            job.send("error", APIError(400, str(e)))
            return
        except Exception as e:
            job.send("error", APIError(500, f"the engine refused the request: {type(e).__name__}: {e}",
                                       type="server_error"))
            return
        self.running[job.handle] = job

    def _abort_cancelled(self) -> None:
        now = time.monotonic()
        for handle, job in list(self.running.items()):
            if job.cancelled or now > job.deadline:
                self.engine.abort(handle)
                self._drop(handle, job.error or (None if job.cancelled else self._timeout_error()))

    def _drop(self, handle: int, error: APIError | None) -> None:
        job = self.running.pop(handle)
        if error is not None:
            job.send("error", error)

    def _timeout_error(self) -> APIError:
        return APIError(504, f"the request did not finish within {self.request_timeout:g} s (server "
                             "--request-timeout); it was stopped and its slot freed", type="server_error",
                        code="timeout")
