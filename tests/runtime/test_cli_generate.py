"""`specheads generate` in-process: JSON output, lossless against --method ar, user errors."""

from __future__ import annotations

import json

import pytest

from specheads.cli import main
from tests.helpers import train_config

PROMPT_ARGS = ["--prompt", "hi", "--prompt", "hello there"]


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, tiny_target_dir, small_prepared_dir):
    """A head exported by a short training run on the tiny target (draft vocab < vocab)."""
    from specheads.training.trainer import train

    out = tmp_path_factory.mktemp("generate-head")
    train(train_config(tiny_target_dir, small_prepared_dir, out, "train.max_steps=10", "train.lr=3e-3"))
    assert (out / "final" / "model.safetensors").is_file()
    return out / "final"


def _generate(capsys, target, *args):
    capsys.readouterr()
    code = main(["generate", "--target", str(target), *PROMPT_ARGS, "--max-new-tokens", "8", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(capsys, target, *args) -> dict:
    code, out, err = _generate(capsys, target, "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_generate_json_equals_ar(capsys, tiny_target_dir, tiny_target, head_dir):
    _, tok = tiny_target
    spec = _json(capsys, tiny_target_dir, "--draft", str(head_dir), "--max-len", "256")
    assert set(spec) == {"outputs", "stats"}
    assert len(spec["outputs"]) == 2
    for o in spec["outputs"]:
        assert {"token_ids", "text", "finish_reason"} <= set(o)
        assert all(isinstance(t, int) for t in o["token_ids"]) and 0 < len(o["token_ids"]) <= 8
        assert o["text"] == tok.decode(o["token_ids"])
        assert o["finish_reason"] in ("stop", "length")
        assert o["finish_reason"] == "length" or len(o["token_ids"]) < 8
    stats = spec["stats"]
    assert stats["method"] == "eagle3+ngram"  # an EAGLE-3 head drafts with the n-gram assist by default
    assert isinstance(stats["steps"], int) and stats["steps"] > 0
    # the engine's definition pooled over outputs: 1 + accepted drafts per verify step (prefill not counted)
    assert stats["mean_accept_length"] == pytest.approx(1 + stats["accepted_tokens"] / stats["steps"], abs=1e-3)
    assert stats["tokens_per_s"] > 0 and stats["accepted_tokens"] >= 0

    ar = _json(capsys, tiny_target_dir, "--method", "ar", "--max-len", "256")
    assert ar["stats"]["method"] == "ar"
    assert [o["token_ids"] for o in ar["outputs"]] == [o["token_ids"] for o in spec["outputs"]]
    assert [o["finish_reason"] for o in ar["outputs"]] == [o["finish_reason"] for o in spec["outputs"]]
    # the other drafters through the CLI flags: the same tokens
    for extra in (["--method", "ngram"], ["--draft", str(head_dir), "--topk", "1", "--num-steps", "3"],
                  ["--draft", str(head_dir), "--static-tree", "0;1;0,0;0,1;1,0;0,0,0"],
                  ["--draft", str(head_dir), "--draft-lm-head", "bf16"],
                  ["--method", "ngram", "--draft-lm-head", "bf16"],
                  ["--draft", str(head_dir), "--draft-option", "ngram_gate=1", "--draft-option", "ngram_min=2"]):
        other = _json(capsys, tiny_target_dir, "--max-len", "256", *extra)
        assert [o["token_ids"] for o in other["outputs"]] == [o["token_ids"] for o in ar["outputs"]], extra


def test_generate_kernel_tuning(capsys, monkeypatch, tiny_target_dir, head_dir):
    """--kernel-tuning sets the process's kernel tuning over the card's defaults before the
    engine is built; the output is the same."""
    from specheads.kernels import tuning

    monkeypatch.setattr(tuning, "_active", tuning.active())  # put back after the test
    plain = _json(capsys, tiny_target_dir, "--draft", str(head_dir), "--max-len", "256")
    tuned = _json(capsys, tiny_target_dir, "--draft", str(head_dir), "--max-len", "256", "--kernel-tuning",
                  '{"speed": {"draft_warps": 4}, "numerics": {"attention_chunk": 64}}')
    assert tuning.active().speed.draft_warps == 4 and tuning.active().numerics.attention_chunk == 64
    assert tuning.active().numerics.linear_max_k == tuning.KernelTuning.for_device().numerics.linear_max_k
    assert [o["token_ids"] for o in tuned["outputs"]] == [o["token_ids"] for o in plain["outputs"]]


def test_generate_stats_agree_with_the_outputs(capsys, tiny_target_dir, head_dir):
    """One prompt: the pooled stats are that output's own figures; without drafts exactly 1.0."""
    capsys.readouterr()
    for method in (["--draft", str(head_dir)], ["--method", "ar"]):
        assert main(["generate", "--target", str(tiny_target_dir), "--prompt", "hello there", "--max-new-tokens",
                     "16", "--max-len", "256", "--json", *method]) == 0
        result = json.loads(capsys.readouterr().out)
        (output,), stats = result["outputs"], result["stats"]
        assert stats["steps"] > 0 and stats["mean_accept_length"] == output["mean_accept_length"]
        assert stats["mean_accept_length"] == round(1 + stats["accepted_tokens"] / stats["steps"], 3)
        # the prefill token and one per verify step, plus the drafts accepted
        assert len(output["token_ids"]) <= 1 + stats["steps"] + stats["accepted_tokens"]
        if method[0] == "--method":
            assert stats["accepted_tokens"] == 0 and stats["mean_accept_length"] == 1.0
            assert output["mean_accept_length"] == 1.0


def test_generate_text_mode_prints_text_and_stats(capsys, tiny_target_dir, tiny_target, head_dir):
    code, out, err = _generate(capsys, tiny_target_dir, "--draft", str(head_dir), "--max-len", "256")
    assert code == 0
    assert json.loads(err.strip().splitlines()[-1])["method"] == "eagle3+ngram"
    assert out.count("\n") >= 2  # one printed text per prompt


def test_generate_default_max_len_fits_the_target(capsys, tiny_target_dir, head_dir):
    """The plain command (no --max-len) on a target of 512 positions: the cache length
    defaults to the target's context (it used to be a fixed 2048, which exited 2)."""
    code, out, err = _generate(capsys, tiny_target_dir, "--draft", str(head_dir), "--json")
    assert code == 0, err
    spec = json.loads(out)
    ar = _json(capsys, tiny_target_dir, "--method", "ar")
    assert [o["token_ids"] for o in spec["outputs"]] == [o["token_ids"] for o in ar["outputs"]]
    assert spec["stats"]["method"] == "eagle3+ngram" and ar["stats"]["method"] == "ar"


def test_generate_missing_draft_folder(capsys, tmp_path, tiny_target_dir):
    missing = tmp_path / "no-such-head"
    code, out, err = _generate(capsys, tiny_target_dir, "--draft", str(missing), "--max-len", "256", "--json")
    assert code == 2
    assert out == ""
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[0].startswith("specheads generate: error: ") and "Traceback" not in err
    assert str(missing) in err


def test_generate_max_len_beyond_target_is_a_user_error(capsys, tiny_target_dir):
    code, _, err = _generate(capsys, tiny_target_dir, "--method", "ar", "--max-len", "4096")
    assert code == 2
    assert err.startswith("specheads generate: error: ") and "Traceback" not in err
    assert "max_len 4096" in err and "512 positions" in err


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--static-tree", "0;1,1"], "static tree path (1, 1) has no parent path (1,)"),
        (["--static-tree", "0;x"], "static tree '0;x'"),
        (["--top-p", "2"], "top_p must be in (0, 1], got 2.0"),
        (["--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["--top-k", "-3"], "top_k must be >= 0"),
        (["--max-new-tokens", "0"], "max_new_tokens must be > 0"),
    ],
)
def test_generate_bad_flags_are_user_errors(capsys, tiny_target_dir, head_dir, bad, message):
    """Bad request flags: one line naming the flag's problem, exit 2, no traceback."""
    code, out, err = _generate(capsys, tiny_target_dir, "--draft", str(head_dir), "--max-len", "256", *bad)
    assert code == 2 and out == ""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("specheads generate: error: ")
    assert message in err


def test_generate_refuses_a_bad_drafter_option(capsys, tiny_target_dir, head_dir):
    for option, said in (("ngram_gate", "expected name=value"), ("ngram_gate=-1", "ngram_gate must be a batch size")):
        assert main(["generate", "--target", str(tiny_target_dir), "--draft", str(head_dir), "--prompt", "hi",
                     "--max-new-tokens", "4", "--max-len", "128", "--draft-option", option]) == 2
        assert said in capsys.readouterr().err
