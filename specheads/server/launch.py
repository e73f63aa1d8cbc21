"""Load target + head, build the engine and the app, run uvicorn with a graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

import uvicorn

from specheads.runtime.defaults import resolve_tree
from specheads.server.app import ServerConfig, create_app

log = logging.getLogger(__name__)


def load_engine(target: str | None, draft: str | None, method: str | None = None, num_steps: int | None = None,
                topk: int | None = None, num_draft_tokens: int | None = None, max_batch: int = 8,
                max_len: int | None = None, draft_lm_head_int8: bool = True, speculation_policy: str | None = None,
                speculation_tiers: str | None = None, speculation_profile: str | None = None,
                speculation_settings: str | None = None, draft_options=()):
    """(engine, tokenizer, target folder) on the GPU if there is one. draft_lm_head_int8: the
    head's drafter drafts with an int8 lm_head (changes drafts only, never the output); draft_options:
    more of the drafter's options, 'NAME=VALUE' each.
    speculation_policy: fixed or adaptive (None: runtime.policy.default_policy). A tree value left
    None comes from the head's own tree, else from the runtime's default (defaults.resolve_tree)."""
    import torch

    from specheads.drafters import method_needs_head
    from specheads.drafters.draft_model import load_draft
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.policy import default_policy
    from specheads.target.loader import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, tok, folder = load_target(target, dtype=dtype, device=device)
    head = load_draft(draft, tok, device=device, dtype=dtype) if draft and method_needs_head(method) else None
    policy = speculation_policy or default_policy(device == "cuda", speculation_tiers, speculation_profile,
                                                  speculation_settings)
    num_steps, topk, num_draft_tokens = resolve_tree(num_steps, topk, num_draft_tokens, head)
    engine = SpecEngine(model, head, method=method, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens,
                        max_len=max_len, max_batch=max_batch,
                        drafter_options=drafter_options(head, draft_lm_head_int8, draft_options),
                        speculation_policy=policy,
                        speculation_tiers=speculation_tiers, speculation_profile=speculation_profile,
                        speculation_settings=speculation_settings)
    if device == "cuda":  # the greedy graphs now (every tier's; with their costs timed), so no request waits
        t0 = time.perf_counter()
        engine.capture_common(range(1, max_batch + 1))
        print(f"{engine.graph_summary()}; start-up capture {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)
    return engine, tok, folder


def drafter_options(head, lm_head_int8: bool, options=()) -> dict:
    """The drafter's options from the command line: --draft-lm-head (only a change from the drafter's
    default is passed, so a head kind without the option is not handed it), then each --draft-option
    NAME=VALUE (e.g. ngram_gate=0 to turn the n-gram assist's gate off, drafters/assist.py)."""
    from specheads.drafters import parse_options

    out = {"lm_head_int8": False} if head is not None and not lm_head_int8 else {}
    out.update(parse_options(",".join(options)))
    return out


def model_name(target, folder) -> str:
    """What clients pass as `model`: the hub id as given, else the folder or file name."""
    from pathlib import Path

    from specheads.target.loader import DEFAULT_TARGET

    if target is None or str(target) == DEFAULT_TARGET:
        return "SmolLM2-135M-Instruct"  # the embedded default, not its cache folder's name
    path = Path(str(target))
    if path.exists():
        return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    return str(target)


class GracefulServer(uvicorn.Server):
    """On shutdown (SIGTERM, Ctrl-C) the server drains: the listener stays open and new requests
    get 503 with Retry-After, in-flight ones get `grace` seconds to finish (then each gets a clear
    error instead of a cut connection), and only then does the listener close. The process then
    exits with status 0: a drained shutdown is a clean one."""

    def __init__(self, config: uvicorn.Config, scheduler, grace: float):
        super().__init__(config)
        self.scheduler, self.grace = scheduler, grace

    async def shutdown(self, sockets=None):
        sched = self.scheduler
        sched.stop_admitting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while not sched.idle and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if not sched.idle:
            sched.fail_all(f"the server is shutting down; the request did not finish within the {self.grace:g} s "
                           "grace period")
            until = loop.time() + 5  # the worker hands each its error between steps
            while not sched.idle and loop.time() < until:
                await asyncio.sleep(0.05)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            # uvicorn re-raises the signal it caught once it has shut down (exit 143 on SIGTERM);
            # the drain above already did what the signal asked for
            self._captured_signals.clear()


def make_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> GracefulServer:
    grace = app.state.config.shutdown_grace
    # uvicorn's own limit only backs ours up: by then every request has had its error
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace + 5,
                            lifespan="on")
    return GracefulServer(config, app.state.scheduler, grace)


def serve(target, draft, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          api_key: str | None = None, max_queue: int = 256, request_timeout: float = 600.0,
          shutdown_grace: float = 30.0, max_request_bytes: int = 4 * 2**20, log_level: str = "info",
          **engine_kwargs) -> None:
    engine, tok, folder = load_engine(target, draft, **engine_kwargs)
    name = served_model_name or model_name(target, folder)
    app = create_app(engine, tok, ServerConfig(name, api_key, max_queue, request_timeout, shutdown_grace,
                                               max_request_bytes))
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        log.warning("serving on %s without --api-key: anyone who reaches this port can use it", host)
    policy = engine.policy
    speculation = f", policy {policy.name} over {'; '.join(map(str, policy.tiers))}" if policy is not None else ""
    print(f"specheads serve: model {name!r} (method {engine.method}{speculation}, max_batch {engine.max_batch}, "
          f"max_len {engine.max_len}) on http://{host}:{port}/v1", flush=True)
    make_server(app, host, port, log_level).run()
