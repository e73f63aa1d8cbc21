"""Two CPU processes under the `deepspeed` launcher, ZeRO-1 and ZeRO-2 (gloo backend)."""

from __future__ import annotations

import json
import os
import shutil
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


def _launch(script, out, target_dir, data_dir, *overrides, ds_config="configs/ds_zero2.json", max_steps=2,
            timeout=900, procs=2):
    """`deepspeed --num_gpus <procs> <script>` on CPU; returns (completed process, stdout + stderr tail)."""
    port = free_port()
    cmd = [
        str(DEEPSPEED), "--num_gpus", str(procs), "--master_port", str(port), str(script),
        "--target", str(target_dir), "--data", str(data_dir), "--output-dir", str(out),
        "--max-steps", str(max_steps), "--deepspeed", ds_config,
    ]
    for o in [*OVERRIDES, *overrides]:
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
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        for f in _shm_buffers(port):
            f.unlink(missing_ok=True)
    assert not _shm_buffers(port)
    return proc, proc.stdout[-4000:] + "\n" + proc.stderr[-4000:]


# an MTP head of 2 modules, unrolled for 3 steps: its records hold one entry per module on every rank
MTP = ("head.kind=mtp", "head.num_modules=2", "train.ttt_steps=3")


# ZeRO-2 with the EAGLE-3 head: test_a_global_batch_trains_alike_on_one_and_two_processes
@pytest.mark.parametrize("ds_config, head, steps", [("configs/ds_zero1.json", (), 2), ("configs/ds_zero2.json", MTP, 30)],
                         ids=["zero1", "zero2-mtp"])
def test_deepspeed_two_processes(tmp_path, tiny_target_dir, prepared_dir, ds_config, head, steps):
    out = tmp_path / "run"
    proc, log = _launch("train/train.py", out, tiny_target_dir, prepared_dir, *head, ds_config=ds_config,
                        max_steps=steps)
    assert proc.returncode == 0, log
    assert "DeepSpeed " + ds_config in proc.stdout
    assert "2 procs" in proc.stdout
    assert (out / "final" / "model.safetensors").is_file(), log
    rows = train_records(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    if head:  # the MTP head learns under ZeRO-2 as alone (30 steps, as the CPU tests train every kind)
        assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
        from specheads.heads.format import load_head
        from specheads.heads.mtp import MTPHead

        assert isinstance(load_head(out / "final"), MTPHead)
        assert load_head(out / "final").config.num_modules == 2
        assert all(len(r["acc"]) == 2 for r in rows)
        assert len(json.loads((out / "train_summary.json").read_text())["eval/acc"]) == 2
    ckpt = out / "checkpoints" / f"step_{steps}"
    assert (ckpt / "done").read_text() == str(steps)
    assert any(ckpt.iterdir())
    # the logged step-1 record averages the loss over the ranks and sums their rows; each rank's
    # first batch is fixed by (seed, epoch, rank, world) and the head starts from the same seed,
    # so a single process reproduces both ranks' numbers
    from specheads.training.data import epoch_batches
    from specheads.training.trainer import Trainer

    trainer = Trainer(train_config(tiny_target_dir, prepared_dir, tmp_path / "plain", *OVERRIDES, *head))
    trainer.setup()
    lengths = [len(x) for x in trainer.data.train_ids]
    losses, n_rows = [], 0
    for rank in range(2):
        stats, _ = trainer.micro_step(epoch_batches(lengths, 2, trainer.cfg.train.seed, 0, rank, 2)[0])
        losses.append(float(stats.loss.detach()))
        n_rows += stats.rows
    assert rows[0]["loss"] == pytest.approx(sum(losses) / 2, abs=1e-4)
    assert rows[0]["rows"] == n_rows


def test_a_global_batch_trains_alike_on_one_and_two_processes(tmp_path, tiny_target_dir, prepared_dir):
    """train.global_batch_size fixes the global batch: 1 process accumulating 2 micro-batches and
    2 processes taking one each (ZeRO-2) see the same batches each step, follow the same
    schedule and log the same losses (within 1e-3 relative; only the sums' order differs)."""
    fixed = ("train.global_batch_size=4", "train.max_grad_norm=100", "train.warmup_ratio=0.3")
    runs = {}
    for procs in (1, 2):
        out = tmp_path / f"p{procs}"
        proc, log = _launch("train/train.py", out, tiny_target_dir, prepared_dir, *fixed, max_steps=6, procs=procs)
        assert proc.returncode == 0, log
        assert f"x {3 - procs} accum x {procs} procs x batch 2" in proc.stdout, log
        runs[procs] = train_records(out / "metrics.jsonl")
    one, two = runs[1], runs[2]
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    for a, b in zip(one, two):
        assert a["rows"] == b["rows"]  # the same rows (the unroll's, over every process)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-9)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a["step"], a["loss"], b["loss"])


def test_two_nodes_under_torchrun(tmp_path, tiny_target_dir, prepared_dir):
    """A two-"node" launch on one machine: two `torchrun --nnodes 2 --node_rank i` agents of one
    process each, meeting at 127.0.0.1 (gloo, ZeRO-2), train what one process does with the same
    global batch (the deepspeed launcher's multi-node mode needs ssh to each host; torchrun's
    needs only the address)."""
    fixed = ("train.global_batch_size=4", "train.max_grad_norm=100", "train.warmup_ratio=0.3")
    port = free_port()
    env = dict(os.environ)
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=str(Path.home() / ".cache" / "specheads-torch-ext"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    out = tmp_path / "two_nodes"
    args = ["train/train.py", "--target", str(tiny_target_dir), "--data", str(prepared_dir), "--output-dir", str(out),
            "--max-steps", "4", "--deepspeed", "configs/ds_zero2.json"]
    for o in [*OVERRIDES, *fixed]:
        args += ["--set", o]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i),
                                "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                                *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for i in range(2)]
    logs = []
    try:
        for agent in agents:
            logs.append(agent.communicate(timeout=600)[0])
    finally:
        for agent in agents:
            agent.kill()
        for f in _shm_buffers(port):
            f.unlink(missing_ok=True)
    assert [a.returncode for a in agents] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "x 1 accum x 2 procs x batch 2" in logs[0]
    two = train_records(out / "metrics.jsonl")
    solo_out = tmp_path / "one"
    proc, log = _launch("train/train.py", solo_out, tiny_target_dir, prepared_dir, *fixed, max_steps=4, procs=1)
    assert proc.returncode == 0, log
    one = train_records(solo_out / "metrics.jsonl")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert a["rows"] == b["rows"] and a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)


def _nan_on_rank_1(tmp_path, step: int) -> Path:
    """train/train.py, except that rank 1's loss (and so every rank's reduced gradient) is NaN at `step`."""
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(f"""
import dataclasses, os, sys
import torch
from specheads.training import trainer

real_head_kind, calls = trainer.head_kind, []

def head_kind(name):
    kind = real_head_kind(name)

    def loss(*args, **kwargs):
        stats = kind.loss(*args, **kwargs)
        if torch.is_grad_enabled():
            calls.append(1)
            if len(calls) == {step} and os.environ["RANK"] == "1":
                stats = dataclasses.replace(stats, loss=stats.loss * float("nan"))
        return stats

    return dataclasses.replace(kind, loss=loss)

trainer.head_kind = head_kind
from specheads.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
""")
    return script


def test_deepspeed_nan_on_one_rank_stops_every_rank(tmp_path, tiny_target_dir, prepared_dir):
    """Only rank 1 sees the NaN: both ranks agree to stop with the error (exit 2), none hangs, no head."""
    out = tmp_path / "run"
    proc, log = _launch(_nan_on_rank_1(tmp_path, 2), out, tiny_target_dir, prepared_dir, max_steps=3, timeout=300)
    assert proc.returncode != 0, log
    # each rank prints the error, rank 0 included though its own loss was finite
    assert proc.stderr.count("error: step 2/3: the loss or the gradient norm is not finite on rank [1]") == 2, log
    assert not (out / "final").exists()


def test_deepspeed_skip_nonfinite_checksums_and_fallback(tmp_path, tiny_target_dir, prepared_dir):
    """Under DeepSpeed: a skipped NaN step is counted; the manifest covers every rank's files, which load
    with weights_only=True and DeepSpeed's allowlist; a damaged optimizer shard makes the resume fall
    back to the previous checkpoint (and the skip count survives the resume)."""
    import json

    import torch

    from specheads.training.checkpoints import MANIFEST, checkpoint_problem, deepspeed_safe_globals

    out = tmp_path / "run"
    ckpt_args = ("train.save_every=1", "train.keep_checkpoints=3")
    proc, log = _launch(_nan_on_rank_1(tmp_path, 2), out, tiny_target_dir, prepared_dir, *ckpt_args,
                        "train.skip_nonfinite=true", max_steps=3, timeout=300)
    assert proc.returncode == 0, log
    assert "step 2/3: the loss or the gradient norm is not finite on rank [1]" in proc.stderr
    assert json.loads((out / "train_summary.json").read_text())["nonfinite_steps_skipped"] == 1
    assert [r["step"] for r in train_records(out / "metrics.jsonl")] == [1, 3]
    step_3 = out / "checkpoints" / "step_3"
    listed = json.loads((step_3 / MANIFEST).read_text())["files"]
    assert sorted(listed) == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                              "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert checkpoint_problem(step_3, deepspeed_safe_globals()) is None
    shard = step_3 / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with torch.serialization.safe_globals(deepspeed_safe_globals()):
        assert torch.load(shard, weights_only=True)["optimizer_state_dict"]["partition_count"] == [2]
    with pytest.raises(Exception, match="weights_only"):  # the allowlist is what makes it load
        torch.load(shard, weights_only=True)
    # a kill after step 3's checkpoint, whose rank-1 optimizer shard then lost 4 KB
    shutil.rmtree(out / "final")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)
    shard.write_bytes(bytes(data))
    proc, log = _launch("train/train.py", out, tiny_target_dir, prepared_dir, *ckpt_args,
                        "train.skip_nonfinite=true", max_steps=4, timeout=300)
    assert proc.returncode == 0, log
    assert (f"checkpoint {step_3} is not intact: file zero_pp_rank_1_mp_rank_00_optim_states.pt does not match "
            "its sha256") in proc.stderr, log
    assert f"resumed from {out / 'checkpoints' / 'step_2'} at step 2" in proc.stdout, log
    assert json.loads((out / "train_summary.json").read_text())["nonfinite_steps_skipped"] == 1
    assert (out / "final" / "model.safetensors").is_file()
