"""Checkpoint integrity: the checksum manifest, falling back past a damaged checkpoint on resume,
and state files that load with weights_only=True."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch

from specheads.training.checkpoints import MANIFEST, checkpoint_problem, sha256_file, write_manifest
from specheads.training.trainer import train
from tests.helpers import read_jsonl, train_config, train_records

ARGS = ("train.max_steps=4", "train.save_every=1", "train.keep_checkpoints=4", "train.batch_size=3")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_target_dir, prepared_dir):
    """A 4-step run with a checkpoint after every step (step_1..step_4) and its final head."""
    run = tmp_path_factory.mktemp("straight") / "run"
    train(train_config(tiny_target_dir, prepared_dir, run, *ARGS))
    return run


def _killed_after_step_3(straight_run, dest):
    """The run as a kill right after step 3's checkpoint leaves it: no step_4, no final head."""
    shutil.copytree(straight_run, dest)
    shutil.rmtree(dest / "checkpoints" / "step_4")
    shutil.rmtree(dest / "final")
    return dest


def _resume(run, tiny_target_dir, prepared_dir, capsys):
    """Runs the same command again; returns (stdout, stderr, the per-step records it appended)."""
    n_before = len(read_jsonl(run / "metrics.jsonl"))
    capsys.readouterr()
    train(train_config(tiny_target_dir, prepared_dir, run, *ARGS))
    out, err = capsys.readouterr()
    appended = [r for r in read_jsonl(run / "metrics.jsonl")[n_before:] if "loss" in r]
    return out, err, appended


def _final_state(run):
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def test_every_checkpoint_file_is_in_the_manifest_and_state_loads_weights_only(straight_run):
    for n in (1, 2, 3, 4):
        folder = straight_run / "checkpoints" / f"step_{n}"
        files = json.loads((folder / MANIFEST).read_text())["files"]
        assert sorted(files) == ["state.pt"]  # every file but the manifest and the done marker
        assert sorted(p.name for p in folder.iterdir()) == ["checksums.json", "done", "state.pt"]
        assert files["state.pt"] == {"sha256": sha256_file(folder / "state.pt"),
                                     "size": (folder / "state.pt").stat().st_size}
        assert checkpoint_problem(folder) is None
        state = torch.load(folder / "state.pt", weights_only=True)
        assert state["step"] == n and state["nonfinite_steps_skipped"] == 0
        assert state["rng"].dtype == torch.uint8 and "fc.weight" in state["head"]
    assert not list((straight_run / "checkpoints").glob(".*"))  # no temp folder or manifest left behind


def test_resume_falls_back_past_a_checkpoint_with_4kb_overwritten(tmp_path, straight_run, tiny_target_dir,
                                                                 prepared_dir, capsys):
    run = _killed_after_step_3(straight_run, tmp_path / "run")
    state = run / "checkpoints" / "step_3" / "state.pt"
    data = bytearray(state.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = torch.randn(1024, generator=torch.Generator().manual_seed(0)).numpy().tobytes()
    state.write_bytes(bytes(data))  # same size: only the checksum can tell
    # the reference: the same run resumed from the intact step_2 (step_3 never written)
    reference = _killed_after_step_3(straight_run, tmp_path / "reference")
    shutil.rmtree(reference / "checkpoints" / "step_3")

    out, err, appended = _resume(run, tiny_target_dir, prepared_dir, capsys)
    assert f"checkpoint {run / 'checkpoints' / 'step_3'} is not intact: file state.pt does not match its sha256" in err
    assert "falling back to the previous checkpoint" in err
    assert f"resumed from {run / 'checkpoints' / 'step_2'} at step 2" in out
    assert (run / "checkpoints" / "rejected_step_3" / "state.pt").is_file()  # kept for inspection
    ref_out, _, ref_appended = _resume(reference, tiny_target_dir, prepared_dir, capsys)
    assert "at step 2" in ref_out
    assert [r["step"] for r in appended] == [r["step"] for r in ref_appended] == [3, 4]
    for got, want in zip(appended, ref_appended):
        assert math.isfinite(got["loss"])
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    resumed, expected = _final_state(run), _final_state(reference)
    for k in expected:
        torch.testing.assert_close(resumed[k], expected[k], atol=1e-6, rtol=0, msg=k)


def test_resume_falls_back_past_a_truncated_checkpoint(tmp_path, straight_run, tiny_target_dir, prepared_dir, capsys):
    run = _killed_after_step_3(straight_run, tmp_path / "run")
    state = run / "checkpoints" / "step_3" / "state.pt"
    size = state.stat().st_size
    with open(state, "r+b") as f:
        f.truncate(size // 3)
    out, err, appended = _resume(run, tiny_target_dir, prepared_dir, capsys)
    assert f"step_3 is not intact: file state.pt has {size // 3} bytes, {MANIFEST} says {size}" in err
    assert "Traceback" not in out + err
    assert "at step 2" in out
    # resuming is exact, so steps 3 and 4 repeat those of the run that never stopped
    straight = {r["step"]: r["loss"] for r in train_records(straight_run / "metrics.jsonl")}
    assert [r["step"] for r in appended] == [3, 4]
    for r in appended:
        assert r["loss"] == pytest.approx(straight[r["step"]], abs=1e-4)


def test_no_intact_checkpoint_starts_over_with_a_warning(tmp_path, straight_run, tiny_target_dir, prepared_dir,
                                                         capsys):
    """A missing manifest (an older specheads, or a save cut short) or a missing file: no checkpoint to
    trust, so the run starts from step 0, and says so."""
    run = _killed_after_step_3(straight_run, tmp_path / "run")
    (run / "checkpoints" / "step_3" / MANIFEST).unlink()
    (run / "checkpoints" / "step_2" / "state.pt").unlink()
    (run / "checkpoints" / "step_1" / "extra.bin").write_bytes(b"x")
    capsys.readouterr()
    train(train_config(tiny_target_dir, prepared_dir, run, *ARGS))
    out, err = capsys.readouterr()
    assert f"step_3 is not intact: it has no {MANIFEST}" in err
    assert "step_2 is not intact: file state.pt is missing" in err
    assert f"step_1 is not intact: file extra.bin is not listed in {MANIFEST}" in err
    assert "no intact checkpoint left" in err and "starts again from step 0" in err
    assert "resumed" not in out
    assert [r["step"] for r in train_records(run / "metrics.jsonl")] == [1, 2, 3, 4]


class _RunsOnUnpickling:
    """An object whose unpickling calls open(path, "w"): what a weights_only=False load would run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_resume_never_unpickles_code(tmp_path, straight_run, tiny_target_dir, prepared_dir, capsys):
    """A state file that pickles a callable, with a manifest that matches it (written by someone who
    can write the folder): refused before loading, and the run falls back."""
    run = _killed_after_step_3(straight_run, tmp_path / "run")
    marker = tmp_path / "unpickled"
    folder = run / "checkpoints" / "step_3"
    state = torch.load(folder / "state.pt", weights_only=True)
    torch.save({**state, "extra": _RunsOnUnpickling(marker)}, folder / "state.pt")
    write_manifest(folder)
    out, err, _ = _resume(run, tiny_target_dir, prepared_dir, capsys)
    assert not marker.exists()
    refused = r"step_3 is not intact: file state.pt pickles \['(io|builtins).open'\], which a weights_only load refuses"
    assert re.search(refused, err)
    assert "at step 2" in out
