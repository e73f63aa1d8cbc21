"""Incremental detokenization (characters split across byte-level tokens) and stop strings
split across deltas."""

from __future__ import annotations

import random

import pytest

from specheads.server.tokens import Detokenizer, StopMatcher

TEXT = "Hello wörld, 你好 ✓ the cat sat. Ünïcode: naïve café 🙂 done"


def test_deltas_join_to_the_full_decode_in_any_grouping(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the text must split characters across tokens"
    rng = random.Random(0)
    for _ in range(20):
        detok, deltas, i = Detokenizer(tokenizer), [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            deltas.append(detok.add(ids[i:i + n]))
            i += n
        deltas.append(detok.flush())
        assert "".join(deltas) == TEXT
        assert all("\ufffd" not in d for d in deltas)


def test_flush_returns_an_incomplete_character(tokenizer):
    ids = tokenizer("a 🙂", add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tokenizer)
    out = detok.add(ids[:-1])
    assert "\ufffd" not in out
    assert out + detok.flush() == tokenizer.decode(ids[:-1])


@pytest.mark.parametrize("stops, cut", [(["STOP"], "abc "), (["xyz", "c S"], "ab"), (["never"], None)])
def test_stop_strings_split_across_deltas(stops, cut):
    text = "abc STOP def"
    for size in (1, 2, 3, 5, len(text)):
        m, sent, stopped = StopMatcher(stops), [], False
        for i in range(0, len(text), size):
            out, stopped = m.push(text[i:i + size])
            sent.append(out)
            if stopped:
                break
        if not stopped:
            sent.append(m.flush())
        assert "".join(sent) == (text if cut is None else cut), (stops, size)
        assert stopped == (cut is not None)
