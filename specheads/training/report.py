"""Metrics: JSON lines on disk, optional wandb, and a PNG of the curves at the end."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    def __init__(self, out: Path, cfg, enabled: bool, resumed: bool):
        self.enabled = enabled
        self.out = Path(out)
        self.path = self.out / "metrics.jsonl"
        self.wandb = None
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        if not resumed and self.path.exists():
            self.path.unlink()
        if cfg.train.report_to == "wandb":
            import wandb

            self.wandb = wandb.init(project=cfg.train.wandb_project, config=cfg.model_dump(), dir=str(self.out),
                                    resume="allow")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            flat = {}
            for k, v in record.items():
                if isinstance(v, list):
                    flat.update({f"{k}/{i}": x for i, x in enumerate(v)})
                elif k != "step":
                    flat[k] = v
            self.wandb.log(flat, step=record["step"])

    def finish(self, summary: dict) -> None:
        if not self.enabled:
            return
        (self.out / "train_summary.json").write_text(json.dumps(summary, indent=2))
        plot_metrics(self.path, self.out / "train_curves.png")
        if self.wandb is not None:
            self.wandb.summary.update({k: v for k, v in summary.items() if not isinstance(v, list)})
            self.wandb.finish()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path: Path, png: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval/acc" in r]
    if not train:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train])
    axes[0].set_xlabel("optimizer step")
    axes[0].set_ylabel("weighted TTT loss")
    axes[0].set_title("training loss")
    n_steps = len(train[-1]["acc"])
    for k in range(n_steps):
        axes[1].plot([r["step"] for r in train], [r["acc"][k] for r in train], label=f"step {k}", alpha=0.8)
    if evals:
        last = evals[-1]
        axes[1].set_title(f"train top-1 acc per draft step (eval accept len {last['eval/accept_length']:.2f})")
    else:
        axes[1].set_title("train top-1 acc per draft step")
    axes[1].set_xlabel("optimizer step")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
