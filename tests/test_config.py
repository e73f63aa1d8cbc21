"""The run config: YAML, `--set` overrides, strict keys and values."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from specheads.config import ConfigError, RunConfig, load_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults():
    cfg = load_config(None)
    assert isinstance(cfg, RunConfig)
    assert cfg.train.mode == "online" and cfg.train.ttt_steps == 7 and cfg.train.deepspeed is None
    assert cfg.head.kind == "eagle3" and cfg.target.path is None


def test_set_override_and_yaml_typing():
    cfg = load_config(None, ["train.lr=3e-4", "train.batch_size=2", "target.layer_ids=[0, 2, 5]",
                             "train.deepspeed=null", "data.max_length=64"])
    assert cfg.train.lr == pytest.approx(3e-4) and isinstance(cfg.train.lr, float)
    assert cfg.train.batch_size == 2
    assert cfg.target.layer_ids == [0, 2, 5]
    assert cfg.train.deepspeed is None
    assert cfg.data.max_length == 64


def test_precedence_yaml_then_set_then_direct(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text("output_dir: from-yaml\ntrain:\n  lr: 1.0e-3\n  batch_size: 3\n")
    cfg = load_config(y, ["train.lr=2e-3", "output_dir=from-set"], **{"output_dir": "from-direct",
                                                                        "train.max_steps": None})
    assert cfg.train.lr == pytest.approx(2e-3)
    assert cfg.train.batch_size == 3
    assert cfg.output_dir == "from-direct"
    assert cfg.train.max_steps is None  # None direct values do not override


@pytest.mark.parametrize(
    "key, reported",
    [("train.lrr", "train.lrr"), ("trian.lr", "trian"), ("output_directory", "output_directory"),
     ("head.kinds", "head.kinds")],
)
def test_unknown_key_names_the_key(key, reported):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}=1"])
    assert f"  {reported}: unknown key" in str(e.value)


def test_key_below_a_value_names_the_value():
    with pytest.raises(ConfigError, match="data.path: Input should be a valid string"):
        load_config(None, ["data.path.extra=1"])


def test_unknown_key_in_yaml_names_key_and_file(tmp_path):
    y = tmp_path / "bad.yaml"
    y.write_text("train:\n  ttt_step: 3\n")
    with pytest.raises(ConfigError, match=r"train\.ttt_step: unknown key") as e:
        load_config(y)
    assert str(y) in str(e.value)


@pytest.mark.parametrize(
    "override, field",
    [
        ("train.lr=-1", "train.lr"),
        ("train.lr=fast", "train.lr"),
        ("train.mode=turbo", "train.mode"),
        ("train.ttt_steps=0", "train.ttt_steps"),
        ("train.ttt_steps=17", "train.ttt_steps"),
        ("data.max_length=8", "data.max_length"),
        ("target.dtype=int8", "target.dtype"),
        ("train.batch_size=0", "train.batch_size"),
        ("train.warmup_ratio=1", "train.warmup_ratio"),
    ],
)
def test_bad_value_names_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    line = next(x for x in str(e.value).splitlines() if field in x)
    assert line.strip().startswith(field + ":")


def test_several_errors_reported_together():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lr=-1", "train.bogus=1"])
    assert "train.lr" in str(e.value) and "train.bogus: unknown key" in str(e.value)


def test_malformed_overrides(tmp_path):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match="'train' is not a section"):
        load_config(None, ["train=5", "train.lr=1"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    y = tmp_path / "list.yaml"
    y.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(y)


def test_assignment_is_validated():
    cfg = load_config(None)
    with pytest.raises(ValidationError):
        cfg.train.lr = -1.0


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.output_dir
