"""Prompts the target writes itself (`specheads self-prompts`), then answers (`prepare --regenerate`)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from specheads.data.self_prompts import (INFO_FILE, PROMPTS_FILE, SelfPromptSettings, keep_prompts, user_turn_prefix,
                                         write_self_prompts)
from specheads.data.sources import DataError

DRAFT_VOCAB = 64


@pytest.fixture
def ends_often(monkeypatch):
    """The tiny random target seldom writes its end-of-turn token: make a third of its vocabulary end a turn."""
    import specheads.target.chat as chat

    monkeypatch.setattr(chat, "stop_token_ids", lambda tok: set(range(0, len(tok), 3)))


def read_rows(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_user_turn_starts_where_the_template_puts_the_message(tokenizer):
    assert user_turn_prefix(tokenizer) == "<|im_start|>user\n"
    assert user_turn_prefix(tokenizer, "Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"


def test_the_filters_keep_ended_new_prompts_that_the_suite_does_not_share():
    from specheads.evaluation.suite import ngrams

    suite_text = "write a short poem about the sea in the style of a sailor"
    samples = [
        {"index": 0, "text": "How do I bake bread at home?", "ended": True},
        {"index": 1, "text": "How do I bake bread at home", "ended": False},  # cut at max_tokens
        {"index": 2, "text": "Hi", "ended": True},  # too short
        {"index": 3, "text": "how do I  bake BREAD at home?", "ended": True},  # the same text
        {"index": 4, "text": "Please write a short poem about the sea in the style of a sailor.", "ended": True},
        {"index": 5, "text": "What is a prime number?", "ended": True},
    ]
    rows, dropped = keep_prompts(list(reversed(samples)), SelfPromptSettings(), ngrams(suite_text), "r")
    assert [r["id"] for r in rows] == ["self-r-0", "self-r-5"]  # in index order: the first of equals kept
    assert rows[1]["messages"] == [{"role": "user", "content": "What is a prime number?"}]
    assert dropped == Counter({"the turn did not end within max_tokens": 1, "fewer than 3 words": 1,
                               "the same text as an earlier prompt": 1,
                               "shares a word 8-gram with the evaluation suite": 1})


def test_prompts_are_sampled_saved_by_chunk_and_resumed(tmp_path, chatty_target_dir, ends_often):
    settings = SelfPromptSettings(count=7, max_tokens=6, min_words=1, chunk=3)
    out = tmp_path / "sp"
    info = write_self_prompts(str(chatty_target_dir), out, settings, batch_size=4, device="cpu", progress=False)
    rows = read_rows(out / PROMPTS_FILE)
    assert info["sampled"] == 7 and info["kept"] == len(rows) > 0
    assert info["kept"] + sum(info["dropped"].values()) == 7
    assert json.loads((out / INFO_FILE).read_text())["kept"] == len(rows)
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" and r["messages"][0]["content"]
               for r in rows)
    chunks = sorted(out.glob("chunk-*.jsonl.gz"))
    assert [c.name for c in chunks] == ["chunk-00000.jsonl.gz", "chunk-00001.jsonl.gz", "chunk-00002.jsonl.gz"]
    # a run stopped after its first and last chunks continues with the middle one, and writes the same prompts
    middle = read_rows(chunks[1])
    stamps = [c.stat().st_mtime_ns for c in chunks]
    chunks[1].unlink()
    again = write_self_prompts(str(chatty_target_dir), out, settings, batch_size=4, device="cpu", progress=False)
    assert read_rows(chunks[1]) == middle and read_rows(out / PROMPTS_FILE) == rows
    assert [chunks[0].stat().st_mtime_ns, chunks[2].stat().st_mtime_ns] == [stamps[0], stamps[2]]
    assert again["kept"] == info["kept"]
    # each prompt's seed is its own: other chunks and batches sample the same texts
    other = tmp_path / "other"
    write_self_prompts(str(chatty_target_dir), other, SelfPromptSettings(count=7, max_tokens=6, min_words=1, chunk=5),
                       batch_size=2, device="cpu", progress=False)
    texts = lambda rs: [r["messages"][0]["content"] for r in rs]  # noqa: E731
    assert texts(read_rows(other / PROMPTS_FILE)) == texts(rows)
    # another seed into the same folder is refused, naming what is there
    with pytest.raises(DataError, match="other settings"):
        write_self_prompts(str(chatty_target_dir), out, SelfPromptSettings(count=7, max_tokens=6, min_words=1,
                                                                           chunk=3, seed=1), device="cpu",
                           progress=False)


def test_the_target_answers_its_own_prompts(tmp_path, chatty_target_dir, ends_often):
    from specheads.data.prepare import REGENERATED_FILE, PrepareOptions, prepare

    out = tmp_path / "sp"
    write_self_prompts(str(chatty_target_dir), out, SelfPromptSettings(count=6, max_tokens=6, min_words=1),
                       device="cpu", progress=False)
    prompts = {r["id"]: r["messages"][0] for r in read_rows(out / PROMPTS_FILE)}
    prep = tmp_path / "prepared"
    prepare(PrepareOptions(target=str(chatty_target_dir), data=str(out / PROMPTS_FILE), output=str(prep),
                           max_length=128, regenerate=True, regen_max_new_tokens=4, draft_vocab_size=DRAFT_VOCAB,
                           devices="cpu"))
    answered = read_rows(prep / REGENERATED_FILE)
    assert answered
    for conv in answered:
        user, answer = conv["messages"]
        assert user == prompts[conv["id"]] and answer["role"] == "assistant"


@pytest.mark.parametrize("args, says", [
    (["--count", "0"], "count 0 must be at least 1"),
    (["--temperature", "0"], "temperature 0.0 must be above 0"),
    (["--top-p", "1.5"], "top_p 1.5 must lie in"),
])
def test_bad_settings_are_named(tmp_path, capsys, args, says):
    from specheads.cli import main

    assert main(["self-prompts", "--out", str(tmp_path / "o"), *args]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
