"""One typed run config: YAML file, then `--set a.b=value` overrides, validated up front.

Unknown keys are errors (a typo must not silently train with defaults).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TargetSection(_Strict):
    path: str | None = None  # HF folder, hub id, .gguf file; None = embedded SmolLM2-135M-Instruct
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    # outputs of these 0-based decoder layers feed the head; None = EAGLE's (1, L/2-1, L-4)
    layer_ids: list[int] | None = None


class DataSource(_Strict):
    """One source of a data mix (specheads.data.mix): sharegpt, chitchat, code-prompts, or jsonl with a path."""

    name: str = "sharegpt"
    ratio: float = Field(1.0, gt=0)  # the mix's ratios are normalised
    path: str | None = None  # jsonl sources: a local .json, .jsonl or .parquet file

    @model_validator(mode="after")
    def _known(self):
        from specheads.data.mix import SOURCES

        if self.name not in SOURCES:
            raise ValueError(f"unknown data source {self.name!r}; known: {', '.join(SOURCES)}")
        if (self.name == "jsonl") != (self.path is not None):
            raise ValueError("a jsonl source needs a path" if self.name == "jsonl" else
                             f"{self.name} is a packaged source and takes no path (use name: jsonl)")
        return self


class DataSection(_Strict):
    path: str = "prepared/smollm2"  # a folder written by `specheads prepare`
    # what `specheads prepare --config` draws conversations from, by ratio (the default: ShareGPT alone)
    sources: list[DataSource] = Field(default_factory=lambda: [DataSource()], min_length=1)
    mix_seed: int = 0  # which conversations a mix draws, and their order
    max_length: int | None = Field(None, ge=16)  # cut sequences at train time (None: as prepared)
    eval_max_rows: int = Field(256, ge=0)

    def source_dicts(self) -> list[dict]:
        """The sources as PrepareOptions.sources takes them."""
        return [s.model_dump(exclude_none=True) for s in self.sources]


class HeadSection(_Strict):
    kind: str = "eagle3"  # a registered head kind (specheads.heads.registry)
    intermediate_size: int | None = None  # None: the target's
    # shape options of the kinds that have them (None: the kind's default)
    num_modules: int | None = Field(None, ge=1, le=16)  # MTP: sequential modules
    num_heads: int | None = Field(None, ge=1, le=16)  # Medusa: heads, one a draft depth
    # EAGLE-3: draft decoder layers (default 1); Medusa: residual blocks a head
    num_layers: int | None = Field(None, ge=1, le=8)
    # Medusa: one vocabulary projection that every head reads out through (vLLM's original_lm_head),
    # where each head has its own by default
    shared_lm_head: bool | None = None
    # a new head's draft lm_head (and the norm before it) start as the target's rows instead of
    # random (None: the kind's default: yes for mtp, whose modules share the target's output head
    # in DeepSeek-V3, and medusa, whose heads Medusa initializes from the LM head; no for eagle3;
    # eagle heads read out through the target's lm_head itself)
    lm_head_from_target: bool | None = None
    # the draft lm_head (and Medusa's per-head ones) left as it starts, untrained (None: the kind's
    # default: yes for an MTP head over the target's whole vocabulary, whose lm_head is then the
    # target's own, frozen, as DeepSeek-V3's modules share the model's output head; no otherwise)
    freeze_lm_head: bool | None = None

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        from specheads.heads.registry import head_kinds  # loads the kinds' modules (torch): only when checked

        if kind not in head_kinds():
            raise ValueError(f"unknown head kind {kind!r}; known kinds: {', '.join(head_kinds())}")
        return kind

    @model_validator(mode="after")
    def _options_of_the_kind(self):
        given = {name: getattr(self, name) for name in SHAPE_OPTIONS if getattr(self, name) is not None}
        if not given:
            return self
        from specheads.heads.registry import head_kind, head_kinds  # torch: only where an option is set

        def has(kind: str, option: str) -> bool:
            config = head_kind(kind).config
            # a config that subclasses another kind's names its own options (MTP's and EAGLE-1's take
            # EAGLE-3's fields but not its head.num_layers)
            own = getattr(config, "SHAPE_OPTIONS", None)
            return option in (own if own is not None else getattr(config, "__dataclass_fields__", {}))

        for name, value in given.items():
            if not has(self.kind, name):
                takers = [k for k in head_kinds() if has(k, name)]
                raise ValueError(f"head.{name}={value} does not apply to {self.kind} heads; it sets "
                                 f"{', '.join(takers)} heads (drop it, or set head.kind)")
        return self

    def shape_options(self) -> dict:
        """The kind's shape options that are set, for its config's for_target."""
        return {name: getattr(self, name) for name in SHAPE_OPTIONS if getattr(self, name) is not None}


SHAPE_OPTIONS = ("num_modules", "num_heads", "num_layers", "shared_lm_head")

class TrainSection(_Strict):
    mode: Literal["online", "offline"] = "online"
    ttt_steps: int = Field(7, ge=1, le=16)
    step_decay: float = Field(0.8, gt=0, le=1)  # depth k of the unroll weighted step_decay**k in the loss
    # one loss weight per depth of the unroll instead (as many as the run trains depths); overrides step_decay
    depth_weights: list[float] | None = None
    lr: float = Field(1e-4, gt=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    warmup_ratio: float = Field(0.02, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    batch_size: int = Field(8, ge=1)  # sequences per micro-batch per process
    grad_accum: int = Field(1, ge=1)
    # sequences per optimizer step over every process: grad_accum then follows from the number
    # of processes (global / (batch_size x processes)), so a run's global batch, learning-rate
    # schedule and data order are the same on 1, 2, 4 or 8 GPUs. None: batch_size x grad_accum
    # x processes
    global_batch_size: int | None = Field(None, ge=1)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps; overrides epochs
    seed: int = 0
    log_every: int = Field(10, ge=1)
    eval_every: int = Field(200, ge=1)
    save_every: int = Field(500, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    resume: Literal["auto", "never"] = "auto"
    # a step whose loss or gradient norm is NaN/Inf: false stops the run with an error; true skips
    # the step without an update and counts it (train_summary.json: nonfinite_steps_skipped)
    skip_nonfinite: bool = False
    # a saved head (folder or hub id) to start from instead of random weights: fine-tuning keeps
    # its shape and its draft vocabulary (the data's vocab map is not used)
    init_from: str | None = None
    loss_chunk: int = Field(1024, ge=16)
    deepspeed: str | None = None  # path to a DeepSpeed JSON; None: plain torch (DDP-free)
    report_to: Literal["none", "wandb"] = "none"
    wandb_project: str = "specheads"
    offline_cache_dir: str | None = None  # offline mode: where hidden-state shards go
    export_dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"
    compile: bool = False

    @field_validator("depth_weights")
    @classmethod
    def _weights(cls, w: list[float] | None) -> list[float] | None:
        if w is not None and (not w or any(x < 0 for x in w) or not any(x > 0 for x in w)):
            raise ValueError(f"depth_weights {w}: give one weight >= 0 per trained depth, at least one above 0 "
                             "(e.g. [1.0, 0.8, 0.64])")
        return w


class RunConfig(_Strict):
    output_dir: str = "runs/smollm2-eagle3"
    target: TargetSection = TargetSection()
    data: DataSection = DataSection()
    head: HeadSection = HeadSection()
    train: TrainSection = TrainSection()

    @model_validator(mode="after")
    def _check(self):
        if self.train.mode == "offline" and self.train.ttt_steps < 1:
            raise ValueError("offline mode needs ttt_steps >= 1")
        return self


class ConfigError(ValueError):
    pass


def _set_path(tree: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {k!r} is not a section")
    node[keys[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, **direct) -> RunConfig:
    """YAML (optional) <- `--set key=value` overrides <- direct keyword overrides (dotted keys)."""
    tree: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        tree = yaml.safe_load(p.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.lr=3e-4")
        key, raw = item.split("=", 1)
        _set_path(tree, key.strip(), yaml.safe_load(raw))
    for key, value in direct.items():
        if value is not None:
            _set_path(tree, key, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {loc}: {msg}")
        src = f" in {path}" if path else ""
        raise ConfigError(f"invalid run config{src}:\n" + "\n".join(lines)) from None
