"""Export for SGLang / vLLM: each engine's layer-id convention, same weights, same drafts."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from safetensors.torch import load_file

from specheads.cli import main
from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.heads.format import HeadFormatError, load_head, save_head
from specheads.hub import TARGET_PLACEHOLDER, export_head
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


def _launch(out, fmt) -> tuple[str, str]:
    """(target, draft folder) of the launch command in SERVING.md, read as the shell would."""
    argv = shlex.split((out / "SERVING.md").read_text().strip().splitlines()[-1])
    if fmt == "sglang":
        assert argv[:3] == ["python", "-m", "sglang.launch_server"] and "EAGLE3" in argv
        return argv[argv.index("--model-path") + 1], argv[argv.index("--speculative-draft-model-path") + 1]
    assert argv[:2] == ["vllm", "serve"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "eagle3"
    return argv[2], spec["model"]


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
@pytest.mark.parametrize("recorded, target", [
    ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # the embedded default
    ("/elsewhere/SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # staged on a GPU box
    ("Org/Target-1B", "Org/Target-1B"),  # loaded by hub id
])
def test_serving_md_launches_the_targets_hub_id(tmp_path, monkeypatch, fmt, recorded, target):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(TargetModel(tiny_llama_config(vocab_size=96)), 96))
    folder = save_head(head, tmp_path / "final", torch.float32, target_name=recorded)
    monkeypatch.chdir(tmp_path)
    out = export_head(folder, fmt, "exported")  # a relative --output: the command names the folder absolute
    assert _launch(out, fmt) == (target, str(tmp_path / "exported"))
    assert TARGET_PLACEHOLDER not in (out / "SERVING.md").read_text()


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_serving_md_without_a_hub_id(tmp_path, head_folder, fmt):
    folder, head = head_folder
    # a local HF checkpoint folder: it loads as it is
    local = tmp_path / "my-target"
    local.mkdir()
    save_head(head, folder, torch.float32, target_name=str(local))
    out = export_head(folder, fmt, tmp_path / "a")
    assert _launch(out, fmt) == (str(local), str(tmp_path / "a"))
    # a GGUF file (or a folder of another machine), or nothing recorded: a placeholder, and what to put there
    for recorded in ("/gone/model.gguf", None):
        save_head(head, folder, torch.float32, target_name=recorded)
        out = export_head(folder, fmt, tmp_path / f"b{recorded is None}")
        text = (out / "SERVING.md").read_text()
        command = text.strip().splitlines()[-1]
        assert command.strip().startswith(("python -m sglang", "vllm serve"))
        assert TARGET_PLACEHOLDER in command and f"Replace `{TARGET_PLACEHOLDER}`" in text
        assert ("recorded as `/gone/model.gguf`" if recorded else "not recorded") in text
        assert str(out) in command


def test_export_cli_prints_what_to_fill_in(tmp_path, head_folder, capsys):
    folder, head = head_folder
    save_head(head, folder, torch.float32, target_name="/gone/model.gguf")
    assert main(["export", str(folder), "--format", "sglang", "--output", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert f"Replace `{TARGET_PLACEHOLDER}`" in out and f"--model-path {TARGET_PLACEHOLDER}" in out
    assert out.strip().splitlines()[-1] == (tmp_path / "s" / "SERVING.md").read_text().strip().splitlines()[-1].strip()


@pytest.mark.parametrize("draft_vocab", [None, 48])
def test_speculators_export_has_the_keys_and_names_vllm_reads(tmp_path, draft_vocab):
    """vLLM's speculators format (speculators 0.9.0 read by vLLM 0.33.0; docs/formats/
    speculators-eagle3.md): no top-level model_type, layer ids as inputs of layers, every norm
    flag false (this head's math; vLLM's missing-key default for norm_before_residual is true),
    the layer as layers.0, d2t/t2d only with a smaller draft vocabulary."""
    target = TargetModel(tiny_llama_config(64)).eval()
    cfg = Eagle3Config.for_target(target, draft_vocab_size=draft_vocab or 64)
    head = Eagle3Head(cfg).eval()
    if draft_vocab:
        t2d = torch.zeros(64, dtype=torch.bool)
        t2d[:draft_vocab] = True
        head.set_vocab_map(torch.zeros(draft_vocab, dtype=torch.long), t2d)
    folder = save_head(head, tmp_path / "final", torch.float32, target_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    out = export_head(folder, "speculators", tmp_path / "spec")
    got = json.loads((out / "config.json").read_text())
    assert "model_type" not in got and got["speculators_model_type"] == "eagle3"
    assert got["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in cfg.target_layer_ids]
    assert all(got[k] is False for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
    assert got["draft_vocab_size"] == (draft_vocab or 64) and got["transformer_layer_config"]["vocab_size"] == 64
    assert got["transformer_layer_config"]["model_type"] == "llama"
    spec = got["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["proposal_methods"][0]["proposal_type"] == "greedy"
    assert spec["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    names = set(load_file(out / "model.safetensors"))
    assert not any(n.startswith("midlayer.") for n in names)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight",
            "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= names
    assert names & {"d2t", "t2d"} == ({"d2t", "t2d"} if draft_vocab else set())
    assert not (out / "specheads.json").exists() and "eagle3" in (out / "SERVING.md").read_text()
