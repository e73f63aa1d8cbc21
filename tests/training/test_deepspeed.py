"""Two CPU processes under the `deepspeed` launcher, ZeRO-1 and ZeRO-2 (gloo backend)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import BASE_OVERRIDES, free_port, train_config, train_records

REPO = Path(__file__).resolve().parents[2]
DEEPSPEED = Path(sys.executable).parent / "deepspeed"
SHM = Path("/dev/shm")
OVERRIDES = [o for o in BASE_OVERRIDES if not o.startswith("train.batch_size")] + [
    "train.batch_size=2", "train.ttt_steps=2", "data.max_length=64",
]

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.skipif(not DEEPSPEED.is_file(), reason="deepspeed is not installed in this environment"),
]


def _shm_buffers(port: int) -> set[Path]:
    return set(SHM.glob(f"deepspeed_allreduce_buffer_*_{port}_*")) if SHM.is_dir() else set()


@pytest.mark.parametrize("ds_config", ["configs/ds_zero1.json", "configs/ds_zero2.json"], ids=["zero1", "zero2"])
def test_deepspeed_two_processes(tmp_path, tiny_target_dir, prepared_dir, ds_config):
    port = free_port()
    out = tmp_path / "run"
    cmd = [
        str(DEEPSPEED), "--num_gpus", "2", "--master_port", str(port), "train/train.py",
        "--target", str(tiny_target_dir), "--data", str(prepared_dir), "--output-dir", str(out),
        "--max-steps", "2", "--deepspeed", ds_config,
    ]
    for o in OVERRIDES:
        cmd += ["--set", o]
    env = dict(os.environ)
    env.update(
        DS_ACCELERATOR="cpu",
        # the shared-memory comm op is compiled once and kept across runs
        TORCH_EXTENSIONS_DIR=str(Path.home() / ".cache" / "specheads-torch-ext"),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
    )
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    finally:
        for f in _shm_buffers(port):
            f.unlink(missing_ok=True)
    log = proc.stdout[-4000:] + "\n" + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert "DeepSpeed " + ds_config in proc.stdout
    assert "2 procs" in proc.stdout
    assert (out / "final" / "model.safetensors").is_file(), log
    rows = train_records(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    ckpt = out / "checkpoints" / "step_2"
    assert (ckpt / "done").read_text() == "2"
    assert any(ckpt.iterdir())
    # the logged step-1 record averages the loss over the ranks and sums their rows; each rank's
    # first batch is fixed by (seed, epoch, rank, world) and the head starts from the same seed,
    # so a single process reproduces both ranks' numbers
    from specheads.training.data import epoch_batches
    from specheads.training.trainer import Trainer

    trainer = Trainer(train_config(tiny_target_dir, prepared_dir, tmp_path / "plain", *OVERRIDES))
    trainer.setup()
    lengths = [len(x) for x in trainer.data.train_ids]
    losses, n_rows = [], 0
    for rank in range(2):
        stats, _ = trainer.micro_step(epoch_batches(lengths, 2, trainer.cfg.train.seed, 0, rank, 2)[0])
        losses.append(float(stats.loss.detach()))
        n_rows += stats.rows
    assert rows[0]["loss"] == pytest.approx(sum(losses) / 2, abs=1e-4)
    assert rows[0]["rows"] == n_rows
    assert not _shm_buffers(port)
