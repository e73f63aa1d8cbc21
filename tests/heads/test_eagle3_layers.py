"""EAGLE-3 heads of several decoder layers (head.num_layers): weight names and shapes, save/load,
export where a loader takes them (vLLM, speculators) and a refusal where none does (SGLang), and
bad values refused naming head.num_layers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specheads.config import ConfigError, load_config
from specheads.heads.eagle3 import Eagle3Config, Eagle3Head, weight_shapes
from specheads.heads.format import load_head, save_head
from specheads.heads.registry import HeadKindError
from specheads.hub import export_head
from specheads.publish import model_card
from specheads.target.model import TargetModel
from tests.helpers import tiny_llama_config

LAYER = ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
         "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
         "mlp.up_proj.weight", "mlp.down_proj.weight")


@pytest.fixture()
def target():
    torch.manual_seed(0)
    return TargetModel(tiny_llama_config(vocab_size=96))


@pytest.fixture()
def head(target):
    torch.manual_seed(1)
    head = Eagle3Head(Eagle3Config.for_target(target, 64, num_layers=3)).eval()
    t2d = torch.zeros(96, dtype=torch.bool)
    t2d[:64] = True  # the draft vocabulary: the first 64 target tokens
    head.set_vocab_map(torch.zeros(64, dtype=torch.long), t2d)
    return head


def _drafts(head, target, seed=0):
    """The head's hidden and logits over a random two-token feed (its whole forward)."""
    g = torch.Generator().manual_seed(seed)
    cfg = head.config
    aux = torch.randn(1, 4, 3 * cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (1, 4), generator=g)
    with torch.no_grad():
        hidden, k, v = head.step(target.embed_tokens(ids), head.project(aux), torch.arange(4)[None])
        return hidden, head.logits(hidden), k


def test_weights_are_named_as_vllm_loads_them(head):
    cfg = head.config
    names = weight_shapes(cfg)
    later = {n for n in names if n.startswith("layers.")}
    assert later == {f"layers.{i}.{p}" for i in (1, 2) for p in LAYER}
    h = cfg.hidden_size
    assert names["layers.1.self_attn.q_proj.weight"] == (cfg.num_attention_heads * cfg.head_dim, h)  # over H, not 2H
    assert names["midlayer.self_attn.q_proj.weight"][1] == 2 * h
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == names
    one = weight_shapes(Eagle3Config.from_dict({**cfg.to_dict(), "num_layers": 1}))
    assert not any(n.startswith("layers.") for n in one)


def test_the_stack_is_deeper_than_one_layer(head, target):
    """Layer 2 changes the output (a head that ignored its later layers would pass the rest)."""
    hidden, _, k = _drafts(head, target)
    assert k.shape[0] == 3
    with torch.no_grad():
        head.layers["2"].mlp.down_proj.weight.add_(0.5)
    assert not torch.allclose(_drafts(head, target)[0], hidden)


def test_save_load_round_trip(tmp_path, head, target):
    folder = save_head(head, tmp_path / "final", torch.float32, target_name="tiny/target")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3
    assert json.loads((folder / "specheads.json").read_text())["config"]["num_layers"] == 3
    back = load_head(folder)
    assert back.config.num_layers == 3
    a, b = head.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for x, y in zip(_drafts(head, target), _drafts(back, target)):
        assert torch.equal(x, y)
    # a folder without specheads.json (another tool's reader) gets the layer count from num_hidden_layers
    (folder / "specheads.json").unlink()
    assert load_head(folder).config.num_layers == 3


def test_a_saved_one_layer_config_without_num_layers_loads_as_one_layer(target):
    cfg = Eagle3Config.for_target(target, 64).to_dict()
    del cfg["num_layers"]  # specheads.json of a head saved before the option existed
    assert Eagle3Config.from_dict(cfg).num_layers == 1


def test_vllm_export_holds_every_layer(tmp_path, head, target):
    folder = save_head(head, tmp_path / "final", torch.float32, target_name="tiny/target")
    out = export_head(folder, "vllm", tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    tensors = load_file(str(out / "model.safetensors"))
    assert {f"layers.{i}.self_attn.q_proj.weight" for i in (1, 2)} <= tensors.keys()
    assert "midlayer.self_attn.q_proj.weight" in tensors  # vLLM renames midlayer. to layers.0.
    back = load_head(out)
    for x, y in zip(_drafts(head, target), _drafts(back, target)):
        assert torch.equal(x, y)


def test_speculators_export_names_the_layers_as_vllm_does(tmp_path, head):
    folder = save_head(head, tmp_path / "final", torch.float32, target_name="tiny/target")
    out = export_head(folder, "speculators", tmp_path / "spec")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 3
    tensors = load_file(str(out / "model.safetensors"))
    assert {n.split(".")[1] for n in tensors if n.startswith("layers.")} == {"0", "1", "2"}
    assert not any(n.startswith("midlayer.") for n in tensors)


def test_sglang_export_is_refused_with_the_reason(tmp_path, head):
    folder = save_head(head, tmp_path / "final", torch.float32, target_name="tiny/target")
    with pytest.raises(HeadKindError, match=r"head.num_layers=3.*SGLang.*BasicDecoderLayer.*vllm or speculators"):
        export_head(folder, "sglang", tmp_path / "sglang")
    assert not (tmp_path / "sglang").exists()  # refused before anything is written


def test_the_card_leaves_out_the_engine_that_cannot_load_it(head):
    card = model_card(head.config, {}, "tiny/target", "me/head", "float32", None, base_model="tiny/target")
    assert "3 decoder layers" in card and "SGLang does not" in card
    assert "sglang.launch_server" not in card and "vllm serve" in card


@pytest.mark.parametrize("value", [0, -1, 9, 1.5, True])
def test_bad_num_layers_is_refused_naming_the_option(target, value):
    with pytest.raises(ValueError, match=r"head\.num_layers=.*1\.\.8"):
        Eagle3Config.for_target(target, 64, num_layers=value)


@pytest.mark.parametrize("value", [0, 9, "two"])
def test_bad_num_layers_in_a_run_config_names_the_key(value):
    with pytest.raises(ConfigError, match=r"head\.num_layers"):
        load_config(None, [f"head.num_layers={value}"])


def test_num_layers_is_an_eagle3_option_not_mtps():
    assert load_config(None, ["head.num_layers=2"]).head.shape_options() == {"num_layers": 2}
    with pytest.raises(ConfigError, match=r"head\.num_layers=2 does not apply to mtp heads; it sets eagle3, medusa"):
        load_config(None, ["head.kind=mtp", "head.num_layers=2"])
    with pytest.raises(ConfigError, match=r"does not apply to eagle heads"):
        load_config(None, ["head.kind=eagle", "head.num_layers=2"])
