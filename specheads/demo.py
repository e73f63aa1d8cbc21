"""`specheads demo`: prepare + train on the embedded default (SmolLM2-135M-Instruct, ShareGPT).

On CPU a brief run: the run config `configs/demo.yaml` on a few hundred conversations as they are;
on a GPU the full recipe: the target answers every conversation itself, then
`configs/smollm2-135m-eagle3.yaml`.
A run that already finished is not trained again: the demo says where its head is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specheads.config import RunConfig, load_config
from specheads.data.prepare import REPORT_FILE, PrepareOptions

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEMO_CONFIG = CONFIGS / "demo.yaml"
GPU_CONFIG = CONFIGS / "smollm2-135m-eagle3.yaml"
SUMMARY_FILE = "train_summary.json"  # written by a run that finished (training.report.MetricsLog.finish)
# the CPU demo's data: the first 400 conversations of the embedded ShareGPT sample; 94 are skipped
# (86 have no answer within 256 tokens), and a hash of the id holds out 20% of the rest: 59 held out,
# 255 to train on (held-out figures need a few dozen conversations to mean anything)
CPU_CONVERSATIONS = 400
CPU_EVAL_FRACTION = 0.2
CPU_DRAFT_VOCAB = 8192  # a smaller lm_head than the full recipe's 32000: minutes on 2 cores


@dataclass
class DemoPlan:
    prepare: PrepareOptions
    run: RunConfig


def cpu_plan(path: str | Path | None = None, conversations: int | None = None, steps: int | None = None) -> DemoPlan:
    """The CPU demo: the run config `path` (default configs/demo.yaml) and the data it trains on.
    `conversations` and `steps` override the conversations read and train.max_steps."""
    cfg = load_config(path or DEMO_CONFIG, None, **{"train.max_steps": steps})
    opts = PrepareOptions(output=cfg.data.path, max_length=cfg.data.max_length or PrepareOptions.max_length,
                          limit=conversations or CPU_CONVERSATIONS, eval_fraction=CPU_EVAL_FRACTION,
                          draft_vocab_size=CPU_DRAFT_VOCAB)
    return DemoPlan(opts, cfg)


def gpu_plan() -> DemoPlan:
    """The full recipe: every conversation of the config's sources (ShareGPT and the packaged code
    prompts), answered by the target itself (first turn), batched on all GPUs."""
    cfg = load_config(GPU_CONFIG if GPU_CONFIG.is_file() else None, ["train.deepspeed=null"],
                      **{"data.path": "prepared/demo-gpu", "output_dir": "runs/demo-gpu"})
    opts = PrepareOptions(output=cfg.data.path, max_length=2048, regenerate=True, regen_batch_size=512,
                          regen_max_turns=1, devices="all", sources=cfg.data.source_dicts(), mix_seed=cfg.data.mix_seed)
    return DemoPlan(opts, cfg)


def finished_run(output_dir: str | Path) -> dict | None:
    """The saved summary of the run in `output_dir` if it finished (final head and summary written), else None."""
    out = Path(output_dir)
    if (out / "final" / "model.safetensors").is_file() and (out / SUMMARY_FILE).is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    return None


def complete_message(cfg: RunConfig, summary: dict) -> str:
    """What a second `specheads demo` says instead of resuming a run that has nothing left to do."""
    out = Path(cfg.output_dir)
    done = summary.get("steps")
    lines = [f"the demo run in {out} is complete ({done} steps): its head is {out / 'final'}, its figures "
             f"{out / SUMMARY_FILE}"]
    if cfg.train.max_steps is not None and done is not None and cfg.train.max_steps != done:
        lines.append(f"it ran {done} steps, not the {cfg.train.max_steps} asked for: add --fresh to train anew")
    else:
        lines.append("to redo data and training from scratch: specheads demo --fresh")
    return "\n".join(lines)


def held_out_count(plan: DemoPlan) -> int | None:
    """Held-out conversations the run's figures are computed on (None where the data has no report)."""
    report = Path(plan.run.data.path) / REPORT_FILE
    if not report.is_file():
        return None
    return min(json.loads(report.read_text())["conversations"]["eval"], plan.run.data.eval_max_rows)
