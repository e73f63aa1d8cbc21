"""Exported head folders: the layout SGLang / vLLM load, reload, and validation of broken folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.heads.format import HeadFormatError, load_head, save_head
from tests.helpers import DRAFT_VOCAB, TINY_HIDDEN, train_config

EXPECTED_TENSORS = {
    "fc.weight": (TINY_HIDDEN, 3 * TINY_HIDDEN),
    "midlayer.input_layernorm.weight": (TINY_HIDDEN,),
    "midlayer.hidden_norm.weight": (TINY_HIDDEN,),
    "midlayer.post_attention_layernorm.weight": (TINY_HIDDEN,),
    "midlayer.self_attn.q_proj.weight": (4 * 16, 2 * TINY_HIDDEN),
    "midlayer.self_attn.k_proj.weight": (2 * 16, 2 * TINY_HIDDEN),
    "midlayer.self_attn.v_proj.weight": (2 * 16, 2 * TINY_HIDDEN),
    "midlayer.self_attn.o_proj.weight": (TINY_HIDDEN, 4 * 16),
    "midlayer.mlp.gate_proj.weight": (128, TINY_HIDDEN),
    "midlayer.mlp.up_proj.weight": (128, TINY_HIDDEN),
    "midlayer.mlp.down_proj.weight": (TINY_HIDDEN, 128),
    "norm.weight": (TINY_HIDDEN,),
    "lm_head.weight": (DRAFT_VOCAB, TINY_HIDDEN),
    "d2t": (DRAFT_VOCAB,),
    "t2d": (400,),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target_dir, prepared_dir):
    """A Trainer after a 3-step run; its final/ folder is the export under test."""
    from specheads.training.trainer import Trainer

    out = tmp_path_factory.mktemp("export-run")
    trainer = Trainer(train_config(tiny_target_dir, prepared_dir, out, "train.max_steps=3"))
    trainer.run()
    return trainer, out / "final"


def test_config_json(trained):
    trainer, final = trained
    cfg = json.loads((final / "config.json").read_text())
    ids = trainer.layer_ids
    assert ids == [1, 3, 4]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["vocab_size"] == 400
    assert cfg["target_hidden_size"] == TINY_HIDDEN
    assert cfg["hidden_size"] == TINY_HIDDEN
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids  # SGLang: outputs of layers
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # vLLM: inputs of layers
    assert cfg["tie_word_embeddings"] is False
    assert cfg["torch_dtype"] == "float32"
    meta = json.loads((final / "specheads.json").read_text())
    assert meta["kind"] == "eagle3"
    assert meta["config"]["target_layer_ids"] == ids
    assert meta["train"]["steps"] == 3


def test_safetensors_layout(trained):
    _, final = trained
    tensors = load_file(str(final / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == EXPECTED_TENSORS
    assert not any("embed_tokens" in k for k in tensors)
    assert tensors["d2t"].dtype == torch.int64
    assert tensors["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.float32 for k, v in tensors.items() if k not in ("d2t", "t2d"))
    assert int(tensors["t2d"].sum()) == DRAFT_VOCAB
    assert bool(tensors["t2d"][torch.arange(DRAFT_VOCAB) + tensors["d2t"]].all())


def _head_logits(head, trainer, ids):
    from specheads.training.ttt import ttt_unroll

    with torch.no_grad():
        aux = trainer.target(ids, capture_layers=head.config.target_layer_ids, return_logits=False).aux_hidden
        return [head.logits(h) for h in ttt_unroll(head, trainer.target.embed_tokens, ids, aux, 2)]


def test_reload_gives_identical_weights_and_logits(trained):
    trainer, final = trained
    head = load_head(final)
    trained_state = trainer.head.state_dict()
    loaded_state = head.state_dict()
    assert set(loaded_state) == set(trained_state)
    for k, v in trained_state.items():
        assert torch.equal(loaded_state[k], v), k
    # the run trained: the exported weights are not the initialization
    from specheads.heads.eagle3 import Eagle3Head

    torch.manual_seed(trainer.cfg.train.seed)
    init = Eagle3Head(trainer.head.config).state_dict()
    assert not torch.equal(init["fc.weight"], trained_state["fc.weight"])
    assert not torch.equal(init["lm_head.weight"], trained_state["lm_head.weight"])
    assert head.config == trainer.head.config
    ids = torch.stack([trainer.data.train_ids[0][:24], trainer.data.train_ids[1][:24]])
    for a, b in zip(_head_logits(head, trainer, ids), _head_logits(trainer.head, trainer, ids)):
        assert torch.equal(a, b)


def test_reload_without_specheads_json(trained, tmp_path):
    """A folder written by another tool has only config.json + model.safetensors."""
    trainer, final = trained
    folder = tmp_path / "foreign"
    shutil.copytree(final, folder)
    (folder / "specheads.json").unlink()
    head = load_head(folder)
    assert head.config.target_layer_ids == trainer.head.config.target_layer_ids
    assert head.config.draft_vocab_size == DRAFT_VOCAB
    ids = trainer.data.train_ids[0][None, :24]
    for a, b in zip(_head_logits(head, trainer, ids), _head_logits(trainer.head, trainer, ids)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_bf16_export_round_trip(trained, tmp_path):
    trainer, _ = trained
    save_head(trainer.head, tmp_path / "bf16")  # default dtype bfloat16
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    head = load_head(tmp_path / "bf16")
    assert head.fc.weight.dtype == torch.bfloat16
    assert head.d2t.dtype == torch.int64 and head.t2d.dtype == torch.bool
    torch.testing.assert_close(head.fc.weight.float(), trainer.head.fc.weight.bfloat16().float())


# ------------------------------------------------------------------ validation
def _broken_copy(final, tmp_path, edit):
    folder = tmp_path / "broken"
    shutil.copytree(final, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _drop_norm(t):
    del t["norm.weight"]


def _wrong_fc(t):
    t["fc.weight"] = torch.zeros(TINY_HIDDEN, 2 * TINY_HIDDEN)


def _add_embed(t):
    t["embed_tokens.weight"] = torch.zeros(400, TINY_HIDDEN)


def _disagree(t):
    t2d = t["t2d"].clone()
    first = int(t2d.nonzero()[0])
    t2d[first] = False
    t2d[(~t2d).nonzero()[-1]] = True  # same count, another token
    t["t2d"] = t2d


def _d2t_int32(t):
    t["d2t"] = t["d2t"].to(torch.int32)


def _extra(t):
    t["midlayer.self_attn.q_proj.bias"] = torch.zeros(64)


@pytest.mark.parametrize(
    "edit, message",
    [
        (_drop_norm, "missing tensor norm.weight"),
        (_wrong_fc, r"fc.weight has shape \(64, 128\), expected \(64, 192\)"),
        (_add_embed, "contains embed_tokens"),
        (_disagree, "d2t and t2d disagree"),
        (_d2t_int32, "d2t has dtype torch.int32, expected torch.int64"),
        (_extra, r"unexpected tensors \['midlayer.self_attn.q_proj.bias'\]"),
    ],
    ids=["missing", "shape", "embed_tokens", "d2t-t2d", "d2t-dtype", "extra"],
)
def test_validation_rejects_broken_folders(trained, tmp_path, edit, message):
    _, final = trained
    folder = _broken_copy(final, tmp_path, edit)
    with pytest.raises(HeadFormatError, match=message) as e:
        load_head(folder)
    assert str(folder) in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_load_head_refuses_nonfinite_weights(trained, tmp_path, dtype):
    """A head trained into NaN has the right names and shapes; it must still not load (publishing and
    serving go through load_head)."""
    trainer, _ = trained
    save_head(trainer.head, tmp_path / "good", dtype)

    def poison(t):
        t["midlayer.mlp.up_proj.weight"][3, 5] = float("nan")
        t["norm.weight"][0] = float("inf")

    folder = _broken_copy(tmp_path / "good", tmp_path, poison)
    with pytest.raises(HeadFormatError) as e:
        load_head(folder)
    msg = str(e.value)
    assert str(folder) in msg
    assert "tensor midlayer.mlp.up_proj.weight holds 1 NaN/Inf value(s) of 8192" in msg
    assert "tensor norm.weight holds 1 NaN/Inf" in msg
    assert "fc.weight" not in msg  # only the broken tensors are named
    assert load_head(tmp_path / "good").fc.weight.dtype == dtype  # the intact folder still loads


def test_missing_files(trained, tmp_path):
    _, final = trained
    folder = tmp_path / "nocfg"
    shutil.copytree(final, folder)
    (folder / "config.json").unlink()
    with pytest.raises(HeadFormatError, match="no config.json"):
        load_head(folder)
    folder = tmp_path / "noweights"
    shutil.copytree(final, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(HeadFormatError, match="no model.safetensors"):
        load_head(folder)


def test_non_eagle3_config_is_rejected(trained, tmp_path):
    _, final = trained
    folder = tmp_path / "llama"
    shutil.copytree(final, folder)
    (folder / "specheads.json").unlink()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadFormatError, match="not an EAGLE-3 head"):
        load_head(folder)


def test_eagle3_config_validation(tiny_target):
    from specheads.heads.eagle3 import Eagle3Config

    model, _ = tiny_target
    with pytest.raises(ValueError, match="3 target layers"):
        Eagle3Config.for_target(model, 100, [1, 2])
    with pytest.raises(ValueError, match=r"outside the target's layers 0..7"):
        Eagle3Config.for_target(model, 100, [1, 2, 8])
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle3Config.for_target(model, 401)
    cfg = Eagle3Config.for_target(model, 100, intermediate_size=96)
    assert cfg.intermediate_size == 96 and cfg.target_layer_ids == [1, 3, 4]


def test_set_vocab_map_checks_shapes(tiny_target):
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head

    model, _ = tiny_target
    head = Eagle3Head(Eagle3Config.for_target(model, 100))
    with pytest.raises(ValueError, match="do not match"):
        head.set_vocab_map(torch.zeros(99, dtype=torch.int64), torch.zeros(400, dtype=torch.bool))


def test_scaled_rope_survives_export(tmp_path):
    """A Llama-3 rope (scaled) goes to config.json as rope_scaling and comes back identical,
    also for a folder without specheads.json."""
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, rms_norm_eps=1e-5, max_position_embeddings=256, vocab_size=60,
                       draft_vocab_size=60, target_hidden_size=32, target_num_layers=8,
                       target_layer_ids=[1, 3, 4], rope_parameters=rope)
    torch.manual_seed(0)
    head = Eagle3Head(cfg)
    save_head(head, tmp_path / "h", torch.float32)
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    assert raw["rope_theta"] == 500000.0
    assert raw["rope_scaling"]["rope_type"] == "llama3" and raw["rope_scaling"]["factor"] == 8.0
    (tmp_path / "h" / "specheads.json").unlink()
    loaded = load_head(tmp_path / "h")
    assert loaded.config.rope_parameters == rope
    torch.testing.assert_close(loaded.rotary.cos, head.rotary.cos)
    # the scaling really changes the table (vs default rope with the same theta)
    plain = Eagle3Head(Eagle3Config(**{**cfg.to_dict(), "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": 500000.0}}))
    assert not torch.allclose(plain.rotary.cos, head.rotary.cos)
