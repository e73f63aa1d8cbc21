"""Self-distillation data: the target writes every assistant turn itself.

Turn by turn: round r answers the r-th user turn of every conversation that still has
one, batched across conversations (sorted by prompt length), so that later turns see
the target's own earlier answers. A conversation stops where its prompt would leave no
room in `max_length`.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from specheads.data.chat import render
from specheads.data.sources import Conversation
from specheads.runtime.generate import generate_batch
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
            if len(prompt) >= max_length - 8:
                s["open"] = False
                bar.update(len(s["users"]) - round_idx)
                continue
            jobs.append((s, msgs, prompt))
        if not jobs:
            break
        jobs.sort(key=lambda j: len(j[2]))
        for i in range(0, len(jobs), batch_size):
            chunk = jobs[i : i + batch_size]
            room = max_length - max(len(j[2]) for j in chunk)
            p = SamplingParams(**{**params.__dict__, "max_new_tokens": max(1, min(params.max_new_tokens, room))})
            if p.seed is not None:
                p.seed = p.seed + round_idx * 100003 + i
            outs = generate_batch(model, [j[2] for j in chunk], p, stops)
            for (s, msgs, _), new in zip(chunk, outs):
                s["messages"] = msgs + [{"role": "assistant", "content": tokenizer.decode(new)}]
            bar.update(len(chunk))
        round_idx += 1
    bar.close()
    return [
        Conversation(s["id"], s["messages"])
        for s in states
        if any(m["role"] == "assistant" for m in s["messages"])
    ]
