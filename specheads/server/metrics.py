"""Prometheus metrics of one app, in a registry of its own (several servers can run in one
process, as in the tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        p = "specheads_"
        self.requests = Counter(p + "requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.choices = Counter(p + "choices", "choices of admitted requests (n of each)", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "request arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds",
                             "time between tokens of a request (a step's gap shared by the tokens it emitted)",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "request_latency_seconds", "request arrival to its last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_length = Gauge(p + "queue_length", "requests waiting for an engine slot", registry=r)
        self.running = Gauge(p + "running_requests", "requests in the engine", registry=r)
        self.drafted = Counter(p + "draft_tokens", "draft tokens verified", registry=r)
        self.accepted = Counter(p + "accepted_tokens", "draft tokens accepted", registry=r)
        self.position_offered = Counter(p + "draft_position_offered", "steps whose tree reached this depth",
                                        ["position"], registry=r)
        self.position_accepted = Counter(p + "draft_position_accepted",
                                         "steps that accepted a draft token at this depth", ["position"], registry=r)
        self.plain_steps = Counter(p + "steps_without_drafts", "per-request decode steps that verified no drafts, by "
                                   "reason (request: speculation off; auto: acceptance below min_acceptance)",
                                   ["reason"], registry=r)
        self.spec_steps = Counter(p + "spec_steps", "per-request speculative steps", registry=r)
        self.steps_by_tree = Counter(p + "steps_by_tree", "per-request decode steps by the tree the speculation "
                                     "policy verified (STEPS,TOPK,DRAFT_TOKENS; none: no drafts)", ["tree"], registry=r)
        self.step_tokens = Counter(p + "spec_step_tokens", "tokens emitted by those steps (bonus included)",
                                   registry=r)
        self.mean_accept_length = Gauge(p + "mean_acceptance_length",
                                        "tokens per step per request, since start", registry=r)
        self._steps = self._step_tokens = 0

    def record_step(self, drafted: int, accepted: int, accept_length: int, draft_depth: int,
                    no_draft_reason: str | None = None, draft_tree=None) -> None:
        """One request's share of one engine step (draft_tree: the tier it verified, None: none)."""
        if no_draft_reason is not None:
            self.plain_steps.labels(reason=no_draft_reason).inc()
        self.steps_by_tree.labels(tree=str(draft_tree) if draft_tree is not None else "none").inc()
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        for k in range(1, draft_depth + 1):
            self.position_offered.labels(position=str(k)).inc()
        for k in range(1, accepted + 1):  # an accepted path of n drafts covers depths 1..n
            self.position_accepted.labels(position=str(k)).inc()
        if accept_length:
            self.spec_steps.inc()
            self.step_tokens.inc(accept_length)
            self._steps += 1
            self._step_tokens += accept_length
            self.mean_accept_length.set(self._step_tokens / self._steps)

    def render(self) -> bytes:
        return generate_latest(self.registry)
