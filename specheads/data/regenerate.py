"""Self-distillation data: the target writes every assistant turn itself.

Turn by turn: round r answers the r-th user turn of every conversation that still has
one, batched across conversations, so that later turns see the target's own earlier
answers. A conversation stops where its prompt would leave no room in `max_length`.

With `state_path`, the work is saved after every chunk of answers (atomically), and a
rerun with the same inputs continues from there: a regeneration killed after an hour
loses at most one chunk.

`regenerate_on` spreads the conversations over several devices (conversation i to device
i mod n), one process each with its own saved state; the results come back in input order.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path

from tqdm.auto import tqdm

from specheads.data.chat import render
from specheads.data.sources import Conversation, DataError, has_answer
from specheads.files import write_text
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.target.chat import stop_token_ids

STATE_VERSION = 1
STATE_FILE = "regenerate_state.json"  # one device; with n devices: regenerate_state.{k}-of-{n}.json


def _fingerprint(conversations, params, max_length, max_turns, chunk) -> str:
    """What the saved work depends on: the inputs in order and every option."""
    h = hashlib.sha256()
    h.update(json.dumps([asdict(params), max_length, max_turns, chunk], sort_keys=True).encode())
    for c in conversations:
        h.update(json.dumps([c.id, c.messages], sort_keys=True).encode())
    return h.hexdigest()


def _save(path: Path, state: dict) -> None:
    write_text(path, json.dumps(state))


def regenerate(
    model,
    tokenizer,
    conversations: list[Conversation],
    params: SamplingParams,
    max_length: int,
    batch_size: int = 64,
    max_turns: int | None = None,
    state_path: str | Path | None = None,
    chunk: int | None = None,
) -> list[Conversation]:
    """`chunk`: answers per saved unit (default 8 x batch_size); the seeds of a chunk depend only
    on its round and place, so a resumed run samples what an uninterrupted one would.
    Conversations left without an assistant turn are dropped."""
    answered = _regenerate(model, tokenizer, conversations, params, max_length, batch_size, max_turns,
                           state_path, chunk, 0)
    return _answered(conversations, answered)


def _answered(conversations: list[Conversation], messages: list[list[dict]]) -> list[Conversation]:
    """The conversations with their regenerated messages, less those left without an answer (no
    assistant turn, or only whitespace ones: what reading the saved file back would skip)."""
    return [Conversation(c.id, m, c.split_key) for c, m in zip(conversations, messages) if has_answer(m)]


def _regenerate(model, tokenizer, conversations, params, max_length, batch_size, max_turns, state_path, chunk,
                position) -> list[list[dict]]:
    """The messages of every conversation, in input order, each as far as it was answered."""
    stops = stop_token_ids(tokenizer)
    chunk = chunk or 8 * batch_size
    key = _fingerprint(conversations, params, max_length, max_turns, chunk)
    state_path = Path(state_path) if state_path else None
    state = None
    if state_path is not None and state_path.is_file():
        saved = json.loads(state_path.read_text())
        if saved.get("version") == STATE_VERSION and saved.get("key") == key:
            state = saved
            tqdm.write(f"regenerate: resuming from {state_path} (round {state['round']})")
        else:
            tqdm.write(f"regenerate: {state_path} was written for other inputs or options; starting over")
    if state is None:
        convs = []
        for c in conversations:
            system = [m for m in c.messages[:1] if m["role"] == "system"]
            users = [m for m in c.messages if m["role"] == "user"]
            convs.append({"id": c.id, "messages": list(system), "users": users[:max_turns] if max_turns else users,
                          "answered": 0, "open": True})
        state = {"version": STATE_VERSION, "key": key, "round": 0, "jobs": None, "convs": convs}
    convs = state["convs"]
    # answers are cut where prompt + answer reach max_length (the engine's context)
    engine = SpecEngine(model, method="ar", max_len=min(max_length, model.rotary.max_positions), max_batch=batch_size)
    total = sum(len(s["users"]) for s in convs)
    done = sum(s["answered"] if s["open"] else len(s["users"]) for s in convs)
    bar = tqdm(total=total, initial=done, desc=f"regenerate [{position}]" if position else "regenerate", unit="turn",
               position=position)

    def prompt_of(s, r):
        msgs = s["messages"] + [s["users"][r]]
        text = render(tokenizer, msgs, add_generation_prompt=True)
        return msgs, tokenizer(text, add_special_tokens=False)["input_ids"]

    while True:
        r = state["round"]
        if state["jobs"] is None:  # a new round: fix its job list (and close what no longer fits) once
            jobs = []
            for i, s in enumerate(convs):
                if not s["open"] or r >= len(s["users"]):
                    continue
                if len(prompt_of(s, r)[1]) >= engine.max_len - 8:
                    s["open"] = False
                    bar.update(len(s["users"]) - r)
                    continue
                jobs.append(i)
            if not jobs:
                break
            state["jobs"] = jobs
        jobs = state["jobs"]
        for c0 in range(0, len(jobs), chunk):
            todo = [i for i in jobs[c0 : c0 + chunk] if convs[i]["answered"] == r]
            if not todo:
                continue  # done before a restart
            built = [prompt_of(convs[i], r) for i in todo]
            seed = None if params.seed is None else params.seed + r * 100003 + c0
            outs = engine.generate([p for _, p in built], replace(params, seed=seed), stops, progress=bar.update)
            for i, (msgs, _), res in zip(todo, built, outs):
                convs[i]["messages"] = msgs + [{"role": "assistant", "content": tokenizer.decode(res.token_ids)}]
                convs[i]["answered"] = r + 1
            if state_path is not None:
                _save(state_path, state)
        state["round"], state["jobs"] = r + 1, None
        if state_path is not None:
            _save(state_path, state)
    bar.close()
    return [s["messages"] for s in convs]


def state_files(folder: str | Path) -> list[Path]:
    """The saved regeneration state(s) in an output folder, for any device count."""
    return sorted(Path(folder).glob("regenerate_state*.json"))


def parse_devices(spec: str | None) -> list[str]:
    """`None` -> one device (cuda if there is one, else cpu); `all` -> every visible GPU;
    `4` -> cuda:0..3; `cuda:0,cuda:2` or `cpu,cpu` -> those."""
    import torch

    n_gpu = torch.cuda.device_count()
    if spec is None or spec == "":
        return ["cuda" if n_gpu else "cpu"]
    if spec == "all":
        if not n_gpu:
            raise DataError("devices 'all': no CUDA device is visible; leave --devices out to run on the CPU")
        return [f"cuda:{i}" for i in range(n_gpu)]
    if spec.isdigit():
        n = int(spec)
        if not 1 <= n <= max(n_gpu, 1):
            raise DataError(f"devices {spec!r}: {n_gpu} CUDA device(s) are visible; give 1..{max(n_gpu, 1)}")
        return [f"cuda:{i}" for i in range(n)] if n_gpu else ["cpu"]
    out = [d.strip() for d in spec.split(",") if d.strip()]
    for d in out:
        if d == "cpu" or d == "cuda":
            continue
        if not (d.startswith("cuda:") and d[5:].isdigit() and int(d[5:]) < n_gpu):
            raise DataError(f"devices {spec!r}: {d!r} is not cpu or cuda:K with K < {n_gpu} (the visible GPUs)")
    return out


def _device_dtype(device: str):
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _shard_worker(target_dir, device, conversations, params, max_length, batch_size, max_turns, state_path,
                  position):
    import torch

    from specheads.target.loader import load_target

    if device.startswith("cuda:"):
        torch.cuda.set_device(device)  # Triton launches on the current device
    model, tokenizer, _ = load_target(target_dir, dtype=_device_dtype(device), device=device)
    return _regenerate(model, tokenizer, conversations, params, max_length, batch_size, max_turns, state_path,
                       None, position)


def regenerate_on(
    devices: list[str],
    target_dir: str | Path,
    conversations: list[Conversation],
    params: SamplingParams,
    max_length: int,
    batch_size: int = 64,
    max_turns: int | None = None,
    state_dir: str | Path | None = None,
) -> list[Conversation]:
    """`regenerate` on one or several devices (one process each), saving under `state_dir`.
    Greedy answers do not depend on the device count beyond rounding; sampled ones take
    other seeds per chunk, since the chunks differ."""
    n = len(devices)
    state_dir = Path(state_dir) if state_dir is not None else None
    if n == 1:  # in this process, on the same path as a worker's
        state = state_dir / STATE_FILE if state_dir is not None else None
        return _answered(conversations, _shard_worker(str(target_dir), devices[0], conversations, params, max_length,
                                                      batch_size, max_turns, state, 0))
    shards = [conversations[k::n] for k in range(n)]
    answered: list = [None] * len(conversations)
    # a Pool (not an executor): a shard that fails ends the others at once (terminate on exit),
    # instead of after they finish; their saved chunks stay
    with get_context("spawn").Pool(n) as pool:
        results = [
            pool.apply_async(_shard_worker, (str(target_dir), dev, shards[k], params, max_length, batch_size, max_turns,
                                             state_dir / f"regenerate_state.{k}-of-{n}.json" if state_dir else None, k))
            for k, dev in enumerate(devices)
        ]
        pending = set(range(n))
        while pending:
            for k in sorted(pending):
                if not results[k].ready():
                    continue
                pending.discard(k)
                try:
                    answered[k::n] = results[k].get()
                except Exception as e:
                    raise RuntimeError(f"regeneration on {devices[k]} (shard {k} of {n}) failed: {e!r}; "
                                       "the finished chunks are saved: the same command continues") from e
            if pending:
                results[min(pending)].wait(0.5)
    return _answered(conversations, answered)
