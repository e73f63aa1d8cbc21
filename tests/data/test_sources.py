"""Conversation readers: ShareGPT JSON (also cut off mid-object), JSONL, parquet; skip accounting."""

from __future__ import annotations

import json

import pytest

from specheads.data.sources import (
    DataError,
    SkipLog,
    check_data_source,
    iter_json_objects,
    normalize_messages,
    read_conversations,
)


def test_iter_json_objects_equals_json_load(sharegpt_json):
    assert list(iter_json_objects(sharegpt_json)) == json.loads(sharegpt_json.read_text())


def test_iter_json_objects_recovers_from_truncated_file(truncated_sharegpt_json, sharegpt_rows):
    path, keep = truncated_sharegpt_json
    rows, _ = sharegpt_rows
    assert list(iter_json_objects(path)) == rows[:keep]


def test_iter_json_objects_odd_whitespace_and_empty(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('\n  [ {"a": 1} ,\n\t{"b": [1, 2]}  ,{"c": "x]"}\n]\n')
    assert list(iter_json_objects(p)) == [{"a": 1}, {"b": [1, 2]}, {"c": "x]"}]
    p.write_text("[]")
    assert list(iter_json_objects(p)) == []
    p.write_text("")
    assert list(iter_json_objects(p)) == []


def test_read_sharegpt_keeps_good_rows_and_counts_skips(sharegpt_json, sharegpt_rows):
    rows, expected_skips = sharegpt_rows
    skips = SkipLog()
    convs = list(read_conversations(str(sharegpt_json), skips))
    good_ids = [r["id"] for r in rows if r["id"].startswith("good-")]
    assert [c.id for c in convs] == good_ids
    assert dict(skips.counts) == expected_skips
    assert skips.total == sum(expected_skips.values()) == 6
    assert skips.examples["unknown role 'narrator'"] == "bad-role"
    assert skips.examples["empty conversation"] == "bad-empty"  # the first one seen
    assert skips.examples["no assistant turn"] == "bad-noassistant"
    d = skips.as_dict()
    assert d["no assistant turn"] == {"count": 2, "example": "bad-noassistant"}
    assert list(d)[0] in ("no assistant turn", "empty conversation")  # most common first


def test_role_mapping_and_leading_assistant_stripped(sharegpt_json, sharegpt_rows):
    rows, _ = sharegpt_rows
    by_id = {c.id: c for c in read_conversations(str(sharegpt_json), SkipLog())}
    alias = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}
    for row in rows:
        if row["id"] not in by_id:
            continue
        turns = row["conversations"]
        if turns[0]["from"] == "gpt":
            turns = turns[1:]
        got = by_id[row["id"]].messages
        assert got == [{"role": alias[t["from"]], "content": t["value"]} for t in turns]
    # both branches were exercised by the fixture
    assert by_id["good-0"].messages[0]["role"] == "system"
    raw3 = next(r for r in rows if r["id"] == "good-3")["conversations"]
    assert raw3[0]["from"] == "gpt" and by_id["good-3"].messages[0]["role"] == "user"
    assert len(by_id["good-3"].messages) == len(raw3) - 1


def test_truncated_file_reads_without_error(truncated_sharegpt_json, sharegpt_rows):
    path, keep = truncated_sharegpt_json
    rows, _ = sharegpt_rows
    skips = SkipLog()
    convs = list(read_conversations(str(path), skips))
    assert [c.id for c in convs] == [r["id"] for r in rows[:keep] if r["id"].startswith("good-")]
    assert skips.total == sum(1 for r in rows[:keep] if r["id"].startswith("bad-"))


def test_limit(sharegpt_json):
    convs = list(read_conversations(str(sharegpt_json), SkipLog(), limit=5))
    assert [c.id for c in convs] == [f"good-{i}" for i in range(5)]


def test_jsonl_with_messages(jsonl_file):
    path, rows = jsonl_file
    convs = list(read_conversations(str(path), SkipLog()))
    assert [c.id for c in convs] == [r["id"] for r in rows]
    assert [c.messages for c in convs] == [r["messages"] for r in rows]


def test_parquet_with_messages(parquet_file):
    path, rows = parquet_file
    skips = SkipLog()
    convs = list(read_conversations(str(path), skips))
    assert skips.total == 0
    assert [c.id for c in convs] == [r["id"] for r in rows]
    assert [c.messages for c in convs] == [r["messages"] for r in rows]


def test_rows_without_ids_use_their_index(tmp_path):
    p = tmp_path / "noid.jsonl"
    p.write_text(
        json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]}) + "\n"
    )
    skips = SkipLog()
    convs = list(read_conversations(str(p), skips))
    assert [c.id for c in convs] == ["1"]
    assert skips.examples == {"no assistant turn": "0"}


@pytest.mark.parametrize("name", ["missing.json", "missing.jsonl", "missing.parquet"])
def test_missing_file_names_the_path(tmp_path, name):
    path = str(tmp_path / name)
    with pytest.raises(FileNotFoundError, match=name):
        check_data_source(path)
    with pytest.raises(FileNotFoundError, match=name):
        list(read_conversations(path, SkipLog()))


def test_relative_missing_json_is_caught_up_front(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="conv.json"):
        check_data_source("conv.json")


def test_unknown_suffix_is_a_data_error(tmp_path):
    p = tmp_path / "conv.csv"
    p.write_text("a,b\n")
    with pytest.raises(DataError, match=r"\.csv"):
        list(read_conversations(str(p), SkipLog()))


@pytest.mark.parametrize(
    "row, message",
    [
        ({"conversations": "hi"}, "not a list"),
        ({"conversations": ["hi"]}, "not an object"),
        ({"conversations": [{"from": "human"}]}, "lacks role/from or content/value"),
        ({"conversations": [{"from": "human", "value": 3}]}, "not a string"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
        ({"id": 1}, "neither 'messages' nor 'conversations'"),
    ],
)
def test_normalize_messages_errors(row, message):
    with pytest.raises(DataError, match=message):
        normalize_messages(row)


def test_normalize_messages_prefers_messages_and_accepts_role_content():
    row = {
        "messages": [{"role": "System", "content": "s"}, {"role": "USER", "content": "u"},
                     {"role": "model", "content": "m"}],
        "conversations": [{"from": "human", "value": "ignored"}],
    }
    assert normalize_messages(row) == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "m"}
    ]
    assert normalize_messages({"conversations": [{"role": "bard", "content": "x"}]}) == [
        {"role": "assistant", "content": "x"}
    ]


def test_skiplog_counts():
    log = SkipLog()
    for reason, rid in [("a", "1"), ("b", "2"), ("a", "3"), ("a", "4")]:
        log.skip(reason, rid)
    assert log.total == 4
    assert log.as_dict() == {"a": {"count": 3, "example": "1"}, "b": {"count": 1, "example": "2"}}
    assert list(log.as_dict()) == ["a", "b"]
