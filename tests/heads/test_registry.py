"""The head registry: lookups and their errors, the eagle3 entry, and a toy kind (defined here)
going through format, hub export and the trainer without any of them naming it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specheads.heads.format import HeadFormatError, load_head, save_head
from specheads.heads.registry import (HeadKind, HeadKindError, drafter_class, head_kind, head_kinds, kind_of,
                                      register_head_kind, unregister_head_kind)
from specheads.training.ttt import ttt_loss
from tests.helpers import train_config


# ------------------------------------------------------------------ a toy kind: one linear layer
@dataclass
class ToyConfig:
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    target_layer_ids: list[int] = field(default_factory=list)

    @classmethod
    def for_target(cls, target, draft_vocab_size: int, layer_ids=None, **overrides):
        spec = target.spec
        return cls(hidden_size=16, vocab_size=spec.vocab_size, draft_vocab_size=draft_vocab_size,
                   target_hidden_size=spec.hidden_size,
                   target_layer_ids=list(layer_ids or [spec.num_hidden_layers - 1]))

    def fixed_depth(self):
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ToyConfig":
        return cls(**d)

    def to_hf(self, dtype, target_name) -> dict:
        return {"architectures": ["ToyDraftModel"], **self.to_dict(), "torch_dtype": str(dtype).replace("torch.", ""),
                "specheads_target": target_name}

    @classmethod
    def from_hf(cls, raw: dict) -> "ToyConfig":
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})


class ToyHead(nn.Module):
    kind = "toy"

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.out = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)  # no `norm`, no `lm_head`
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.arange(cfg.vocab_size) < cfg.draft_vocab_size)

    def set_vocab_map(self, d2t, t2d):
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def target_rows(self):
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def draft_to_target(self, draft_ids):
        return self.target_rows()[draft_ids]

    def readout(self, hidden, step=0):
        return hidden, self.out.weight

    def logits(self, hidden):
        return self.out(hidden)


UNROLLS, LOSSES = [], []


def toy_unroll(head, embed, input_ids, aux_hidden, steps):
    UNROLLS.append((tuple(input_ids.shape), steps))
    h = head.fc(aux_hidden)
    return [h * 0.5**k for k in range(steps)]


def toy_loss(*args, **kwargs):
    LOSSES.append(kwargs.get("outputs") is not None)
    return ttt_loss(*args, **kwargs)


def toy_weights(cfg: ToyConfig) -> dict:
    return {"fc.weight": (cfg.hidden_size, len(cfg.target_layer_ids) * cfg.target_hidden_size),
            "out.weight": (cfg.draft_vocab_size, cfg.hidden_size),
            "d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}


def toy_mismatches(cfg: ToyConfig, spec) -> list[str]:
    return [] if cfg.target_hidden_size == spec.hidden_size else ["hidden sizes differ"]


class ToyDrafter:
    pass


TOY = HeadKind(
    name="toy", title="Toy", config=ToyConfig, module=ToyHead, unroll=toy_unroll, loss=toy_loss,
    weights=toy_weights, mismatches=toy_mismatches,
    exporters={"plain": lambda head, dtype, target_name: head.config.to_hf(dtype, target_name)},
    hub_architectures={"plain": ("ToyDraftModel",)},
    launch={"plain": "toy-serve --target {target} --draft {folder}"},
    drafter=f"{__name__}:ToyDrafter",
)


@pytest.fixture()
def toy():
    register_head_kind(TOY)
    UNROLLS.clear()
    LOSSES.clear()
    yield TOY
    unregister_head_kind(TOY.name)


def toy_head(seed: int = 0) -> ToyHead:
    torch.manual_seed(seed)
    head = ToyHead(ToyConfig(hidden_size=8, vocab_size=30, draft_vocab_size=10, target_hidden_size=12,
                             target_layer_ids=[1, 2]))
    d2t = torch.arange(10) * 2  # draft id i is target token 3 * i
    t2d = torch.zeros(30, dtype=torch.bool)
    t2d[torch.arange(10) * 3] = True
    head.set_vocab_map(d2t, t2d)
    return head


# ------------------------------------------------------------------ lookups
def test_unknown_kind_names_the_input_and_the_known_kinds():
    with pytest.raises(HeadKindError, match=r"unknown head kind 'eagle4'; known kinds: eagle3"):
        head_kind("eagle4")
    from specheads.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"head.kind: .*unknown head kind 'eagle4'; known kinds: eagle3"):
        load_config(None, ["head.kind=eagle4"])


def test_cli_kind_and_format_choices_come_from_the_registry(toy, capsys):
    from specheads.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--kind", "eagle4"])
    assert "invalid choice: 'eagle4' (choose from 'eagle3', 'mtp', 'medusa', 'eagle', 'toy')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "x", "--format", "onnx", "--output", "y"])
    assert "(choose from 'sglang', 'vllm', 'speculators', 'plain')" in capsys.readouterr().err


def test_eagle3_entry_matches_its_module():
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head

    kind = head_kind("eagle3")
    assert head_kinds()[0] == "eagle3" and kind.module is Eagle3Head and kind.config is Eagle3Config
    cfg = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       rms_norm_eps=1e-5, max_position_embeddings=64, vocab_size=60, draft_vocab_size=20,
                       target_hidden_size=24, target_num_layers=8, target_layer_ids=[1, 3, 4])
    head = Eagle3Head(cfg)
    # the validation table names exactly the tensors the module saves, at their shapes
    assert kind.weights(cfg) == {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert kind_of(head) is kind and kind_of(cfg) is kind
    assert kind.architectures() == ("LlamaForCausalLMEagle3", "Eagle3DraftModel")
    assert isinstance(kind.drafter, str)  # resolved only when a drafter is built


def test_importing_the_registry_imports_no_drafter():
    code = "import sys, specheads.heads.registry as r; print(r.head_kinds(), 'specheads.drafters' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('eagle3', 'mtp', 'medusa', 'eagle') False"


def test_drafter_class_is_resolved_when_asked(toy):
    assert drafter_class("toy") is ToyDrafter
    with pytest.raises(HeadKindError, match=r"'toy': its drafter 'nowhere.at_all:X' cannot be imported"):
        drafter_class(dataclasses.replace(TOY, drafter="nowhere.at_all:X"))


def test_register_checks_the_entry(toy):
    with pytest.raises(HeadKindError, match="'toy' is already registered"):
        register_head_kind(TOY)
    with pytest.raises(HeadKindError, match=r"module ToyHead.kind is 'toy', expected 'toy2'"):
        register_head_kind(dataclasses.replace(TOY, name="toy2"))
    with pytest.raises(HeadKindError, match=r"export formats \['plain'\] and hub_architectures' formats \[\] differ"):
        register_head_kind(dataclasses.replace(TOY, hub_architectures={}), replace=True)
    not_a_format = r"export checks for \['vllm'\], which are not export formats \(\['plain'\]\)"
    with pytest.raises(HeadKindError, match=not_a_format):
        register_head_kind(dataclasses.replace(TOY, export_checks={"vllm": lambda meta: None}), replace=True)
    assert head_kind("toy") is TOY  # a refused entry replaces nothing


# ------------------------------------------------------------------ format through the kind
def test_toy_head_round_trips(toy, tmp_path):
    head = toy_head()
    folder = save_head(head, tmp_path / "toy", torch.float32, target_name="tiny/target")
    assert json.loads((folder / "specheads.json").read_text())["kind"] == "toy"
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["ToyDraftModel"] and raw["specheads_kind"] == "toy"
    assert set(load_file(str(folder / "model.safetensors"))) == set(toy_weights(head.config))
    back = load_head(folder)
    assert isinstance(back, ToyHead) and back.config == head.config
    for k, v in head.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # without specheads.json the architecture names the kind, and config.json the config
    (folder / "specheads.json").unlink()
    raw.pop("specheads_kind")
    (folder / "config.json").write_text(json.dumps(raw))
    assert load_head(folder).config == head.config


def test_validation_uses_the_kinds_shapes(toy, tmp_path):
    folder = save_head(toy_head(), tmp_path / "toy", torch.float32)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["out.weight"] = torch.zeros(10, 9)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(HeadFormatError, match=r"out.weight has shape \(10, 9\), expected \(10, 8\)"):
        load_head(folder)


def test_a_folder_of_an_unknown_kind_is_refused(toy, tmp_path):
    folder = save_head(toy_head(), tmp_path / "toy", torch.float32)
    unregister_head_kind("toy")
    with pytest.raises(HeadFormatError, match=r"specheads.json names head kind 'toy', which this specheads does not "
                                              r"know \(known kinds: eagle3, mtp, medusa, eagle\)"):
        load_head(folder)
    (folder / "specheads.json").unlink()
    with pytest.raises(HeadFormatError, match=r"config.json names head kind 'toy'"):
        load_head(folder)


def test_a_folder_without_a_kind_field_is_eagle3(tmp_path, tiny_target):
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head

    model = tiny_target[0]
    head = Eagle3Head(Eagle3Config.for_target(model, model.spec.vocab_size))  # full vocab: a consistent vocab map
    folder = save_head(head, tmp_path / "old", torch.float32)
    meta = json.loads((folder / "specheads.json").read_text())
    del meta["kind"]
    (folder / "specheads.json").write_text(json.dumps(meta))
    assert isinstance(load_head(folder), Eagle3Head)


def test_export_uses_the_kinds_formats(toy, tmp_path):
    from specheads.hub import export_head

    folder = save_head(toy_head(), tmp_path / "toy", torch.float32, target_name="Org/Target")
    out = export_head(folder, "plain", tmp_path / "plain")
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["ToyDraftModel"] and raw["specheads_kind"] == "toy"
    assert (out / "SERVING.md").read_text().strip().endswith(f"toy-serve --target Org/Target --draft {out.resolve()}")
    with pytest.raises(HeadKindError, match=r"export format 'vllm' is not one of toy heads' formats: plain"):
        export_head(folder, "vllm", tmp_path / "vllm")
    assert not (tmp_path / "vllm").exists()


def test_model_card_names_the_kind(toy):
    from specheads.publish import model_card

    card = model_card(toy_head().config, {}, "Org/Target", "me/toy", "float32", None)
    assert "# Toy draft head for Org/Target" in card and "- toy\n" in card
    assert "| architecture | `ToyDraftModel`, dtype float32 |" in card
    assert "toy-serve --target Org/Target --draft me/toy" in card and "SGLang" not in card


# ------------------------------------------------------------------ the trainer through the kind
def test_trainer_runs_the_kinds_unroll_and_loss(toy, tmp_path, tiny_target_dir, small_prepared_dir):
    from specheads.training.trainer import train

    out = tmp_path / "run"
    train(train_config(tiny_target_dir, small_prepared_dir, out, "train.max_steps=2", "head.kind=toy"))
    steps = 2  # train.ttt_steps of the test config
    assert UNROLLS and all(s == steps for _, s in UNROLLS)
    assert LOSSES and all(LOSSES)  # every loss got the kind's own unroll
    head = load_head(out / "final")
    assert isinstance(head, ToyHead)
    assert json.loads((out / "final" / "specheads.json").read_text())["kind"] == "toy"


def test_init_from_a_head_of_another_kind_is_refused(toy, tmp_path, tiny_target, tiny_target_dir,
                                                     small_prepared_dir):
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from specheads.training.trainer import Trainer, TrainingError

    model = tiny_target[0]
    head = Eagle3Head(Eagle3Config.for_target(model, model.spec.vocab_size))
    folder = save_head(head, tmp_path / "e3", torch.float32)
    cfg = train_config(tiny_target_dir, small_prepared_dir, tmp_path / "run", "head.kind=toy",
                       f"train.init_from={folder}")
    with pytest.raises(TrainingError, match=r"kind eagle3, the run trains head.kind=toy; set head.kind=eagle3"):
        Trainer(cfg).setup()
