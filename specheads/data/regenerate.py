"""Self-distillation data: the target writes every assistant turn itself.

Turn by turn: round r answers the r-th user turn of every conversation that still has
one, batched across conversations (sorted by prompt length), so that later turns see
the target's own earlier answers. A conversation stops where its prompt would leave no
room in `max_length`.
"""

from __future__ import annotations

from dataclasses import replace

from tqdm.auto import tqdm

from specheads.data.chat import render
from specheads.data.sources import Conversation
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams


def stop_token_ids(tokenizer) -> set[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return ids


def regenerate(
    model,
    tokenizer,
    conversations: list[Conversation],
    params: SamplingParams,
    max_length: int,
    batch_size: int = 64,
    max_turns: int | None = None,
) -> list[Conversation]:
    stops = stop_token_ids(tokenizer)
    # answers are cut where prompt + answer reach max_length (the engine's context)
    engine = SpecEngine(model, method="ar", max_len=min(max_length, model.rotary.max_positions), max_batch=batch_size)
    states = []
    for c in conversations:
        system = [m for m in c.messages[:1] if m["role"] == "system"]
        users = [m for m in c.messages if m["role"] == "user"]
        if max_turns:
            users = users[:max_turns]
        states.append({"id": c.id, "messages": list(system), "users": users, "open": True})
    total = sum(len(s["users"]) for s in states)
    bar = tqdm(total=total, desc="regenerate", unit="turn")
    round_idx = 0
    while True:
        jobs = []
        for s in states:
            if not s["open"] or round_idx >= len(s["users"]):
                continue
            msgs = s["messages"] + [s["users"][round_idx]]
            prompt = tokenizer(render(tokenizer, msgs, add_generation_prompt=True), add_special_tokens=False)[
                "input_ids"
            ]
            if len(prompt) >= engine.max_len - 8:
                s["open"] = False
                bar.update(len(s["users"]) - round_idx)
                continue
            jobs.append((s, msgs, prompt))
        if not jobs:
            break
        # one engine for all rounds: batch_size rows kept full, a finished answer's row takes the next prompt
        seed = None if params.seed is None else params.seed + round_idx * 100003
        outs = engine.generate([j[2] for j in jobs], replace(params, seed=seed), stops, progress=bar.update)
        for (s, msgs, _), res in zip(jobs, outs):
            s["messages"] = msgs + [{"role": "assistant", "content": tokenizer.decode(res.token_ids)}]
        round_idx += 1
    bar.close()
    return [
        Conversation(s["id"], s["messages"])
        for s in states
        if any(m["role"] == "assistant" for m in s["messages"])
    ]
