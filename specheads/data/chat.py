"""Chat template rendering and the assistant-only loss mask.

The mask comes from character spans: each assistant turn's span is what rendering
`messages[:i+1]` adds after rendering `messages[:i]` with the generation prompt, so it
covers the turn's text and its end-of-turn tokens, for any template that renders
prefix-stably. Tokens are then mapped to spans through the tokenizer's offsets.
"""

from __future__ import annotations

import bisect

from specheads.data.sources import DataError
from specheads.target import chat as target_chat


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The target's template (specheads.target.chat), its refusal a DataError: prepare counts the
    conversation as skipped for that reason."""
    try:
        return target_chat.render(tokenizer, messages, add_generation_prompt)
    except target_chat.ChatTemplateError as e:
        raise DataError(str(e)) from e


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    full = render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], add_generation_prompt=True)
        upto = render(tokenizer, messages[: i + 1])
        if not (upto.startswith(before) and full.startswith(upto)):
            raise DataError("chat template does not render conversation prefixes stably")
        # the template's trailing newline after the end-of-turn token is never generated
        spans.append((len(before), len(before) + len(upto[len(before):].rstrip())))
    return full, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int) -> tuple[list[int], list[int], bool]:
    """Returns (input_ids, loss_mask, truncated). loss_mask is 1 on assistant tokens only."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the target tokenizer has no chat template; pass a chat model or set one")
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    starts = [s for s, _ in spans]
    mask = []
    for start, end in offsets:
        k = bisect.bisect_right(starts, start) - 1
        inside = k >= 0 and start < spans[k][1] and end > start
        mask.append(1 if inside else 0)
    truncated = len(ids) > max_length
    return ids[:max_length], mask[:max_length], truncated


def first_repeat_end(ids: list[int], n: int) -> int | None:
    """Length of the prefix that ends with the first n-gram seen before in `ids` (the loop has
    then run n tokens), or None when no n-gram repeats."""
    seen = set()
    for t in range(n, len(ids) + 1):
        gram = tuple(ids[t - n : t])
        if gram in seen:
            return t
        seen.add(gram)
    return None


def cut_loops(tokenizer, messages: list[dict], n: int) -> tuple[list[dict], int, int]:
    """Cut every assistant answer where it starts to repeat itself: after its first repeated
    n-gram. Returns (messages, answers cut, assistant tokens removed).

    Greedy answers of small models often loop until the token limit; those tokens cost
    training time and teach nothing but copying, which the kept first repeat shows. The loss
    targets stay the target's own distributions over the shorter context."""
    out, cut, removed = [], 0, 0
    for m in messages:
        if m["role"] == "assistant":
            ids = tokenizer(m["content"], add_special_tokens=False)["input_ids"]
            end = first_repeat_end(ids, n)
            if end is not None and end < len(ids):
                m = {**m, "content": tokenizer.decode(ids[:end])}
                cut += 1
                removed += len(ids) - end
        out.append(m)
    return out, cut, removed
