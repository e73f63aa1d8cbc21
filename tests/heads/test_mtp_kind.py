"""The mtp head kind end to end on CPU: `specheads train --set head.kind=mtp --set head.num_modules=2`,
the run's per-module metrics, the head folder (round trip, validation), export (refused: no engine
format; speculators' mtp type, naming the conditions the head fails), a publish dry run, resume
after a kill, and the run config's `head.num_modules`.

The DeepSpeed case lives with the other launcher tests (tests/training/test_deepspeed.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.cli import main
from specheads.config import ConfigError, load_config
from specheads.heads.format import HeadFormatError, load_head, save_head, validate_weights
from specheads.heads.mtp import ARCHITECTURE, MTPConfig, MTPHead, weight_shapes
from specheads.heads.registry import head_kind, kind_of
from specheads.training.trainer import TrainingError, evaluate_head, train
from tests.helpers import (BASE_OVERRIDES, DRAFT_VOCAB, TINY_HIDDEN, TINY_LAYERS, kill_and_resume, read_jsonl,
                           train_config, train_records)
from tests.helpers import one_torch_thread  # noqa: F401  (autouse: tiny matmuls run fastest on one thread)

MODULES = 2
MTP = ("head.kind=mtp", f"head.num_modules={MODULES}")
# more unrolled steps than modules: the unroll (and so every per-step metric) stops at the last module
TTT_STEPS = 3
STEPS = 30


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_target_dir, small_prepared_dir):
    """`specheads train` of an MTP head: 30 steps on four short conversations (it overfits them)."""
    out = tmp_path_factory.mktemp("mtp-run")
    args = ["train", "--target", str(tiny_target_dir), "--data", str(small_prepared_dir), "--output-dir", str(out),
            "--max-steps", str(STEPS)]
    for o in [*BASE_OVERRIDES, *MTP, f"train.ttt_steps={TTT_STEPS}", "train.lr=3e-3"]:
        args += ["--set", o]
    assert main(args) == 0
    return out


def _summary(out) -> dict:
    return json.loads((out / "train_summary.json").read_text())


# ------------------------------------------------------------------ 1. training from the CLI
def test_cli_trains_an_mtp_head(run):
    rows = train_records(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert rows[-1]["acc"][0] > rows[0]["acc"][0]
    meta = json.loads((run / "final" / "specheads.json").read_text())
    assert meta["kind"] == "mtp" and meta["config"]["num_modules"] == MODULES
    assert meta["config"]["target_layer_ids"] == [TINY_LAYERS]  # the final hidden state, after the target's norm
    assert meta["run_config"]["head"] == {"kind": "mtp", "intermediate_size": None, "num_modules": MODULES,
                                          "num_heads": None, "num_layers": None, "lm_head_from_target": None,
                                          "shared_lm_head": None, "freeze_lm_head": None}
    assert _summary(run)["steps"] == STEPS


# ------------------------------------------------------------------ 5. per-module metrics
def test_cli_generate_with_the_mtp_folder_equals_ar(run, tiny_target_dir, small_prepared_dir, capsys):
    """`specheads generate --draft <mtp folder>`: the kind read from the folder, the tree and a
    chain (--topk 1) give ar's tokens (acceptance itself: tests/runtime/test_head_kinds_runtime.py)."""
    rows = json.loads((small_prepared_dir.parent / "small.json").read_text())
    prompts = [a for r in rows[:2] for a in ("--prompt", r["conversations"][0]["value"])]

    def generate(*extra):
        capsys.readouterr()
        assert main(["generate", "--target", str(tiny_target_dir), *prompts, "--max-new-tokens", "12",
                     "--max-len", "256", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    ar = generate("--method", "ar")
    for extra in ([], ["--topk", "1", "--num-steps", str(MODULES)]):
        got = generate("--draft", str(run / "final"), *extra)
        assert got["stats"]["method"] == "mtp"
        assert [o["token_ids"] for o in got["outputs"]] == [o["token_ids"] for o in ar["outputs"]], extra
        assert got["stats"]["steps"] > 0


def test_metrics_have_one_entry_per_module(run):
    """ttt_steps (3) exceeds the modules (2): training records and the evaluation count the modules."""
    for r in train_records(run / "metrics.jsonl"):
        assert len(r["acc"]) == MODULES, r
    summary = _summary(run)
    for key in ("eval/acc", "eval/chain_acc", "eval/loss"):
        assert len(summary[key]) == MODULES, (key, summary[key])
        assert all(0 <= x for x in summary[key])
    assert summary["eval/acc"][0] > 0  # the head learned something
    assert 1.0 <= summary["eval/accept_length"] <= 1 + MODULES
    assert 0 < summary["eval/positions_opening"] <= summary["eval/positions"]
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "eval/acc" in r]
    assert evals and len(evals[-1]["eval/acc"]) == MODULES


def test_eval_of_the_saved_head_reproduces_the_runs_evaluation(run, tiny_target_dir, small_prepared_dir, capsys):
    """`specheads eval` rebuilds the head at its own num_modules (2, not the kind's default 3), with
    the CLI's default of 7 simulated steps."""
    summary = _summary(run)
    got = evaluate_head(str(run / "final"), str(small_prepared_dir), str(tiny_target_dir), rows=4, batch_size=4,
                        ttt_steps=7)
    for key in ("eval/acc", "eval/chain_acc", "eval/loss"):
        assert got[key] == pytest.approx(summary[key], abs=2e-4), key
    assert got["eval/positions"] == summary["eval/positions"]
    capsys.readouterr()
    assert main(["eval", "--draft", str(run / "final"), "--data", str(small_prepared_dir), "--target",
                 str(tiny_target_dir), "--rows", "4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["eval/acc"]) == MODULES


# ------------------------------------------------------------------ 3. the head folder
def test_head_folder_round_trip(run, tmp_path):
    final = run / "final"
    head = load_head(final)
    assert isinstance(head, MTPHead) and head.kind == "mtp"
    assert head.config.num_modules == MODULES and len(head.layers) == MODULES
    raw = json.loads((final / "config.json").read_text())
    assert raw["architectures"] == [ARCHITECTURE] and raw["specheads_kind"] == "mtp"
    assert raw["num_nextn_predict_layers"] == MODULES
    tensors = load_file(str(final / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == weight_shapes(head.config)
    assert "layers.1.shared_head.norm.weight" in tensors and "layers.2.eh_proj.weight" not in tensors
    assert tensors["layers.0.eh_proj.weight"].shape == (TINY_HIDDEN, 2 * TINY_HIDDEN)
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, TINY_HIDDEN)
    # the exported weights (float32) are the trainer's last weights, exactly
    state = torch.load(run / "checkpoints" / f"step_{STEPS}" / "state.pt", weights_only=True)["head"]
    for name, t in tensors.items():
        assert torch.equal(t, state[name]), name
    # save -> load gives equal tensors and config
    again = load_head(save_head(head, tmp_path / "again", torch.float32))
    assert isinstance(again, MTPHead) and again.config == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], t), name
    # a folder without specheads.json: config.json's specheads_kind and keys give the same head
    bare = tmp_path / "bare"
    shutil.copytree(final, bare)
    (bare / "specheads.json").unlink()
    from_hf = load_head(bare)
    assert isinstance(from_hf, MTPHead) and from_hf.config == head.config


def test_the_config_is_known_as_mtp_not_as_eagle3(run):
    """MTPConfig subclasses Eagle3Config: the registry must name its own kind."""
    cfg = load_head(run / "final").config
    assert isinstance(cfg, MTPConfig)
    assert kind_of(cfg) is head_kind("mtp")
    from specheads.heads.format import hf_config

    assert hf_config(cfg, torch.float32, None)["specheads_kind"] == "mtp"


def _rewritten(final, tmp_path, edit):
    folder = tmp_path / "edited"
    shutil.copytree(final, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, tensors


def _wrong_shape(t):
    t["layers.1.eh_proj.weight"] = torch.zeros(TINY_HIDDEN, TINY_HIDDEN)


def _wrong_name(t):  # EAGLE-3's name for the module-0 feature norm
    t["layers.0.hidden_norm.weight"] = t.pop("layers.0.hnorm.weight")


def _third_module(t):  # a module the config does not have
    t["layers.2.enorm.weight"] = t["layers.1.enorm.weight"].clone()


@pytest.mark.parametrize("edit, messages", [
    (_wrong_shape, [(rf"layers.1.eh_proj.weight has shape \({TINY_HIDDEN}, {TINY_HIDDEN}\), expected "
                     rf"\({TINY_HIDDEN}, {2 * TINY_HIDDEN}\)")]),
    (_wrong_name, ["missing tensor layers.0.hnorm.weight", r"unexpected tensors \['layers.0.hidden_norm.weight'\]"]),
    (_third_module, [r"unexpected tensors \['layers.2.enorm.weight'\]"]),
], ids=["shape", "name", "extra-module"])
def test_validation_rejects_wrong_tensors(run, tmp_path, edit, messages):
    folder, tensors = _rewritten(run / "final", tmp_path, edit)
    cfg = load_head(run / "final").config
    with pytest.raises(HeadFormatError) as e:
        validate_weights(tensors, cfg, "under test")
    for m in messages:
        assert e.match(m)
    with pytest.raises(HeadFormatError, match=messages[0]) as e:
        load_head(folder)
    assert str(folder) in str(e.value)


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_export_is_refused_with_a_clear_message(run, tmp_path, capsys, fmt):
    out = tmp_path / "exported"
    capsys.readouterr()
    assert main(["export", str(run / "final"), "--format", fmt, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"specheads export: error: MTP heads have no {fmt} export: no public engine loads this kind" in err
    assert "(mtp heads export to: speculators)" in err
    assert "`specheads serve`" in err and "Traceback" not in err
    assert not out.exists()


def test_speculators_export_is_refused_naming_the_conditions_the_head_fails(run, tmp_path, capsys):
    """speculators 0.9.0's mtp type loads one module, the full vocabulary and Qwen3-family verifiers
    (docs/formats/mtp-sources.md, section 3): this head (2 modules, a draft vocabulary, a Llama
    target) fails all three, and the error says so; nothing is written."""
    cfg = load_head(run / "final").config
    assert (cfg.num_modules, cfg.target_model_type) == (MODULES, "llama") and cfg.draft_vocab_size < cfg.vocab_size
    out = tmp_path / "exported"
    capsys.readouterr()
    assert main(["export", str(run / "final"), "--format", "speculators", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "specheads export: error: MTP heads do not export to speculators: speculators 0.9.0's mtp type loads " \
           "(1) one module (num_nextn_predict_layers == 1), (2) the full vocabulary (no draft vocabulary), (3) a " \
           "Qwen3-family verifier (qwen3, qwen3_next, qwen3_5_text, qwen3_5_moe_text); this head fails " \
           f"(1): it has {MODULES} modules (head.num_modules={MODULES}); (2): it drafts over " \
           f"{cfg.draft_vocab_size} of the target's {cfg.vocab_size} tokens; (3): its target is llama" in err
    assert "`specheads serve`" in err and "Traceback" not in err
    assert not out.exists()


QWEN3 = {"target_model_type": "qwen3", "qk_norm": True}


@pytest.mark.parametrize("change, fails", [
    ({"num_modules": 1, "draft_vocab_size": None}, ["(3): its target is llama"]),
    ({**QWEN3, "draft_vocab_size": None}, [f"(1): it has {MODULES} modules"]),
    ({"num_modules": 1, **QWEN3}, ["(2): it drafts over"]),
    ({"num_modules": 1, "target_model_type": "qwen3", "draft_vocab_size": None},
     ["(3): its decoder layer has no q_norm/k_norm"]),
    ({"num_modules": 1, **QWEN3, "draft_vocab_size": None}, []),
], ids=["target", "modules", "vocab", "qk-norm", "none"])
def test_speculators_refusal_names_only_the_failed_conditions(run, change, fails):
    import dataclasses

    from specheads.heads.mtp import speculators_refusal

    cfg = load_head(run / "final").config
    cfg = dataclasses.replace(cfg, **{k: cfg.vocab_size if v is None else v for k, v in change.items()})
    why = cfg.refused_exports().get("speculators")
    assert why == speculators_refusal(cfg)
    if not fails:  # speculators' own MTP layer: exported (tests/heads/test_speculators_loads.py loads it)
        assert why is None
        return
    named = [f for f in ("(1): ", "(2): ", "(3): ") if f in why]
    assert len(named) == len(fails) and all(f in why for f in fails)


def test_publish_dry_run_writes_a_card_naming_mtp(run, tmp_path, capsys):
    out = tmp_path / "staged"
    assert main(["publish", str(run / "final"), "--repo-id", "me/tiny-mtp", "--dry-run", "--output", str(out)]) == 0
    assert "dry run: nothing uploaded" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"README.md", "config.json", "model.safetensors", "specheads.json"}
    card = (out / "README.md").read_text()
    assert "# MTP draft head for" in card and "A speculative-decoding draft head (MTP)" in card
    assert "- mtp\n" in card.split("---")[1]  # a tag of the front matter
    assert f"| architecture | {MODULES} MTP modules (DeepSeek-V3 layout" in card
    assert "runs with `specheads generate` / `specheads serve` only" in card
    assert "python -m sglang" not in card and "vllm serve" not in card  # no engine launch command
    assert "| 1 |" in card and "| 2 |" not in card  # one acceptance row per module
    staged = json.loads((out / "config.json").read_text())
    assert staged["specheads_kind"] == "mtp" and staged["architectures"] == [ARCHITECTURE]
    assert json.loads((out / "specheads.json").read_text())["kind"] == "mtp"
    assert isinstance(load_head(out), MTPHead)


# ------------------------------------------------------------------ 4. resume after a kill
def test_resume_after_kill_matches_uninterrupted_run(tmp_path, tiny_target_dir, prepared_dir, capsys):
    resumed, run, straight = kill_and_resume(tmp_path, tiny_target_dir, prepared_dir, capsys, *MTP)
    assert set(resumed) == set(weight_shapes(load_head(straight / "final").config))
    args = (*MTP, "train.max_steps=4", "train.save_every=2", "train.batch_size=3")
    # a checkpoint of 2 modules does not half-load into a head of 3
    with pytest.raises(TrainingError, match=r"another head/target.*num_modules: checkpoint 2 vs now 3"):
        train(train_config(tiny_target_dir, prepared_dir, run, *args, "head.num_modules=3", "train.ttt_steps=3",
                           "train.max_steps=6"))


# ------------------------------------------------------------------ the run config's head.num_modules
def test_num_modules_is_a_head_option_of_mtp_only(tiny_target_dir, small_prepared_dir, tmp_path, capsys):
    assert load_config(None, list(MTP)).head.num_modules == MODULES
    assert load_config(None, ["head.kind=mtp"]).head.num_modules is None  # the kind's default
    assert load_config(None).head.num_modules is None
    with pytest.raises(ConfigError, match=r"head.num_modules=2 does not apply to eagle3 heads; it sets mtp heads"):
        load_config(None, [f"head.num_modules={MODULES}"])
    for bad in ("0", "17", "two"):
        with pytest.raises(ConfigError, match=r"head.num_modules: "):
            load_config(None, ["head.kind=mtp", f"head.num_modules={bad}"])
    # from the CLI: one error line, exit status 2, before any model loads
    capsys.readouterr()
    assert main(["train", "--target", str(tiny_target_dir), "--data", str(small_prepared_dir), "--output-dir",
                 str(tmp_path / "run"), "--max-steps", "1", "--set", "head.num_modules=2"]) == 2
    err = capsys.readouterr().err
    assert "does not apply to eagle3 heads" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_mtp_config_for_target_takes_num_modules(tiny_target):
    model = tiny_target[0]
    cfg = MTPConfig.for_target(model, DRAFT_VOCAB, None, num_modules=4, intermediate_size=None)
    assert cfg.num_modules == 4 and cfg.target_layer_ids == [TINY_LAYERS]
    assert MTPConfig.for_target(model, DRAFT_VOCAB, None, num_modules=None).num_modules == 3  # the default


def test_init_from_an_mtp_head_of_another_depth_is_refused(run, tmp_path, tiny_target_dir, small_prepared_dir):
    from specheads.training.trainer import Trainer

    cfg = train_config(tiny_target_dir, small_prepared_dir, tmp_path / "more", "head.kind=mtp", "head.num_modules=3",
                       f"train.init_from={run / 'final'}")
    with pytest.raises(TrainingError, match=r"does not fit this run: head.num_modules=3, the head has 2"):
        Trainer(cfg).setup()
