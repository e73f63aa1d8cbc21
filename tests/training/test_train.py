"""End-to-end training on the tiny target: learning, resume, offline mode, input checks."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from specheads.training.trainer import TrainingError, train
from tests.helpers import (
    DRAFT_VOCAB,
    build_tokenizer,
    final_state,
    kill_and_resume,
    read_jsonl,
    save_random_target,
    tiny_llama_config,
    train_config,
    train_records,
)


def test_loss_falls_when_overfitting(tmp_path, tiny_target_dir, small_prepared_dir):
    cfg = train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=30", "train.lr=3e-3",
                       "train.ttt_steps=2")
    summary = train(cfg)
    rows = train_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert rows[-1]["acc"][0] > rows[0]["acc"][0]
    assert summary["steps"] == 30
    # the opening positions are a subset of all answer positions
    assert 0 < summary["eval/positions_opening"] <= summary["eval/positions"]
    assert 1.0 <= summary["eval/accept_length_opening"] <= 1 + 2
    assert (tmp_path / "final" / "model.safetensors").is_file()
    assert (tmp_path / "train_summary.json").is_file()


def test_resume_after_kill_matches_uninterrupted_run(tmp_path, tiny_target_dir, prepared_dir, capsys):
    kill_and_resume(tmp_path, tiny_target_dir, prepared_dir, capsys)


def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(tmp_path, tiny_target_dir, prepared_dir,
                                                                   monkeypatch, capsys):
    """A scheduler's time limit (SIGTERM) mid-step: the step finishes, a checkpoint is saved, the
    run returns without exporting; rerunning it ends with the weights of an uninterrupted run."""
    import os
    import signal

    from specheads.training.trainer import Trainer

    args = ("train.max_steps=4", "train.save_every=100", "train.batch_size=3")
    real_step, calls = Trainer.micro_step, []

    def step_then_signal(self, indices):
        calls.append(1)
        if len(calls) == 2:  # the signal arrives during step 2
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, indices)

    monkeypatch.setattr(Trainer, "micro_step", step_then_signal)
    run = tmp_path / "run"
    summary = train(train_config(tiny_target_dir, prepared_dir, run, *args))
    assert summary == {"stopped_at_step": 2, "steps": 4}
    assert "run the same command again to resume" in capsys.readouterr().out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]
    assert not (run / "final").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone after the run
    monkeypatch.setattr(Trainer, "micro_step", real_step)
    resumed_summary = train(train_config(tiny_target_dir, prepared_dir, run, *args))
    assert "at step 2" in capsys.readouterr().out
    straight = tmp_path / "straight"
    straight_summary = train(train_config(tiny_target_dir, prepared_dir, straight, *args))
    # the summary counts the tokens of both calls (steps 1-2 before the signal, 3-4 after)
    assert resumed_summary["tokens"] == straight_summary["tokens"] > 0
    resumed, reference = final_state(run), final_state(straight)
    for k in reference:
        torch.testing.assert_close(resumed[k], reference[k], atol=1e-5, rtol=0, msg=k)


def test_resume_never_starts_over(tmp_path, tiny_target_dir, prepared_dir, capsys):
    args = ("train.max_steps=2", "train.save_every=1")
    train(train_config(tiny_target_dir, prepared_dir, tmp_path, *args))
    capsys.readouterr()
    train(train_config(tiny_target_dir, prepared_dir, tmp_path, *args, "train.resume=never"))
    assert "resumed" not in capsys.readouterr().out
    assert [r["step"] for r in train_records(tmp_path / "metrics.jsonl")] == [1, 2]


def test_keep_checkpoints_prunes_old_ones(tmp_path, tiny_target_dir, prepared_dir):
    train(train_config(tiny_target_dir, prepared_dir, tmp_path, "train.max_steps=4", "train.save_every=1",
                       "train.keep_checkpoints=2"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_3", "step_4"]


def test_offline_mode_matches_online_first_step(tmp_path, tiny_target_dir, prepared_dir):
    args = ("train.max_steps=2", "train.batch_size=4")
    train(train_config(tiny_target_dir, prepared_dir, tmp_path / "online", *args))
    summary = train(train_config(tiny_target_dir, prepared_dir, tmp_path / "offline", *args, "train.mode=offline"))
    cache = tmp_path / "offline" / "hidden_cache"
    shards = sorted(cache.glob("shard_*.safetensors"))
    assert shards and (cache / "index.json").is_file()
    on = train_records(tmp_path / "online" / "metrics.jsonl")
    off = train_records(tmp_path / "offline" / "metrics.jsonl")
    assert [r["step"] for r in off] == [1, 2]
    assert off[0]["loss"] == pytest.approx(on[0]["loss"], abs=1e-4)
    assert off[0]["rows"] == on[0]["rows"]
    assert summary["steps"] == 2 and (tmp_path / "offline" / "final" / "model.safetensors").is_file()


def test_offline_cache_holds_the_targets_hidden_states(tmp_path, tiny_target, prepared_dir):
    from specheads.training.offline import ShardReader, build_cache

    from specheads.training.data import collate, load_prepared

    model, _ = tiny_target

    data = load_prepared(prepared_dir)
    layers = [1, 3, 4]
    fp = {"x": 1}
    folder = build_cache(model, data.train_ids, layers, tmp_path / "cache", batch_size=3, fingerprint=fp)
    stamp = (folder / "index.json").stat().st_mtime_ns
    assert build_cache(model, data.train_ids, layers, folder, 3, fp) == folder  # reused
    assert (folder / "index.json").stat().st_mtime_ns == stamp
    reader = ShardReader(folder)
    pick = [4, 0, 7]
    aux, hidden = reader.batch(pick, "cpu")
    ids, _ = collate([data.train_ids[i] for i in pick], [data.train_mask[i] for i in pick])
    with torch.no_grad():
        out = model(ids, capture_layers=layers, return_logits=False)
    for r, i in enumerate(pick):
        n = len(data.train_ids[i])
        torch.testing.assert_close(aux[r, :n], out.aux_hidden[r, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(hidden[r, :n], out.hidden[r, :n], atol=1e-5, rtol=0)
        assert float(aux[r, n:].abs().sum()) == 0.0


def test_vocab_mismatch_is_caught_before_training(tmp_path, prepared_dir):
    """Data prepared for one tokenizer, a target with another: a clear error, no training."""
    other_tok = build_tokenizer(vocab_size=300, seed=99)
    folder = tmp_path / "other-target"
    save_random_target(folder, tiny_llama_config(len(other_tok)), other_tok)
    with pytest.raises(TrainingError, match=r"prepared with a tokenizer of 400 tokens.*has 300"):
        train(train_config(folder, prepared_dir, tmp_path / "run", "train.max_steps=1"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_target_with_padded_vocab_trains(tmp_path, tokenizer, sharegpt_json):
    from specheads.data.prepare import PrepareOptions, prepare

    folder = tmp_path / "padded"
    save_random_target(folder, tiny_llama_config(len(tokenizer) + 16), tokenizer)  # 416 rows for 400 tokens
    prepare(PrepareOptions(target=str(folder), data=str(sharegpt_json), output=str(tmp_path / "data"),
                           max_length=64, draft_vocab_size=DRAFT_VOCAB))
    summary = train(train_config(folder, tmp_path / "data", tmp_path / "run", "train.max_steps=1"))
    assert summary["steps"] == 1


def test_grad_accum_and_layer_ids(tmp_path, tiny_target_dir, prepared_dir):
    import json

    train(train_config(tiny_target_dir, prepared_dir, tmp_path, "train.max_steps=2", "train.grad_accum=2",
                       "target.layer_ids=[0, 2, 7]", "train.batch_size=2"))
    cfg = json.loads((tmp_path / "final" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 7]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 8]
    rows = train_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]


def test_epoch_batches_are_deterministic_and_cover_the_data():
    from specheads.training.data import epoch_batches

    lengths = [5, 9, 3, 7, 7, 1, 8, 2, 6, 4]
    a = epoch_batches(lengths, 3, seed=1, epoch=0)
    assert a == epoch_batches(lengths, 3, seed=1, epoch=0)
    assert a != epoch_batches(lengths, 3, seed=1, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(10))
    r0 = epoch_batches(lengths, 2, seed=1, epoch=0, rank=0, world=2)
    r1 = epoch_batches(lengths, 2, seed=1, epoch=0, rank=1, world=2)
    assert len(r0) == len(r1)
    assert not set(i for b in r0 for i in b) & set(i for b in r1 for i in b)


def test_an_optimizer_step_takes_the_same_batches_on_any_number_of_ranks():
    """world x grad_accum micro-batches a step: 1 x 4, 2 x 2 and 4 x 1 give each step the same
    batches (rank r's micro-batch a of step s is the epoch's batch (s * accum + a) * world + r)."""
    from specheads.training.data import epoch_batches

    lengths = [(7 * i) % 13 + 1 for i in range(75)]  # 25 batches of 3: six whole steps of 4, one dropped

    def steps(world, accum):
        ranks = [epoch_batches(lengths, 3, seed=4, epoch=1, rank=r, world=world, per_step=world * accum)
                 for r in range(world)]
        n = len(ranks[0]) // accum
        return [sorted(sorted(ranks[r][s * accum + a]) for r in range(world) for a in range(accum)) for s in range(n)]

    one = steps(1, 4)
    assert len(one) == 6 and steps(2, 2) == one and steps(4, 1) == one
    with pytest.raises(ValueError, match="per_step"):
        epoch_batches(lengths, 3, seed=4, epoch=0, rank=0, world=2, per_step=3)


def test_global_batch_size_sets_the_accumulation(tmp_path, tiny_target_dir, prepared_dir):
    from specheads.training.trainer import Trainer

    cfg = train_config(tiny_target_dir, prepared_dir, tmp_path / "a", "train.batch_size=2", "train.global_batch_size=8")
    trainer = Trainer(cfg)
    trainer.resolve_global_batch()
    assert trainer.cfg.train.grad_accum == 4
    bad = Trainer(train_config(tiny_target_dir, prepared_dir, tmp_path / "b", "train.batch_size=3",
                               "train.global_batch_size=8"))
    with pytest.raises(TrainingError, match=r"global_batch_size=8 is not a multiple of train.batch_size x processes = 3 x 1"):
        bad.resolve_global_batch()
    clash = Trainer(train_config(tiny_target_dir, prepared_dir, tmp_path / "c", "train.batch_size=2",
                                 "train.grad_accum=2", "train.global_batch_size=8"))
    with pytest.raises(TrainingError, match="disagree"):
        clash.resolve_global_batch()


def test_collate_right_pads_with_zero_mask():
    from specheads.training.data import collate

    ids, mask = collate([torch.tensor([5, 6, 7]), torch.tensor([8])], [torch.tensor([0, 1, 1]), torch.tensor([1])])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[0, 1, 1], [1, 0, 0]]


def test_load_prepared_errors(tmp_path, prepared_dir):
    from specheads.training.data import PreparedDataError, load_prepared

    with pytest.raises(PreparedDataError, match="does not exist"):
        load_prepared(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreparedDataError, match="vocab_map.safetensors"):
        load_prepared(tmp_path / "empty")
    data = load_prepared(prepared_dir, max_length=20)
    assert max(len(x) for x in data.train_ids) == 20
    assert data.d2t.numel() == DRAFT_VOCAB


def test_wandb_offline_logging(tmp_path, tiny_target_dir, small_prepared_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=2", "train.report_to=wandb",
                       "train.ttt_steps=1")
    train(cfg)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, "wandb wrote no offline run"
    assert any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_resume_refuses_checkpoint_of_another_head(tmp_path, tiny_target_dir, small_prepared_dir):
    run = tmp_path / "run"
    train(train_config(tiny_target_dir, small_prepared_dir, run, "train.max_steps=2", "train.save_every=1",
                       "train.ttt_steps=1"))
    shutil.rmtree(run / "checkpoints" / "step_2")
    with pytest.raises(TrainingError, match=r"another head/target.*target_layer_ids"):
        train(train_config(tiny_target_dir, small_prepared_dir, run, "train.max_steps=3", "train.save_every=1",
                           "train.ttt_steps=1", "target.layer_ids=[0,1,2]"))


def test_eval_of_a_saved_head_reproduces_the_runs_final_evaluation(tmp_path, tiny_target_dir, prepared_dir,
                                                                   capsys):
    """`specheads eval` on the exported head (float32) gives the held-out figures the run ended with."""
    import json

    from specheads.cli import main
    from specheads.training.trainer import evaluate_head

    cfg = train_config(tiny_target_dir, prepared_dir, tmp_path, "train.max_steps=30", "train.lr=3e-3")
    summary = train(cfg)
    assert summary["eval/acc"][0] > 0  # a head that has learned something, so the figures mean something
    got = evaluate_head(str(tmp_path / "final"), str(prepared_dir), str(tiny_target_dir), rows=4, batch_size=4,
                        ttt_steps=2)
    for key in ("eval/acc", "eval/chain_acc", "eval/loss"):
        assert got[key] == pytest.approx(summary[key], abs=2e-4), key
    for key in ("eval/accept_length", "eval/accept_length_opening", "eval/positions", "eval/positions_opening"):
        assert got[key] == pytest.approx(summary[key], abs=1e-3), key
    capsys.readouterr()
    assert main(["eval", "--draft", str(tmp_path / "final"), "--data", str(prepared_dir), "--target",
                 str(tiny_target_dir), "--rows", "4", "--ttt-steps", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval/positions"] == summary["eval/positions"]  # stdout: the JSON alone
    # a head for another target does not load against this one
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "final", other)
    meta = json.loads((other / "specheads.json").read_text())
    meta["config"]["hidden_size"] *= 2
    (other / "specheads.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="hidden|shape|size"):
        evaluate_head(str(other), str(prepared_dir), str(tiny_target_dir), rows=4)


def test_init_from_a_saved_head_continues_it(tmp_path, tiny_target_dir, small_prepared_dir, capsys):
    """train.init_from starts from a saved head's weights and vocab map; conflicting options and
    missing heads are refused before any training."""
    first = tmp_path / "first"
    train(train_config(tiny_target_dir, small_prepared_dir, first, "train.max_steps=20", "train.lr=3e-3",
                       "train.ttt_steps=2"))
    fresh_loss = train_records(first / "metrics.jsonl")[0]["loss"]
    capsys.readouterr()
    second = tmp_path / "second"
    train(train_config(tiny_target_dir, small_prepared_dir, second, "train.max_steps=2", "train.lr=1e-9",
                       "train.ttt_steps=2", f"train.init_from={first / 'final'}"))
    assert "starting from head" in capsys.readouterr().out
    # a learning rate of 1e-9 leaves the weights where they started
    a, b = final_state(first), final_state(second)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    assert train_records(second / "metrics.jsonl")[0]["loss"] < 0.8 * fresh_loss
    with pytest.raises(TrainingError, match=r"init_from.*head.intermediate_size=64, the head has"):
        train(train_config(tiny_target_dir, small_prepared_dir, tmp_path / "third", "train.max_steps=1",
                           f"train.init_from={first / 'final'}", "head.intermediate_size=64"))
    with pytest.raises(TrainingError, match=r"train.init_from .*nowhere.*neither an existing folder"):
        train(train_config(tiny_target_dir, small_prepared_dir, tmp_path / "fourth", "train.max_steps=1",
                           f"train.init_from={tmp_path / 'nowhere'}"))


# ------------------------------------------------------------------ non-finite steps
def _nan_loss_at(monkeypatch, step: int) -> None:
    """The training loss (and so the gradients) of optimizer step `step` becomes NaN."""
    import dataclasses

    from specheads.training import trainer as trainer_module

    real_head_kind, calls = trainer_module.head_kind, []

    def head_kind(name):  # the run's kind, with its loss wrapped
        kind = real_head_kind(name)

        def loss(*args, **kwargs):
            stats = kind.loss(*args, **kwargs)
            if torch.is_grad_enabled():  # training, not evaluation
                calls.append(1)
                if len(calls) == step:
                    stats = dataclasses.replace(stats, loss=stats.loss * float("nan"))
            return stats

        return dataclasses.replace(kind, loss=loss)

    monkeypatch.setattr(trainer_module, "head_kind", head_kind)


def test_a_nan_weight_mid_run_stops_the_cli_with_an_error_and_no_head(tmp_path, tiny_target_dir, small_prepared_dir,
                                                                    monkeypatch, capsys):
    """A weight turned NaN before step 3: the CLI exits 2 naming step 3 and the last intact checkpoint;
    no final head, and no checkpoint of the NaN weights."""
    from specheads.cli import main
    from specheads.training.trainer import Trainer
    from tests.helpers import BASE_OVERRIDES

    real_step, calls = Trainer.micro_step, []

    def poisoned(self, indices):
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                self.head.fc.weight[0, 0] = float("nan")
        return real_step(self, indices)

    monkeypatch.setattr(Trainer, "micro_step", poisoned)
    run = tmp_path / "run"
    args = ["train", "--target", str(tiny_target_dir), "--data", str(small_prepared_dir), "--output-dir", str(run),
            "--max-steps", "5"]
    for o in [*BASE_OVERRIDES, "train.save_every=1", "train.ttt_steps=1", "train.keep_checkpoints=5"]:
        args += ["--set", o]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: step 3/5: the loss or the gradient norm is not finite" in err
    assert f"the last intact checkpoint is {run / 'checkpoints' / 'step_2'}" in err
    assert "skip_nonfinite" in err and "Traceback" not in err
    assert not (run / "final").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]
    assert [r["step"] for r in train_records(run / "metrics.jsonl")] == [1, 2]


def test_nonfinite_loss_is_an_error_by_default(tmp_path, tiny_target_dir, small_prepared_dir, monkeypatch):
    _nan_loss_at(monkeypatch, 2)
    with pytest.raises(TrainingError, match=r"step 2/4: the loss or the gradient norm is not finite .*loss \[nan\]"):
        train(train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=4", "train.ttt_steps=1"))
    assert not (tmp_path / "final").exists()


def test_skip_nonfinite_skips_the_update_and_counts_it(tmp_path, tiny_target_dir, small_prepared_dir, monkeypatch,
                                                       capsys):
    from specheads.heads.format import load_head

    _nan_loss_at(monkeypatch, 2)
    summary = train(train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=4",
                                 "train.ttt_steps=1", "train.save_every=1", "train.keep_checkpoints=4",
                                 "train.skip_nonfinite=true"))
    assert "step 2/4" in capsys.readouterr().err
    assert summary["nonfinite_steps_skipped"] == 1
    assert json.loads((tmp_path / "train_summary.json").read_text())["nonfinite_steps_skipped"] == 1
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert {"step": 2, "nonfinite_step_skipped": True, "nonfinite_steps_skipped": 1} in records
    losses = {r["step"]: r["loss"] for r in train_records(tmp_path / "metrics.jsonl")}
    assert sorted(losses) == [1, 3, 4] and all(math.isfinite(x) for x in losses.values())
    # step 2 changed nothing: weights, optimizer moments and schedule as after step 1
    s1, s2, s3 = (torch.load(tmp_path / "checkpoints" / f"step_{n}" / "state.pt", weights_only=True) for n in (1, 2, 3))
    for k in s1["head"]:
        torch.testing.assert_close(s2["head"][k], s1["head"][k], rtol=0, atol=0, msg=k)
    assert not torch.equal(s3["head"]["fc.weight"], s2["head"]["fc.weight"])  # step 3 did update
    for k in ("exp_avg", "exp_avg_sq", "step"):
        torch.testing.assert_close(s2["optimizer"]["state"][0][k], s1["optimizer"]["state"][0][k], rtol=0, atol=0)
    assert s2["scheduler"]["last_epoch"] == s1["scheduler"]["last_epoch"]
    assert s2["nonfinite_steps_skipped"] == 1
    load_head(tmp_path / "final")  # finite: it loads


def test_final_head_that_overflows_the_export_dtype_is_not_saved(tmp_path, tiny_target_dir, small_prepared_dir,
                                                                 monkeypatch):
    """A weight finite in float32 but Inf in float16 (> 65504): no final head, no final checkpoint."""
    from specheads.training.trainer import Trainer

    real_loop = Trainer._loop

    def loop_then_blow_up(self, *args):
        stopped = real_loop(self, *args)
        with torch.no_grad():
            self.head.norm.weight[0] = 1e6
        return stopped

    monkeypatch.setattr(Trainer, "_loop", loop_then_blow_up)
    with pytest.raises(TrainingError, match=r"not saving the final head .*\['norm.weight'\] hold NaN/Inf in float16"):
        train(train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=2", "train.ttt_steps=1",
                           "train.export_dtype=float16"))
    assert not (tmp_path / "final").exists()
    assert not (tmp_path / "checkpoints" / "step_2").exists()


def test_a_two_layer_eagle3_head_trains_and_saves_both_layers(tmp_path, tiny_target_dir, small_prepared_dir):
    cfg = train_config(tiny_target_dir, small_prepared_dir, tmp_path, "train.max_steps=12", "train.lr=3e-3",
                       "train.ttt_steps=2", "head.num_layers=2")
    train(cfg)
    rows = train_records(tmp_path / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"]
    meta = json.loads((tmp_path / "final" / "specheads.json").read_text())
    assert meta["config"]["num_layers"] == 2
    assert any(k.startswith("layers.1.") for k in final_state(tmp_path))
    # fine-tuning it keeps its shape; asking for another one is refused
    with pytest.raises(TrainingError, match=r"head.num_layers=1, the head has 2"):
        train(train_config(tiny_target_dir, small_prepared_dir, tmp_path / "again", "train.max_steps=1",
                           f"train.init_from={tmp_path / 'final'}", "head.num_layers=1"))
