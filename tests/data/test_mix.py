"""Data mixes (data.sources): sources checked and their ratios normalised, conversations drawn by
ratio at a fixed seed, the realised mix in prepare's report, and the chitchat source's reader."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from specheads.config import ConfigError, load_config
from specheads.data import mix as mix_module
from specheads.data.mix import mix_conversations, parse_sources, shares
from specheads.data.prepare import REPORT_FILE, PrepareOptions, prepare
from specheads.data.sources import DataError, SkipLog, chitchat_rows, read_conversations
from tests.helpers import DRAFT_VOCAB, messages_rows


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def two_sources(tmp_path):
    """A source of 40 conversations and one of 12 (ids overlap on purpose: m-1-0.. in both)."""
    big = _jsonl(tmp_path / "big.jsonl", messages_rows(40, seed=1))
    small = _jsonl(tmp_path / "small.jsonl", [
        {**r, "messages": [{"role": "user", "content": "q " + r["messages"][0]["content"]}, r["messages"][1]]}
        for r in messages_rows(12, seed=1)])
    return big, small


def test_ratios_are_normalised_and_labels_unique(two_sources):
    big, small = two_sources
    specs = parse_sources([{"name": "jsonl", "path": big, "ratio": 3}, {"name": "jsonl", "path": small, "ratio": 1},
                           {"name": "sharegpt", "ratio": 4}])
    assert [s.ratio for s in specs] == [0.375, 0.125, 0.5]
    assert [s.label for s in specs] == ["jsonl#0", "jsonl#1", "sharegpt"]
    assert [s.data for s in specs] == [big, small, "sharegpt"]


@pytest.mark.parametrize("raw, message", [
    ([], "data.sources is empty"),
    ([{"name": "nosuch"}], r"data.sources\[0\]: unknown source 'nosuch'; known: sharegpt, chitchat, code-prompts, jsonl"),
    ([{"name": "sharegpt"}, {"name": "sharegpt", "ratio": 0}], r"data.sources\[1\]: ratio must be a positive"),
    ([{"name": "jsonl"}], "a jsonl source needs a path"),
    ([{"name": "chitchat", "path": "x.jsonl"}], "takes no path"),
    ([{"name": "sharegpt", "weight": 2}], r"unknown keys \['weight'\]"),
])
def test_bad_sources_are_refused(raw, message):
    with pytest.raises(DataError, match=message):
        parse_sources(raw)


def test_shares_follow_the_ratios_and_sum_to_the_total():
    assert shares(10, [0.5, 0.25, 0.25]) == [5, 3, 2]  # a tie goes to the earlier source
    assert sum(shares(7, [1 / 3] * 3)) == 7
    assert shares(100, [0.9, 0.1]) == [90, 10]


def test_a_mix_draws_by_ratio_at_a_fixed_seed(two_sources):
    big, small = two_sources
    specs = parse_sources([{"name": "jsonl", "path": big, "ratio": 3}, {"name": "jsonl", "path": small, "ratio": 1}])
    convs, report = mix_conversations(specs, SkipLog(), limit=16, seed=0)
    by = Counter(c.id.split(":", 1)[0] for c in convs)
    assert by == {"jsonl#0": 12, "jsonl#1": 4}
    assert len({c.id for c in convs}) == 16  # the same row id in two sources stays two conversations
    assert [r["drawn"] for r in report["sources"]] == [12, 4] and report["seed"] == 0
    again, _ = mix_conversations(specs, SkipLog(), limit=16, seed=0)
    assert [c.id for c in again] == [c.id for c in convs]
    other, _ = mix_conversations(specs, SkipLog(), limit=16, seed=1)
    assert [c.id for c in other] != [c.id for c in convs]
    # without a limit: as many as the scarcer source allows at its ratio (12 small -> 48 in all, big has 40)
    convs, report = mix_conversations(specs, SkipLog(), limit=None)
    assert Counter(c.id.split(":", 1)[0] for c in convs) == {"jsonl#0": 36, "jsonl#1": 12}
    # a source short of its share gives what it has, and the report says by how much
    _, report = mix_conversations(specs, SkipLog(), limit=60)
    assert report["sources"][0] == {**report["sources"][0], "wanted": 45, "drawn": 40, "short_by": 5}


def test_prepare_records_the_realised_mix(tmp_path, tiny_target_dir, sharegpt_json, two_sources):
    from datasets import load_from_disk

    big, _ = two_sources
    out = tmp_path / "mixed"
    report = prepare(PrepareOptions(
        target=str(tiny_target_dir), sources=[{"name": "jsonl", "path": str(sharegpt_json), "ratio": 1},
                                              {"name": "jsonl", "path": big, "ratio": 1}],
        output=str(out), max_length=128, draft_vocab_size=DRAFT_VOCAB, eval_fraction=0.1, limit=40))
    assert json.loads((out / REPORT_FILE).read_text()) == report
    rows = report["mix"]["sources"]
    assert [r["drawn"] for r in rows] == [20, 20]
    ds = load_from_disk(str(out))
    ids = list(ds["train"]["id"]) + list(ds["eval"]["id"])
    assert Counter(i.split(":", 1)[0] for i in ids) == {r["label"]: sum(r["kept"].values()) for r in rows}
    assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-3)
    assert sum(r["train_loss_tokens"] for r in rows) == report["train_loss_tokens"]
    assert report["data"] == "jsonl#0+jsonl#1"


def test_a_mix_holds_out_what_its_sources_hold_out(tmp_path, tiny_target_dir, two_sources):
    """The eval split hashes a conversation's id in its source, not the mix's labelled id: a
    conversation held out when its source is prepared alone is held out in the mix too (else a head
    trained on the mix would be judged on conversations it trained on), also after the mix is
    written out and read back as one file (a saved regeneration)."""
    from datasets import load_from_disk

    from specheads.data.prepare import write_conversations

    big, small = two_sources
    common = dict(target=str(tiny_target_dir), max_length=128, draft_vocab_size=DRAFT_VOCAB, eval_fraction=0.3)
    prepare(PrepareOptions(data=big, output=str(tmp_path / "alone"), **common))
    alone = load_from_disk(str(tmp_path / "alone"))
    held_out = set(alone["eval"]["id"])
    assert held_out and set(alone["train"]["id"])
    prepare(PrepareOptions(sources=[{"name": "jsonl", "path": big, "ratio": 40}, {"name": "jsonl", "path": small, "ratio": 12}],
                           output=str(tmp_path / "mixed"), limit=52, **common))
    mixed = load_from_disk(str(tmp_path / "mixed"))
    assert {i.split(":", 1)[1] for i in mixed["eval"]["id"] if i.startswith("jsonl#0:")} == held_out
    assert not {i.split(":", 1)[1] for i in mixed["train"]["id"] if i.startswith("jsonl#0:")} & held_out

    convs, _ = mix_conversations(parse_sources([{"name": "jsonl", "path": big, "ratio": 40},
                                                {"name": "jsonl", "path": small, "ratio": 12}]), SkipLog(), limit=52)
    write_conversations(tmp_path / "saved.jsonl.gz", convs)
    back = list(read_conversations(str(tmp_path / "saved.jsonl.gz"), SkipLog()))
    assert [(c.id, c.key) for c in back] == [(c.id, c.id.split(":", 1)[1]) for c in convs]
    prepare(PrepareOptions(data=str(tmp_path / "saved.jsonl.gz"), output=str(tmp_path / "again"), **common))
    assert set(load_from_disk(str(tmp_path / "again"))["eval"]["id"]) == set(mixed["eval"]["id"])


def test_a_regenerated_mix_with_the_code_prompts(tmp_path, chatty_target_dir, sharegpt_json):
    """The full recipe's kind of mix (configs/smollm2-135m-eagle3.yaml): chat conversations and the
    packaged code prompts by ratio, every answer written by the target; the saved regeneration keeps
    each conversation's split key, so prepared again from it the held-out split stays the same."""
    from datasets import load_from_disk

    common = dict(target=str(chatty_target_dir), max_length=512, draft_vocab_size=DRAFT_VOCAB, eval_fraction=0.3)
    out = tmp_path / "mixed"
    report = prepare(PrepareOptions(sources=[{"name": "jsonl", "path": str(sharegpt_json), "ratio": 0.5},
                                             {"name": "code-prompts", "ratio": 0.5}], limit=8, regenerate=True,
                                    regen_max_new_tokens=6, regen_batch_size=8, output=str(out), **common))
    drawn = {r["name"]: r["drawn"] for r in report["mix"]["sources"]}
    assert drawn == {"jsonl": 4, "code-prompts": 4}, report["mix"]
    ds = load_from_disk(str(out))
    ids = set(ds["train"]["id"]) | set(ds["eval"]["id"])
    assert any(i.startswith("code-prompts:") for i in ids) and any(i.startswith("jsonl") for i in ids), (ids, report.get("skipped"))
    prepare(PrepareOptions(data=str(out / "regenerated.jsonl.gz"), output=str(tmp_path / "again"), **common))
    again = load_from_disk(str(tmp_path / "again"))
    assert set(again["eval"]["id"]) == set(ds["eval"]["id"]) and set(again["train"]["id"]) == set(ds["train"]["id"])


def test_one_source_reads_as_data_does(tmp_path, tiny_target_dir, sharegpt_json):
    """The default (one source) keeps the plain reader: ids unprefixed, no mix in the report."""
    report = prepare(PrepareOptions(target=str(tiny_target_dir), sources=[{"name": "jsonl", "path": str(sharegpt_json)}],
                                    output=str(tmp_path / "one"), max_length=128, draft_vocab_size=DRAFT_VOCAB))
    assert "mix" not in report and report["data"] == str(sharegpt_json)


def test_run_config_data_sources():
    cfg = load_config(None, ["data.sources=[{name: sharegpt, ratio: 3}, {name: chitchat, ratio: 1}]"])
    assert [(s.name, s.ratio) for s in cfg.data.sources] == [("sharegpt", 3.0), ("chitchat", 1.0)]
    assert [(s.name, s.ratio) for s in load_config(None, []).data.sources] == [("sharegpt", 1.0)]  # the default
    with pytest.raises(ConfigError, match=r"data.sources.0.*unknown data source 'sharegtp'"):
        load_config(None, ["data.sources=[{name: sharegtp}]"])
    with pytest.raises(ConfigError, match=r"data.sources.0.ratio"):
        load_config(None, ["data.sources=[{name: sharegpt, ratio: -1}]"])


def test_prepare_cli_takes_the_mix_from_set(tmp_path, tiny_target_dir, two_sources, capsys):
    from specheads.cli import main

    big, small = two_sources
    out = tmp_path / "cli"
    rc = main(["prepare", "--target", str(tiny_target_dir), "--output", str(out), "--max-length", "128",
               "--draft-vocab-size", str(DRAFT_VOCAB), "--limit", "20",
               "--set", f"data.sources=[{{name: jsonl, path: {big}, ratio: 4}}, {{name: jsonl, path: {small}, ratio: 1}}]",
               "--set", "data.mix_seed=3"])
    assert rc == 0
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["mix"]["seed"] == 3 and [r["drawn"] for r in report["mix"]["sources"]] == [16, 4]
    assert "source jsonl#0" in capsys.readouterr().out


CHITCHAT = {
    "c1": {"messages": [[{"text": "Hello", "sender": "a"}, {"text": "How are you?", "sender": "a"}],
                        [{"text": "fine", "sender": "b"}], [{"text": "good to hear", "sender": "a"}]],
           "ratings": {}, "start": "", "prompt": "hi"},
    "c2": {"messages": [[{"text": "anyone there?", "sender": "a"}]], "ratings": {}},  # no reply
    "c3": {"messages": "broken"},
}


def test_chitchat_rows_alternate_user_and_assistant(tmp_path, monkeypatch):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(CHITCHAT))
    rows = list(chitchat_rows(path))
    assert rows[0] == {"id": "c1", "messages": [{"role": "user", "content": "Hello\nHow are you?"},
                                                {"role": "assistant", "content": "fine"},
                                                {"role": "user", "content": "good to hear"}]}
    monkeypatch.setattr("specheads.data.sources.embedded_chitchat", lambda: path)
    skips = SkipLog()
    convs = list(read_conversations("chitchat", skips))
    assert [c.id for c in convs] == ["c1"]
    assert skips.counts == {"no assistant turn": 1, "row has neither 'messages' nor 'conversations'": 1}
    assert set(mix_module.SOURCES) >= {"sharegpt", "chitchat", "code-prompts", "jsonl"}


@pytest.mark.skipif(importlib.util.find_spec("chitchat_dataset") is None, reason="chitchat-dataset is not installed")
def test_the_packaged_chitchat_source_reads():
    skips = SkipLog()
    convs = list(read_conversations("chitchat", skips, limit=50))
    assert len(convs) == 50
    assert all(c.messages[0]["role"] == "user" and any(m["role"] == "assistant" for m in c.messages) for c in convs)
