"""The `code-prompts` source: programming prompts built from the CPython standard library
(scripts/build_code_prompts.py), one user turn each, read only where the target answers them."""

from __future__ import annotations

import gzip
import json
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from specheads.config import load_config
from specheads.data.mix import SOURCES, mix_conversations, parse_sources
from specheads.data.prepare import REGENERATED_FILE, PrepareOptions, prepare
from specheads.data.sources import CODE_PROMPTS_FILE, CODE_PROMPTS_INFO, DataError, SkipLog, read_conversations
from specheads.evaluation.suite import ngrams, suite_ngrams
from tests.helpers import DRAFT_VOCAB, load_script

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "scripts" / "build_code_prompts.py"
PREFIXES = {"complete": "Complete the following Python ", "explain": "Explain what this Python ", "write": "Write a"}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with gzip.open(CODE_PROMPTS_FILE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def builder():
    return load_script(str(BUILDER.relative_to(ROOT)))


@pytest.fixture()
def small_sharegpt(monkeypatch, sharegpt_json):
    """`sharegpt` reads the small test file instead of the embedded one."""
    monkeypatch.setattr("specheads.data.sources.embedded_sharegpt", lambda: sharegpt_json)


def test_the_file_holds_one_user_turn_per_stdlib_function(rows):
    info = json.loads(CODE_PROMPTS_INFO.read_text())
    assert len(rows) == info["rows"] > 2800  # 3,115 from Python 3.11.7
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["messages"][0]["content"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) == {"id", "messages"} and r["id"].startswith("stdlib:")
        assert len(r["messages"]) == 1 and r["messages"][0]["role"] == "user"
        assert 0 < len(r["messages"][0]["content"]) <= 3000
    kinds = Counter(next(k for k, p in PREFIXES.items() if r["messages"][0]["content"].startswith(p)) for r in rows)
    assert kinds == info["kept_by_template"]
    assert 0.42 < kinds["complete"] / len(rows) < 0.58 and min(kinds["explain"], kinds["write"]) / len(rows) > 0.18
    assert info["license"] == "PSF-2.0" and info["python"].count(".") == 2
    assert (CODE_PROMPTS_FILE.parent / info["license_file"]).is_file()
    assert "logging" in info["modules_under_their_own_licence_left_out"]
    assert not any(r["id"].startswith(("stdlib:logging.", "stdlib:tarfile.")) for r in rows)


def test_no_prompt_shares_a_word_8gram_with_the_suite(rows):
    suite = suite_ngrams()
    assert len(suite) > 10_000
    shared = [r["id"] for r in rows if not ngrams(r["messages"][0]["content"]).isdisjoint(suite)]
    assert shared == []


def test_the_package_ships_the_file_and_its_licence():
    text = (ROOT / "pyproject.toml").read_text()
    for name in (CODE_PROMPTS_FILE.name, CODE_PROMPTS_INFO.name, "LICENSE-code-prompts.txt"):
        assert f'"{name}"' in text
    licence = (CODE_PROMPTS_FILE.parent / "LICENSE-code-prompts.txt").read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in licence and "Python Software Foundation" in licence


def test_code_prompts_is_a_packaged_source():
    assert SOURCES["code-prompts"][1] == "PSF-2.0"
    (spec,) = parse_sources([{"name": "code-prompts", "ratio": 2}])
    assert (spec.name, spec.data, spec.ratio) == ("code-prompts", "code-prompts", 1.0)
    with pytest.raises(DataError, match="takes no path"):
        parse_sources([{"name": "code-prompts", "path": "x.jsonl"}])
    cfg = load_config(None, ["data.sources=[{name: sharegpt, ratio: 3}, {name: code-prompts, ratio: 1}]"])
    assert [(s.name, s.ratio) for s in cfg.data.sources] == [("sharegpt", 3.0), ("code-prompts", 1.0)]


def test_prompts_alone_are_read_for_the_target_to_answer_and_refused_otherwise(rows):
    skips = SkipLog()
    convs = list(read_conversations("code-prompts", skips, answered=False))
    assert [c.id for c in convs] == [r["id"] for r in rows] and skips.total == 0
    with pytest.raises(DataError, match=r"data 'code-prompts': none of its rows has an assistant answer.*--regenerate"):
        list(read_conversations("code-prompts", SkipLog()))


def test_a_mix_with_sharegpt_draws_by_ratio(small_sharegpt, rows):
    specs = parse_sources([{"name": "sharegpt", "ratio": 3}, {"name": "code-prompts", "ratio": 1}])
    convs, report = mix_conversations(specs, SkipLog(), limit=40, seed=0, answered=False)
    assert Counter(c.id.split(":", 1)[0] for c in convs) == {"sharegpt": 30, "code-prompts": 10}
    code = [c for c in convs if c.id.startswith("code-prompts:stdlib:")]
    assert len(code) == 10 and all(len(c.messages) == 1 and c.messages[0]["role"] == "user" for c in code)
    again, _ = mix_conversations(specs, SkipLog(), limit=40, seed=0, answered=False)
    assert [c.id for c in again] == [c.id for c in convs]
    # without a limit: as many as the test file of ShareGPT allows at 3/4 (rows with a user turn:
    # the 34 good ones, and two whose answer is missing or blank, which the target answers)
    _, report = mix_conversations(specs, SkipLog(), limit=None, answered=False)
    assert [(r["available"], r["drawn"]) for r in report["sources"]] == [(36, 36), (len(rows), 12)]


def test_prepare_without_regenerate_names_the_source_and_the_flag(tmp_path, tiny_target_dir, small_sharegpt):
    for options in ({"data": "code-prompts"},
                    {"sources": [{"name": "sharegpt", "ratio": 1}, {"name": "code-prompts", "ratio": 1}]}):
        out = tmp_path / "out"
        with pytest.raises(DataError, match=r"'code-prompts'.*--regenerate"):
            prepare(PrepareOptions(target=str(tiny_target_dir), output=str(out), max_length=64,
                                   draft_vocab_size=DRAFT_VOCAB, **options))
        assert not out.exists()


def test_prepare_with_regenerate_answers_the_prompts(tmp_path, chatty_target_dir, rows):
    out = tmp_path / "o"
    rep = prepare(PrepareOptions(target=str(chatty_target_dir), data="code-prompts", output=str(out), max_length=512,
                                 limit=3, regenerate=True, regen_max_new_tokens=4, draft_vocab_size=DRAFT_VOCAB,
                                 devices="cpu"))
    with gzip.open(out / REGENERATED_FILE, "rt") as f:
        answered = [json.loads(line) for line in f]
    assert answered and rep["conversations"]["train"] + rep["conversations"]["eval"] == len(answered)
    prompts = {r["id"]: r["messages"][0] for r in rows[:3]}
    for conv in answered:
        user, answer = conv["messages"]
        assert user == prompts[conv["id"]] and answer["role"] == "assistant"


def test_write_requests_read_as_sentences(builder):
    assert builder.write_request("Return the sum of x.") == "that returns the sum of x."
    assert builder.write_request("Returns True if the queue is empty") == "that returns True if the queue is empty."
    assert builder.write_request("Flush the stream:") == "that flushes the stream."
    assert builder.write_request("Try to connect.") == "that tries to connect."
    assert builder.write_request("SMTP 'verify' command.") == "matching this description: SMTP 'verify' command."
    assert builder.first_paragraph("f(x) -> int\n\nCompute f.\nOn two lines.\n\nMore.", "f") == "Compute f. On two lines."


@pytest.mark.skipif(json.loads(CODE_PROMPTS_INFO.read_text())["python"] != platform.python_version(),
                    reason="the file was built from another Python's standard library (code_prompts.json names it)")
def test_the_builder_rebuilds_the_shipped_file():
    done = subprocess.run([sys.executable, str(BUILDER), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches the standard library" in done.stdout


def test_check_on_another_python_says_which_one_built_the_file(tmp_path, monkeypatch, builder, capsys):
    monkeypatch.setattr(builder.platform, "python_version", lambda: "3.0.0")
    monkeypatch.setattr(sys, "argv", ["build_code_prompts.py", "--check"])
    with pytest.raises(SystemExit) as e:
        builder.main()
    assert e.value.code == 2
    built_by = json.loads(CODE_PROMPTS_INFO.read_text())["python"]
    assert f"built with Python {built_by}" in capsys.readouterr().out
