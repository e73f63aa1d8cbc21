"""Chat rendering and the assistant-only loss mask."""

from __future__ import annotations

import copy

import pytest

from specheads.data.chat import assistant_spans, render, tokenize_conversation
from specheads.data.sources import DataError

CONVERSATION = [
    {"role": "system", "content": "Be brief and kind."},
    {"role": "user", "content": "Hello world, how are you?"},
    {"role": "assistant", "content": "Fine thanks, the cat sat on the mat."},
    {"role": "user", "content": "Why?"},
    {"role": "assistant", "content": "Because the dog was slow!"},
]


def _segments(ids, mask, value=1):
    segs, cur = [], []
    for i, m in zip(ids, mask):
        if m == value:
            cur.append(i)
        elif cur:
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    return segs


def test_render_chatml(tokenizer):
    text = render(tokenizer, CONVERSATION[:2], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief and kind.<|im_end|>\n"
        "<|im_start|>user\nHello world, how are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_assistant_spans_are_the_turns(tokenizer):
    text, spans = assistant_spans(tokenizer, CONVERSATION)
    assert len(spans) == 2
    for (s, e), m in zip(spans, [CONVERSATION[2], CONVERSATION[4]]):
        assert text[s:e].startswith(m["content"] + "<|im_end|>")
        assert text[s - len("<|im_start|>assistant\n") : s] == "<|im_start|>assistant\n"


def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer):
    ids, mask, truncated = tokenize_conversation(tokenizer, CONVERSATION, max_length=1000)
    assert not truncated
    assert len(ids) == len(mask)
    assert set(mask) == {0, 1}
    # the full text round-trips
    assert tokenizer.decode(ids) == render(tokenizer, CONVERSATION)
    segments = [tokenizer.decode(s) for s in _segments(ids, mask)]
    answers = [CONVERSATION[2]["content"], CONVERSATION[4]["content"]]
    assert len(segments) == 2
    for seg, answer in zip(segments, answers):
        # the answer's text and its end-of-turn token
        assert seg == answer + "<|im_end|>", seg  # not the template's newline after it
    # everything else (system, user, role headers) has mask 0
    unmasked = tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
    assert "Be brief and kind." in unmasked and "Hello world, how are you?" in unmasked and "Why?" in unmasked
    assert unmasked.count("<|im_start|>assistant\n") == 2
    for answer in answers:
        assert answer not in unmasked
    # the first masked token is the first token of the answer, not the role header
    first = mask.index(1)
    assert tokenizer.decode(ids[:first]).endswith("<|im_start|>user\nHello world, how are you?<|im_end|>\n"
                                                  "<|im_start|>assistant\n")


def test_system_and_user_only_tokens_get_zero(tokenizer):
    ids, mask, _ = tokenize_conversation(tokenizer, CONVERSATION[:2] + [{"role": "assistant", "content": "Ok."}], 1000)
    n_prefix = len(tokenizer(render(tokenizer, CONVERSATION[:2], add_generation_prompt=True),
                             add_special_tokens=False)["input_ids"])
    assert mask[:n_prefix] == [0] * n_prefix
    assert all(m == 1 for m in mask[n_prefix:-1])


def test_max_length_truncation(tokenizer):
    full_ids, full_mask, t = tokenize_conversation(tokenizer, CONVERSATION, max_length=1000)
    assert not t
    ids, mask, truncated = tokenize_conversation(tokenizer, CONVERSATION, max_length=40)
    assert truncated
    assert len(ids) == len(mask) == 40
    assert ids == full_ids[:40] and mask == full_mask[:40]
    ids, mask, truncated = tokenize_conversation(tokenizer, CONVERSATION, max_length=len(full_ids))
    assert not truncated and ids == full_ids


def test_no_chat_template_is_an_error(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tokenize_conversation(tok, CONVERSATION, 100)


def test_template_exception_becomes_data_error(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(DataError, match="chat template rejected"):
        tokenize_conversation(tok, CONVERSATION, 100)


def test_prefix_unstable_template_is_detected(tokenizer):
    tok = copy.deepcopy(tokenizer)
    # the header depends on the number of messages, so prefixes do not render stably
    tok.chat_template = "{{ messages | length }}" + tokenizer.chat_template
    with pytest.raises(DataError, match="prefixes stably"):
        tokenize_conversation(tok, CONVERSATION, 100)
