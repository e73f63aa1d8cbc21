"""User errors through the CLI: one clear line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import json

import pytest

from specheads.cli import main
from tests.helpers import build_tokenizer, save_random_target, tiny_llama_config


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_one_line_error(err, command):
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines and lines[0].startswith(f"specheads {command}: error: ")
    assert "Traceback" not in err


def test_train_missing_data_folder(capsys, tmp_path, tiny_target_dir):
    missing = tmp_path / "no-such-data"
    code, _, err = _run(capsys, "train", "--target", str(tiny_target_dir), "--data", str(missing),
                        "--output-dir", str(tmp_path / "run"))
    assert code == 2
    _assert_one_line_error(err, "train")
    assert str(missing) in err and "specheads prepare" in err
    assert not (tmp_path / "run").exists()


def test_prepare_missing_data_file(capsys, tmp_path, tiny_target_dir):
    missing = tmp_path / "conversations.json"
    code, _, err = _run(capsys, "prepare", "--target", str(tiny_target_dir), "--data", str(missing),
                        "--output", str(tmp_path / "out"))
    assert code == 2
    _assert_one_line_error(err, "prepare")
    assert str(missing) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, words", [(["--regenerate", "--devices", "cuda:7"], ["devices", "cuda:7"]),
                                          (["--cut-loops", "2"], ["cut_loops", ">= 4"]),
                                          (["--max-length", "8"], ["max_length", ">= 16"])])
def test_prepare_bad_options(capsys, tmp_path, tiny_target_dir, sharegpt_json, flags, words):
    code, _, err = _run(capsys, "prepare", "--target", str(tiny_target_dir), "--data", str(sharegpt_json),
                        "--output", str(tmp_path / "out"), *flags)
    assert code == 2
    _assert_one_line_error(err, "prepare")
    assert all(w in err for w in words)
    assert not (tmp_path / "out").exists()


def test_eval_missing_head_and_data(capsys, tmp_path):
    code, _, err = _run(capsys, "eval", "--draft", str(tmp_path / "no-head"), "--data", str(tmp_path / "no-data"))
    assert code == 2
    _assert_one_line_error(err, "eval")
    assert "no-head" in err


def test_prepare_no_assistant_turns(capsys, tmp_path, tiny_target_dir):
    src = tmp_path / "users.jsonl"
    src.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code, _, err = _run(capsys, "prepare", "--target", str(tiny_target_dir), "--data", str(src),
                        "--output", str(tmp_path / "out"))
    assert code == 2
    _assert_one_line_error(err, "prepare")
    assert "no usable conversations" in err and "no assistant turn" in err and "--regenerate" in err


def test_prepare_missing_target(capsys, tmp_path, sharegpt_json):
    code, _, err = _run(capsys, "prepare", "--target", str(tmp_path / "nowhere"), "--data", str(sharegpt_json),
                        "--output", str(tmp_path / "out"))
    assert code == 2
    assert str(tmp_path / "nowhere") in err


def test_train_target_of_another_vocab(capsys, tmp_path, prepared_dir):
    """Data prepared for the 400-token tokenizer, a target with 300 tokens: caught before training."""
    tok = build_tokenizer(vocab_size=300, seed=5)
    other = tmp_path / "other"
    save_random_target(other, tiny_llama_config(len(tok)), tok)
    code, _, err = _run(capsys, "train", "--target", str(other), "--data", str(prepared_dir),
                        "--output-dir", str(tmp_path / "run"), "--max-steps", "1")
    assert code == 2
    _assert_one_line_error(err, "train")
    assert "400" in err and "300" in err and "prepare it again" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_train_unknown_config_key(capsys, tmp_path, prepared_dir):
    code, _, err = _run(capsys, "train", "--data", str(prepared_dir), "--set", "train.learning_rate=1e-3")
    assert code == 2
    assert err.startswith("specheads train: error: invalid run config")
    assert "train.learning_rate: unknown key" in err


def test_train_bad_value(capsys, prepared_dir):
    code, _, err = _run(capsys, "train", "--data", str(prepared_dir), "--set", "train.ttt_steps=0")
    assert code == 2
    assert "train.ttt_steps:" in err


def test_train_missing_config_file(capsys, tmp_path):
    code, _, err = _run(capsys, "train", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert str(tmp_path / "nope.yaml") in err


def test_train_missing_deepspeed_config(capsys, tmp_path, prepared_dir, tiny_target_dir):
    code, _, err = _run(capsys, "train", "--target", str(tiny_target_dir), "--data", str(prepared_dir),
                        "--deepspeed", str(tmp_path / "ds.json"), "--output-dir", str(tmp_path / "run"))
    assert code == 2
    assert str(tmp_path / "ds.json") in err


def test_world_size_without_deepspeed(capsys, monkeypatch, tmp_path, prepared_dir, tiny_target_dir):
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = _run(capsys, "train", "--target", str(tiny_target_dir), "--data", str(prepared_dir),
                        "--output-dir", str(tmp_path / "run"))
    assert code == 2
    assert "WORLD_SIZE=2" in err and "ds_zero2.json" in err


def test_unsupported_target_architecture(capsys, tmp_path, prepared_dir, tokenizer):
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    code, _, err = _run(capsys, "train", "--target", str(folder), "--data", str(prepared_dir),
                        "--output-dir", str(tmp_path / "run"))
    assert code == 2
    assert "supported model types: llama, mistral, qwen2, qwen3" in err


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--max-steps", "many"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_prepare_and_train_succeed_through_the_cli(capsys, tmp_path, tiny_target_dir, sharegpt_json):
    out = tmp_path / "data"
    code, stdout, _ = _run(capsys, "prepare", "--target", str(tiny_target_dir), "--data", str(sharegpt_json),
                           "--output", str(out), "--max-length", "64", "--draft-vocab-size", "150")
    assert code == 0
    assert "skipped: unknown role 'narrator'" in stdout
    code, stdout, _ = _run(capsys, "train", "--target", str(tiny_target_dir), "--data", str(out),
                           "--output-dir", str(tmp_path / "run"), "--max-steps", "2",
                           "--set", "train.ttt_steps=2", "--set", "train.batch_size=4",
                           "--set", "data.eval_max_rows=4", "--set", "train.export_dtype=float32")
    assert code == 0
    assert "simulated chain acceptance length" in stdout
    cfg = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 150


def test_generate_command(capsys, tiny_target, tiny_target_dir):
    from specheads.data.chat import render
    from specheads.data.regenerate import stop_token_ids
    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams

    model, tok = tiny_target
    code, stdout, _ = _run(capsys, "generate", "--target", str(tiny_target_dir), "--prompt", "Hello world",
                           "--max-new-tokens", "6", "--json")
    assert code == 0
    result = json.loads(stdout.strip().splitlines()[-1])["outputs"][0]
    ids = tok(render(tok, [{"role": "user", "content": "Hello world"}], add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]
    expected = decode(model, [ids], SamplingParams(max_new_tokens=6), stop_token_ids(tok))[0]
    assert result["token_ids"] == expected
    assert result["text"] == tok.decode(expected)


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("text, words", [
    ('{"numerics": {"attention_chunk": 100}}', "numerics.attention_chunk = 100: expected a power of two >= 64"),
    ('{"speed": {"chunk": 64}}', "unknown kernel tuning field speed.chunk"),
    ("no-such-file.json", "neither a JSON object nor a JSON file"),
])
def test_bad_kernel_tuning(capsys, tmp_path, command, text, words):
    """--kernel-tuning is checked before any model loads: the error names the bad field."""
    from specheads.kernels import tuning

    before = tuning.active()
    extra = ["--prompt", "hi"] if command == "generate" else []
    code, _, err = _run(capsys, command, "--target", str(tmp_path / "never-loaded"), *extra, "--kernel-tuning", text)
    assert code == 2
    _assert_one_line_error(err, command)
    assert words in err
    assert tuning.active() is before


def test_demo_with_a_broken_settings_file(capsys, monkeypatch, tmp_path):
    import specheads.demo

    bad = tmp_path / "demo.yaml"
    bad.write_text("data:\n  path: prepared/demo\ntrain:\n  steps: 80\n")
    monkeypatch.setattr(specheads.demo, "DEMO_CONFIG", bad)
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "demo", "--cpu")
    assert code == 2
    _assert_one_line_error(err, "demo")
    assert str(bad) in err and "train.steps: unknown key" in err
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "runs").exists()
