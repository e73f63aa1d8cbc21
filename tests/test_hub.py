"""Export for SGLang / vLLM: each engine's layer-id convention, same weights, same drafts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specheads.cli import main
from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.heads.format import HeadFormatError, load_head, save_head
from specheads.hub import export_head
from specheads.target.model import TargetModel
from tests.helpers import tiny_llama_config


@pytest.fixture()
def head_folder(tmp_path):
    torch.manual_seed(0)
    target = TargetModel(tiny_llama_config(vocab_size=96))
    head = Eagle3Head(Eagle3Config.for_target(target, 96))
    return save_head(head, tmp_path / "final", torch.float32, target_name="tiny/target"), head


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_export_round_trip(tmp_path, head_folder, fmt):
    folder, head = head_folder
    out = export_head(folder, fmt, tmp_path / fmt)
    cfg = json.loads((out / "config.json").read_text())
    ours = head.config.target_layer_ids
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    if fmt == "sglang":  # outputs of layers, nested; no top-level key to disagree with it
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ours
        assert "eagle_aux_hidden_state_layer_ids" not in cfg
    else:  # inputs of layers: one higher, top level
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ours]
        assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    assert "eagle3" in (out / "SERVING.md").read_text().lower()
    a, b = load_file(str(folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    back = load_head(out)
    assert back.config.target_layer_ids == ours
    x = torch.randn(2, 3, head.config.hidden_size)
    assert torch.equal(back.logits(x), head.logits(x))


def test_vllm_ids_read_back_without_our_metadata(tmp_path, head_folder):
    folder, head = head_folder
    out = export_head(folder, "vllm", tmp_path / "v")
    (out / "specheads.json").unlink()  # as another tool would see it
    cfg = load_head(out).config
    assert cfg.target_layer_ids == head.config.target_layer_ids


def test_export_rejects_a_broken_head(tmp_path, head_folder):
    folder, _ = head_folder
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["embed_tokens.weight"] = torch.zeros(3, 3)
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(HeadFormatError, match="embed_tokens"):
        export_head(folder, "sglang", tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_export_cli(tmp_path, head_folder, capsys):
    folder, _ = head_folder
    assert main(["export", str(folder), "--format", "vllm", "--output", str(tmp_path / "v")]) == 0
    assert "speculative-config" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing"), "--format", "sglang", "--output", str(tmp_path / "s")]) == 2
    assert "missing" in capsys.readouterr().err
