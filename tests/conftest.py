"""Shared fixtures: a tiny ChatML tokenizer, a tiny random Llama target saved as an HF
checkpoint, conversation files in every supported format, and prepared datasets.

Everything is built offline inside the test session; caches go to temporary folders.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

# before anything imports transformers / datasets: no network, and no writes to ~/.cache
_SESSION_TMP = tempfile.mkdtemp(prefix="specheads-tests-")
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_CACHE"] = os.path.join(_SESSION_TMP, "hf-datasets")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TQDM_DISABLE", "1")
ORIGINAL_SPECHEADS_CACHE = os.environ.get("SPECHEADS_CACHE")
os.environ["SPECHEADS_CACHE"] = os.path.join(_SESSION_TMP, "specheads-cache")

import pytest  # noqa: E402

from tests.helpers import (  # noqa: E402
    DRAFT_VOCAB,
    build_tokenizer,
    make_sharegpt_rows,
    messages_rows,
    random_sentence,
    save_random_target,
    tiny_llama_config,
)


# The slowest test files, slowest first (seconds on a 2-core machine, 2026-11-29). Under
# `-n 2 --dist loadfile` (.ci/run) a worker takes the next file as it runs out of tests, in
# collection order: starting with the long ones keeps the two workers' ends close together.
SLOW_FILES_FIRST = (
    "tests/training/test_deepspeed.py",  # ~145
    "tests/runtime/test_head_kinds_runtime.py",  # ~115
    "tests/server/test_fuzz.py",  # ~80
    "tests/kernels/test_causal_attention.py",  # ~60
    "tests/runtime/test_engine.py",  # ~55
    "tests/kernels/test_compile_sm90.py",  # ~45
    "tests/kernels/test_bounds.py",  # ~40
    "tests/runtime/test_tiers_compile_sm90.py",  # ~40
    "tests/runtime/test_tiers.py",  # ~40
    "tests/target/test_model.py",  # ~35
    "tests/test_kinds_pipeline.py",  # ~35, one test
    "tests/evaluation/test_estimate.py",  # ~30
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::")[0], len(rank)), order[id(item)]))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """SPECHEADS_CACHE (GGUF conversions) points at a session temp folder for every test."""
    folder = tmp_path_factory.mktemp("specheads-cache")
    os.environ["SPECHEADS_CACHE"] = str(folder)
    yield folder


@pytest.fixture
def default_cache(monkeypatch):
    """For the tests on the real embedded target: the user's own SPECHEADS_CACHE (or its default)."""
    if ORIGINAL_SPECHEADS_CACHE is None:
        monkeypatch.delenv("SPECHEADS_CACHE", raising=False)
    else:
        monkeypatch.setenv("SPECHEADS_CACHE", ORIGINAL_SPECHEADS_CACHE)


# ------------------------------------------------------------------ tokenizer and target
@pytest.fixture
def tune():
    """tune(**fields): the active kernel tuning (specheads/kernels/tuning.py) with these fields
    changed, by name, until the test ends; calls stack."""
    import contextlib

    from specheads.kernels import tuning

    with contextlib.ExitStack() as stack:
        yield lambda **fields: stack.enter_context(tuning.using(tuning.active().replace(**fields)))


@pytest.fixture(scope="session")
def tokenizer():
    tok = build_tokenizer()
    enc = tok("hello world", return_offsets_mapping=True, add_special_tokens=False)
    assert enc["offset_mapping"], "the test tokenizer must support return_offsets_mapping"
    return tok


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    cfg = tiny_llama_config(len(tokenizer))
    assert cfg.vocab_size == len(tokenizer)
    # confident next-token distributions: the draft head can learn them in a few steps
    save_random_target(folder, cfg, tokenizer, seed=0, randomize=True, embed_std=1.0)
    return folder


@pytest.fixture(scope="session")
def chatty_target_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny target whose greedy answers are text. The tied target's above echo the prompt's last
    token, the newline after "assistant", so every answer is whitespace, which regeneration drops
    (a conversation needs an answer that says something): this one has its own LM head."""
    folder = tmp_path_factory.mktemp("tiny-llama-chatty")
    save_random_target(folder, tiny_llama_config(len(tokenizer), tie_word_embeddings=False), tokenizer, seed=0,
                       randomize=True, embed_std=1.0)
    return folder


@pytest.fixture(scope="session")
def chatty_target(chatty_target_dir):
    """(TargetModel, tokenizer) of the chatty tiny target, float32 on CPU."""
    from specheads.target.loader import load_target

    model, tok, _ = load_target(chatty_target_dir)
    return model, tok


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    """(TargetModel, tokenizer) of the tiny target, float32 on CPU."""
    from specheads.target.loader import load_target

    model, tok, _ = load_target(tiny_target_dir)
    return model, tok


# ------------------------------------------------------------------ conversation files
@pytest.fixture(scope="session")
def sharegpt_rows():
    return make_sharegpt_rows()


@pytest.fixture(scope="session")
def sharegpt_json(tmp_path_factory, sharegpt_rows) -> Path:
    rows, _ = sharegpt_rows
    path = tmp_path_factory.mktemp("data") / "sharegpt.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


@pytest.fixture(scope="session")
def truncated_sharegpt_json(tmp_path_factory, sharegpt_rows) -> tuple[Path, int]:
    """The ShareGPT file cut in the middle of an object: (path, complete objects before the cut)."""
    rows, _ = sharegpt_rows
    keep = 20
    head = json.dumps(rows[:keep], indent=1)
    assert head.endswith("\n]")
    partial = json.dumps(rows[keep], indent=1)
    text = head[:-2] + ",\n" + partial[: len(partial) // 2]
    path = tmp_path_factory.mktemp("data-trunc") / "truncated.json"
    path.write_text(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    return path, keep


@pytest.fixture
def jsonl_file(tmp_path) -> tuple[Path, list[dict]]:
    rows = messages_rows(6, seed=1)
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


@pytest.fixture
def parquet_file(tmp_path) -> tuple[Path, list[dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = messages_rows(5, seed=2)
    path = tmp_path / "conv.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rows


# ------------------------------------------------------------------ prepared data
@pytest.fixture(scope="session")
def prepared(tmp_path_factory, tiny_target_dir, sharegpt_json) -> tuple[Path, dict]:
    """(folder, report) of the ShareGPT fixture prepared for the tiny target."""
    from specheads.data.prepare import PrepareOptions, prepare

    out = tmp_path_factory.mktemp("prepared") / "tiny"
    report = prepare(
        PrepareOptions(
            target=str(tiny_target_dir), data=str(sharegpt_json), output=str(out), max_length=128,
            draft_vocab_size=DRAFT_VOCAB, eval_fraction=0.1,
        )
    )
    return out, report


@pytest.fixture(scope="session")
def prepared_dir(prepared) -> Path:
    return prepared[0]


@pytest.fixture(scope="session")
def small_prepared_dir(tmp_path_factory, tiny_target_dir) -> Path:
    """Four short conversations: three (or so) train, at least one eval (for overfitting runs)."""
    from specheads.data.prepare import PrepareOptions, prepare

    rng = random.Random(7)
    rows = [
        {"id": f"s{i}", "conversations": [{"from": "human", "value": random_sentence(rng, 3, 5)},
                                          {"from": "gpt", "value": random_sentence(rng, 8, 12)}]}
        for i in range(4)
    ]
    folder = tmp_path_factory.mktemp("small")
    src = folder / "small.json"
    src.write_text(json.dumps(rows))
    out = folder / "prepared"
    # eval_fraction 0 would leave an empty eval split (see test_prepare.py::test_no_eval_split_loads)
    report = prepare(PrepareOptions(target=str(tiny_target_dir), data=str(src), output=str(out), max_length=64,
                                    draft_vocab_size=DRAFT_VOCAB, eval_fraction=0.01))
    assert report["conversations"]["eval"] >= 1 and report["conversations"]["train"] >= 2
    return out
