"""prepare(): conversations -> tokenized DatasetDict + vocab map + report."""

from __future__ import annotations

import json

from dataclasses import replace

import pytest
import torch

from specheads.data.chat import tokenize_conversation
from specheads.data.prepare import REGENERATED_FILE, REPORT_FILE, PrepareOptions, is_eval, prepare
from specheads.data.sources import DataError, SkipLog, read_conversations
from tests.helpers import DRAFT_VOCAB


def test_prepared_folder_contents(prepared, sharegpt_rows, tokenizer):
    from datasets import load_from_disk

    folder, report = prepared
    _, expected_skips = sharegpt_rows
    assert (folder / "vocab_map.safetensors").is_file()
    assert json.loads((folder / REPORT_FILE).read_text()) == report
    assert report["vocab_size"] == len(tokenizer)
    assert report["draft_vocab_size"] == DRAFT_VOCAB
    assert report["skipped_total"] == 6
    assert {k: v["count"] for k, v in report["skipped"].items()} == expected_skips
    ds = load_from_disk(str(folder))
    assert set(ds) == {"train", "eval"}
    n_train, n_eval = len(ds["train"]), len(ds["eval"])
    assert report["conversations"] == {"train": n_train, "eval": n_eval}
    assert n_train + n_eval == 34 and n_eval >= 1
    assert report["train_tokens"] == sum(len(x) for x in ds["train"]["input_ids"])
    assert report["train_loss_tokens"] == sum(sum(x) for x in ds["train"]["loss_mask"])
    # where the time went: every part timed, together the whole
    parts = report["phase_seconds"]
    assert set(parts) == {"target_and_read", "tokenize", "save", "vocab_and_report"}
    assert sum(parts.values()) == pytest.approx(report["seconds"], abs=0.5)
    for split in ("train", "eval"):
        for ids, mask in zip(ds[split]["input_ids"], ds[split]["loss_mask"]):
            assert len(ids) == len(mask) <= 128
            assert sum(mask) > 0
            assert set(mask) <= {0, 1}


def test_prepared_rows_equal_tokenize_conversation(prepared, sharegpt_json, tokenizer):
    from datasets import load_from_disk

    folder, _ = prepared
    convs = {c.id: c for c in read_conversations(str(sharegpt_json), SkipLog())}
    ds = load_from_disk(str(folder))
    for split in ("train", "eval"):
        for row in ds[split]:
            ids, mask, _ = tokenize_conversation(tokenizer, convs[row["id"]].messages, 128)
            assert row["input_ids"] == ids and row["loss_mask"] == mask


def test_eval_split_is_fixed_by_id(prepared):
    from datasets import load_from_disk

    folder, _ = prepared
    ds = load_from_disk(str(folder))
    assert all(is_eval(i, 0.1) for i in ds["eval"]["id"])
    assert not any(is_eval(i, 0.1) for i in ds["train"]["id"])
    assert not is_eval("anything", 0.0)


def test_limit_does_not_move_the_eval_split(tmp_path, tiny_target_dir, sharegpt_json):
    from datasets import load_from_disk

    rep = prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                                 max_length=128, limit=10, eval_fraction=0.3, draft_vocab_size=DRAFT_VOCAB))
    ds = load_from_disk(str(tmp_path / "o"))
    assert rep["conversations"]["train"] + rep["conversations"]["eval"] == 10
    assert all(is_eval(i, 0.3) for i in ds["eval"]["id"])


def test_truncation_at_max_length(tmp_path, tiny_target_dir, sharegpt_json):
    from datasets import load_from_disk

    rep = prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                                 max_length=32, draft_vocab_size=DRAFT_VOCAB))
    assert rep["truncated"] > 0
    ds = load_from_disk(str(tmp_path / "o"))
    assert max(len(x) for x in ds["train"]["input_ids"]) == 32
    # rows whose assistant turn starts after the cut are skipped and counted
    cut = [k for k in rep["skipped"] if "no assistant tokens within max_length 32" in k]
    n_rows = rep["conversations"]["train"] + rep["conversations"]["eval"]
    assert n_rows + sum(rep["skipped"][k]["count"] for k in cut) == 34


def test_no_assistant_turns_fails_before_writing(tmp_path, tiny_target_dir):
    src = tmp_path / "users.json"
    src.write_text(json.dumps([
        {"id": str(i), "conversations": [{"from": "human", "value": "hello"}]} for i in range(5)
    ]))
    out = tmp_path / "out"
    with pytest.raises(DataError, match="no usable conversations") as e:
        prepare(PrepareOptions(target=str(tiny_target_dir), data=str(src), output=str(out), max_length=64,
                               draft_vocab_size=DRAFT_VOCAB))
    assert "no assistant turn" in str(e.value) and str(src) in str(e.value) and "--regenerate" in str(e.value)
    assert not out.exists()


def test_bad_options(tmp_path, tiny_target_dir, sharegpt_json):
    with pytest.raises(ValueError, match="max_length"):
        prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                               max_length=8))
    with pytest.raises(ValueError, match="eval_fraction"):
        prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                               eval_fraction=1.0))
    with pytest.raises(FileNotFoundError, match="absent.json"):
        prepare(PrepareOptions(target=str(tiny_target_dir), data=str(tmp_path / "absent.json"),
                               output=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


def test_draft_vocab_capped_at_the_target_vocab(tmp_path, tiny_target_dir, sharegpt_json, tokenizer):
    rep = prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                                 max_length=64, draft_vocab_size=10**6))
    assert rep["draft_vocab_size"] == len(tokenizer)
    assert rep["draft_vocab_coverage"] == 1.0


def test_regenerate_turns_are_the_targets_greedy_answers(chatty_target):
    """Self-distillation: each assistant turn is the target's greedy continuation of the
    conversation so far (including its own earlier answers)."""
    from specheads.data.chat import render
    from specheads.data.regenerate import regenerate, stop_token_ids
    from specheads.data.sources import Conversation
    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams

    model, tok = chatty_target
    convs = [
        Conversation("a", [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello world"},
                           {"role": "assistant", "content": "old"}, {"role": "user", "content": "Why?"},
                           {"role": "assistant", "content": "old"}]),
        Conversation("b", [{"role": "user", "content": "Tell me about the cat"},
                           {"role": "assistant", "content": "old"}]),
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    out = regenerate(model, tok, convs, params, max_length=128, batch_size=1)
    assert [c.id for c in out] == ["a", "b"]
    a = out[0].messages
    assert [m["role"] for m in a] == ["system", "user", "assistant", "user", "assistant"]
    assert all(m["content"] != "old" for m in a if m["role"] == "assistant")
    stops = stop_token_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in stops
    for i in (2, 4):  # each answer continues the regenerated history before it
        prompt = tok(render(tok, a[:i], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        expected = decode(model, [prompt], SamplingParams(max_new_tokens=6), stops)[0]
        assert a[i]["content"] == tok.decode(expected)


def test_regeneration_resumes_after_a_kill(tmp_path, chatty_target):
    """A regeneration killed mid-round continues from its saved chunks: the finished answers
    are not generated again, and the result equals an uninterrupted run's."""
    from specheads.data.regenerate import regenerate
    from specheads.data.sources import Conversation
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    model, tok = chatty_target
    convs = [Conversation(f"c{i}", [{"role": "user", "content": f"Question number {i}?"},
                                    {"role": "assistant", "content": "old"},
                                    {"role": "user", "content": "And then?"}]) for i in range(3)]
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_new_tokens=5)
    reference = regenerate(model, tok, convs, params, max_length=128, batch_size=2, chunk=2)
    assert [c.id for c in reference] == ["c0", "c1", "c2"]

    real, calls = SpecEngine.generate, []

    def killed_on_third_call(self, prompts, *a, **k):
        calls.append(len(prompts))
        if len(calls) == 3:  # round 0 (chunks of 2 + 1) is saved; round 1 dies
            raise KeyboardInterrupt
        return real(self, prompts, *a, **k)

    state = tmp_path / "regen.json"
    SpecEngine.generate = killed_on_third_call
    try:
        with pytest.raises(KeyboardInterrupt):
            regenerate(model, tok, convs, params, max_length=128, batch_size=2, chunk=2, state_path=state)
        saved = json.loads(state.read_text())
        assert saved["round"] == 1 and [c["answered"] for c in saved["convs"]] == [1, 1, 1]
        calls.clear()
        SpecEngine.generate = lambda self, prompts, *a, **k: (calls.append(len(prompts)), real(self, prompts, *a, **k))[1]
        resumed = regenerate(model, tok, convs, params, max_length=128, batch_size=2, chunk=2, state_path=state)
    finally:
        SpecEngine.generate = real
    assert calls == [2, 1]  # round 1 only
    assert [c.messages for c in resumed] == [c.messages for c in reference]
    # other options: the saved work is not reused
    calls.clear()
    SpecEngine.generate = lambda self, prompts, *a, **k: (calls.append(len(prompts)), real(self, prompts, *a, **k))[1]
    try:
        regenerate(model, tok, convs, replace(params, seed=8), max_length=128, batch_size=2, chunk=2,
                   state_path=state)
    finally:
        SpecEngine.generate = real
    assert calls == [2, 1, 2, 1]


def test_prepare_with_regeneration(tmp_path, chatty_target_dir, sharegpt_json, tokenizer):
    rep = prepare(PrepareOptions(target=str(chatty_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                                 max_length=96, limit=4, regenerate=True, regen_max_new_tokens=5,
                                 draft_vocab_size=DRAFT_VOCAB, devices="cpu"))
    assert rep["regenerated"] is True
    assert rep["regeneration"]["max_new_tokens"] == 5
    assert rep["conversations"]["train"] + rep["conversations"]["eval"] >= 1
    assert not (tmp_path / "o" / "regenerate_state.json").exists()  # the resume state goes once the data is saved
    # the regenerated conversations are kept, and they are what the rows were tokenized from
    import gzip

    from datasets import load_from_disk

    with gzip.open(tmp_path / "o" / REGENERATED_FILE, "rt") as f:
        kept = {row["id"]: row["messages"] for row in map(json.loads, f)}
    ds = load_from_disk(str(tmp_path / "o"))
    assert sorted(kept) == sorted(list(ds["train"]["id"]) + list(ds["eval"]["id"]))
    for split in ds:
        for row in ds[split]:
            assert any(m["role"] == "assistant" for m in kept[row["id"]])
            ids, mask, _ = tokenize_conversation(tokenizer, kept[row["id"]], 96)
            assert row["input_ids"] == ids and row["loss_mask"] == mask


def test_regeneration_over_two_processes_equals_one(tmp_path, chatty_target, chatty_target_dir):
    """Conversations spread over two worker processes come back in input order with the
    answers a single process gives; each worker saves its own resumable state."""
    from specheads.data.regenerate import regenerate, regenerate_on, state_files
    from specheads.data.sources import Conversation
    from specheads.runtime.sampling import SamplingParams

    model, tok = chatty_target
    convs = [Conversation(f"c{i}", [{"role": "user", "content": f"Tell me about thing {i}" + " please" * (i % 3)},
                                    {"role": "assistant", "content": "old"},
                                    {"role": "user", "content": "More?"}][: 1 + 2 * (i % 2)]) for i in range(5)]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    one = regenerate(model, tok, convs, params, max_length=128, batch_size=2)
    two = regenerate_on(["cpu", "cpu"], chatty_target_dir, convs, params, max_length=128, batch_size=2,
                        state_dir=tmp_path)
    assert [c.id for c in two] == [c.id for c in one] == [f"c{i}" for i in range(5)]
    assert [c.messages for c in two] == [c.messages for c in one]
    assert [f.name for f in state_files(tmp_path)] == ["regenerate_state.0-of-2.json", "regenerate_state.1-of-2.json"]
    saved = json.loads((tmp_path / "regenerate_state.1-of-2.json").read_text())
    assert [c["id"] for c in saved["convs"]] == ["c1", "c3"]
    # a worker that fails names its device, without waiting for the others to finish
    with pytest.raises(RuntimeError, match=r"cuda:5 \(shard 1 of 2\)"):
        regenerate_on(["cpu", "cuda:5"], chatty_target_dir, convs * 40, replace(params, max_new_tokens=64),
                      max_length=128, batch_size=2)


@pytest.mark.parametrize("spec, message", [("cuda:0", "not cpu or cuda:K"), ("gpu", "not cpu or cuda:K"),
                                           ("all", "no CUDA device"), ("3", "give 1..1")])
def test_bad_regeneration_devices(tmp_path, tiny_target_dir, sharegpt_json, spec, message):
    with pytest.raises(ValueError, match=message):
        prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(tmp_path / "o"),
                               regenerate=True, devices=spec, draft_vocab_size=DRAFT_VOCAB))
    assert not (tmp_path / "o").exists()




@pytest.mark.parametrize("eval_fraction, limit", [(0.0, None), (0.5, 1)], ids=["no-eval-fraction", "one-conversation"])
def test_no_eval_split_loads(tmp_path, tiny_target_dir, sharegpt_json, eval_fraction, limit):
    from specheads.training.data import load_prepared

    out = tmp_path / "o"
    # limit=1 + eval_fraction 0.5: good-0 must land in train for prepare to succeed at all
    assert not is_eval("good-0", 0.5)
    rep = prepare(PrepareOptions(target=str(tiny_target_dir), data=str(sharegpt_json), output=str(out),
                                 max_length=64, eval_fraction=eval_fraction, limit=limit,
                                 draft_vocab_size=DRAFT_VOCAB))
    assert rep["conversations"]["eval"] == 0
    data = load_prepared(out)
    assert len(data.train_ids) == rep["conversations"]["train"] and data.eval_ids == []


def test_first_repeat_end():
    from specheads.data.chat import first_repeat_end

    assert first_repeat_end([1, 2, 3, 4, 5], 2) is None
    assert first_repeat_end([1, 2, 3, 1, 2, 3, 1, 2], 3) == 6  # 1 2 3 seen again at 3..5
    assert first_repeat_end([7, 7, 7], 2) == 3
    assert first_repeat_end([1, 2], 4) is None


def test_cut_loops_keeps_one_repeat_and_leaves_other_turns(tokenizer):
    from specheads.data.chat import cut_loops, first_repeat_end

    loop = "The product is sold to clients. " * 12
    msgs = [{"role": "user", "content": "Tell me about it."}, {"role": "assistant", "content": "Sure. " + loop},
            {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "Nothing else to add here."}]
    out, n_cut, removed = cut_loops(tokenizer, msgs, 8)
    assert n_cut == 1 and removed > 0
    assert out[0] == msgs[0] and out[2:] == msgs[2:]
    kept = out[1]["content"]
    assert msgs[1]["content"].startswith(kept) and len(kept) < len(msgs[1]["content"])
    kept_ids = tokenizer(kept, add_special_tokens=False)["input_ids"]
    assert first_repeat_end(kept_ids, 8) == len(kept_ids)  # it ends where the loop has run 8 tokens
    assert len(kept_ids) == len(tokenizer(msgs[1]["content"], add_special_tokens=False)["input_ids"]) - removed


def test_prepare_cut_loops_reports_and_shortens(tmp_path, tiny_target_dir, tokenizer):
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"},
                                          {"role": "assistant", "content": "One answer. " + "Again and again. " * (20 * i)}]}
            for i in range(4)]
    data = tmp_path / "loops.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    common = dict(target=str(tiny_target_dir), data=str(data), max_length=4096, eval_fraction=0.0,
                  draft_vocab_size=DRAFT_VOCAB)
    plain = prepare(PrepareOptions(output=str(tmp_path / "plain"), **common))
    cut = prepare(PrepareOptions(output=str(tmp_path / "cut"), cut_loops=8, **common))
    assert "cut_loops" not in plain
    assert cut["cut_loops"]["ngram"] == 8 and cut["cut_loops"]["answers_cut"] == 3  # r0 does not loop
    assert abs(cut["cut_loops"]["tokens_removed"] - (plain["train_loss_tokens"] - cut["train_loss_tokens"])) <= 3
    assert cut["train_tokens"] < plain["train_tokens"]
    with pytest.raises(ValueError, match="cut_loops must be an n-gram length"):
        prepare(PrepareOptions(output=str(tmp_path / "bad"), cut_loops=1, **common))


def test_prepare_on_worker_processes_equals_one_process(tmp_path, tiny_target_dir, sharegpt_json, monkeypatch):
    """--num-proc: the same rows, split, vocab map and report, tokenized on 2 spawned workers."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    import specheads.data.prepare as prep

    monkeypatch.setattr(prep, "CONVS_PER_PROC", 1)  # the test data is small: use the pool anyway
    common = dict(target=str(tiny_target_dir), data=str(sharegpt_json), max_length=64, eval_fraction=0.2,
                  draft_vocab_size=DRAFT_VOCAB, cut_loops=4)
    one = prepare(PrepareOptions(output=str(tmp_path / "one"), num_proc=1, **common))
    two = prepare(PrepareOptions(output=str(tmp_path / "two"), num_proc=2, **common))
    for key in ("conversations", "train_tokens", "train_loss_tokens", "truncated", "skipped", "cut_loops"):
        assert one[key] == two[key], key
    a, b = load_from_disk(str(tmp_path / "one")), load_from_disk(str(tmp_path / "two"))
    for split in a:
        assert a[split].to_dict() == b[split].to_dict()
    va, vb = load_file(str(tmp_path / "one" / "vocab_map.safetensors")), load_file(str(tmp_path / "two" / "vocab_map.safetensors"))
    assert all(torch.equal(va[k], vb[k]) for k in va)
    with pytest.raises(ValueError, match="num_proc must be >= 1"):
        prepare(PrepareOptions(output=str(tmp_path / "bad"), num_proc=0, **common))


def test_regeneration_drops_what_reading_it_back_would(tmp_path):
    """An answer of only whitespace (a target that answers with newlines) is dropped when the
    regeneration is collected, as reading the saved file back drops it: re-preparing from the
    saved regeneration sees the same conversations as the prepare that wrote it."""
    from specheads.data.prepare import write_conversations
    from specheads.data.regenerate import _answered
    from specheads.data.sources import Conversation

    user = {"role": "user", "content": "hi"}
    convs = [Conversation(str(i), [user]) for i in range(4)]
    answers = [[user, {"role": "assistant", "content": "hello"}],
               [user, {"role": "assistant", "content": "\n\n  \n"}],
               [user],
               [user, {"role": "assistant", "content": " "}, user, {"role": "assistant", "content": "ok"}]]
    kept = _answered(convs, answers)
    assert [c.id for c in kept] == ["0", "3"]
    path = tmp_path / "regenerated.jsonl.gz"
    write_conversations(path, kept)
    skips = SkipLog()
    assert [c.id for c in read_conversations(str(path), skips)] == ["0", "3"]
    assert skips.total == 0
