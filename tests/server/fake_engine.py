"""A stand-in for SpecEngine with the same slot API, for the scheduler's timing cases
(timeouts, disconnects, shutdown): its "target" is a fixed function of the history, each
step can be slowed down, and it emits 1..num_steps+1 tokens per step like a speculative
step would."""

from __future__ import annotations

import time

from specheads.runtime.engine import Request, StepOutput
from specheads.runtime.sampling import InvalidRequest


class FakeEngine:
    method = "eagle3"

    def __init__(self, token_ids: list[int], max_batch: int = 4, max_len: int = 256, num_steps: int = 3,
                 num_draft_tokens: int = 8, step_delay: float = 0.0):
        self.token_ids = token_ids  # the tokens the "target" writes
        self.max_batch, self.max_len = max_batch, max_len
        self.num_steps, self.num_draft_tokens = num_steps, num_draft_tokens
        self.step_delay = step_delay
        self.slots: dict[int, dict] = {}
        self.new: list[int] = []
        self.next_handle = 0
        self.aborted: list[int] = []
        self.steps = 0

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.slots)

    @property
    def active(self) -> int:
        return len(self.slots)

    @property
    def has_work(self) -> bool:
        return bool(self.slots)

    def next_token(self, history: list[int]) -> int:
        return self.token_ids[(sum(history) * 7 + len(history)) % len(self.token_ids)]

    def reference(self, prompt: list[int], max_new_tokens: int, stop_ids=()) -> list[int]:
        hist, out = list(prompt), []
        while len(out) < max_new_tokens:
            t = self.next_token(hist)
            if t in stop_ids:
                break
            hist.append(t)
            out.append(t)
        return out

    def add(self, req: Request) -> int:
        req.params.validate()
        if not req.prompt:
            raise InvalidRequest("prompt is empty")
        if len(req.prompt) + req.params.max_new_tokens > self.max_len:
            raise InvalidRequest(f"max_new_tokens {req.params.max_new_tokens} + prompt {len(req.prompt)} > {self.max_len}")
        if not self.free_slots:
            raise RuntimeError("no free slot")
        h = self.next_handle
        self.next_handle += 1
        self.slots[h] = {"req": req, "hist": list(req.prompt), "out": [], "fresh": True}
        return h

    def abort(self, h: int) -> None:
        self.aborted.append(h)
        del self.slots[h]

    def step(self) -> list[StepOutput]:
        time.sleep(self.step_delay)
        self.steps += 1
        outs = []
        for h, s in list(self.slots.items()):
            req = s["req"]
            depth = 0 if not req.spec.enabled else (req.spec.num_steps or self.num_steps)
            n = 1 + (self.steps + h) % (depth + 1)  # accept 0..depth drafts
            if s["fresh"]:
                n += 1  # the prefill's token
            new, reason = [], None
            for _ in range(n):
                t = self.next_token(s["hist"])
                if t in req.stop_ids:
                    reason = "stop"
                    break
                s["hist"].append(t)
                new.append(t)
                s["out"].append(t)
                if len(s["out"]) >= req.params.max_new_tokens:
                    reason = "length"
                    break
            s["fresh"] = False
            accepted = max(min(len(new), n) - 1, 0) if depth else 0
            outs.append(StepOutput(h, new, reason, depth * 2 if depth else 0, accepted, accepted + 1, depth))
            if reason:
                del self.slots[h]
        return outs
