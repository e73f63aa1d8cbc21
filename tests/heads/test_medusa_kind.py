"""Medusa heads: the folder round trip, validation, and the vLLM export checked against the
names and config keys vLLM's Medusa model reads (docs/formats/medusa-eagle-sources.md,
vllm==0.32.0 models/medusa.py and transformers_utils/configs/medusa.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.heads.format import HeadFormatError, load_head, save_head
from specheads.heads.kind import HeadKindError
from specheads.hub import export_head
from tests.runtime.spec_helpers import make_target, random_head

K, N = 3, 2  # heads, residual blocks a head


@pytest.fixture
def target():
    return make_target(seed=0, vocab=64)


def _saved(tmp_path, head):
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    return save_head(head, tmp_path / "medusa", torch.float32, target_name="tiny/target")


def test_round_trip_and_validation(tmp_path, target):
    head = random_head(target, kind="medusa", num_heads=K, num_layers=N)
    folder = _saved(tmp_path, head)
    assert json.loads((folder / "specheads.json").read_text())["kind"] == "medusa"
    back = load_head(folder)
    assert type(back) is type(head) and back.config == head.config
    for (name, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name
    tensors = load_file(folder / "model.safetensors")
    tensors["blocks.1.layers.0.weight"] = torch.zeros(5, 5)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(HeadFormatError, match=r"blocks\.1\.layers\.0\.weight"):
        load_head(folder)


def test_vllm_export_has_the_names_and_keys_vllm_reads(tmp_path, target):
    head = random_head(target, kind="medusa", num_heads=K, num_layers=N)
    out = export_head(_saved(tmp_path, head), "vllm", tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MedusaModel"] and cfg["model_type"] == "medusa"
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (K, N, 32, 64)
    assert cfg["medusa_fc_bias"] is True and cfg["truncated_vocab_size"] == 64
    # vLLM renames every key holding "num" with "heads" or "layers" onto num_heads / num_hidden_layers, in file
    # order: no other key may hold them
    clash = [k for k in cfg if "num" in k and ("heads" in k or "layers" in k)]
    assert clash == ["num_heads", "num_hidden_layers"]
    names = set(load_file(out / "model.safetensors"))
    want = {f"blocks.{k}.layers.{j}.{p}" for k in range(K) for j in range(N) for p in ("weight", "bias")}
    want |= {f"lm_heads.{k}.weight" for k in range(K)}
    assert want <= names and names - want <= {"d2t", "t2d"}  # vLLM skips names it does not know
    assert "num_speculative_tokens" in (out / "SERVING.md").read_text()


def _draft_vocab(head):
    """A draft vocabulary of 48 of the 64 tokens, every 4th one left out: d2t offsets that grow."""
    keep = torch.tensor([t for t in range(64) if t % 4 != 3])
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[keep] = True
    head.set_vocab_map(keep - torch.arange(48), t2d)
    return keep


def test_vllm_export_refuses_a_draft_vocabulary_over_several_projections(tmp_path, target):
    head = random_head(target, kind="medusa", draft_vocab=48, num_heads=2)
    _draft_vocab(head)
    with pytest.raises(ValueError, match=r"a draft vocabulary only through one shared projection \(original_lm_head\); "
                                         r"this head has 2 projections over 48 of 64 tokens .*head.shared_lm_head=true"):
        export_head(_saved(tmp_path, head), "vllm", tmp_path / "vllm")
    with pytest.raises(HeadKindError, match="'sglang' is not one of medusa heads' formats: vllm"):
        export_head(tmp_path / "medusa", "sglang", tmp_path / "sg")

def test_one_shared_projection_saves_loads_drafts_and_exports_with_a_token_map(tmp_path, target):
    """head.shared_lm_head: one vocabulary projection (lm_heads.0) for every head; its draft logits,
    worked out for every head in one product, equal each head's through it; vLLM's export sets
    original_lm_head and maps each draft index to its target token (token_map, int64) as the
    drafter does, loaded as vLLM's Medusa loader scatters the logits."""
    head = random_head(target, kind="medusa", draft_vocab=48, num_heads=K, num_layers=N, shared_lm_head=True)
    keep = _draft_vocab(head)
    folder = _saved(tmp_path, head)
    names = set(load_file(folder / "model.safetensors"))
    assert {n for n in names if n.startswith("lm_heads.")} == {"lm_heads.0.weight"}
    back = load_head(folder)
    assert back.config.shared_lm_head and len(back.lm_heads) == 1 and back.config == head.config
    hidden = torch.randn(5, 1, 32)
    together = back.draft_logits(hidden, K)
    alone = [back.lm_heads[0](back.blocks[k](hidden)) for k in range(K)]
    assert len(together) == K and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(together, alone))
    assert torch.equal(back.readout(hidden, 2)[1], back.lm_heads[0].weight)

    out = export_head(folder, "vllm", tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["original_lm_head"] is True and cfg["truncated_vocab_size"] == 48 and cfg["vocab_size"] == 64
    tensors = load_file(out / "model.safetensors")
    assert tensors["lm_heads.0.weight"].shape == (48, 32) and not any(n.startswith("lm_heads.1") for n in tensors)
    token_map = tensors["token_map"]
    assert token_map.dtype == torch.int64 and torch.equal(token_map, keep)
    assert torch.equal(token_map, back.target_ids().cpu())
    # vLLM's compute_logits: each head's draft logits scattered into the target's vocabulary at token_map
    full = torch.full((5, 1, 64), -torch.inf)
    full[..., token_map] = together[1]
    assert torch.equal(full.argmax(-1), token_map[together[1].argmax(-1)])


def test_speculators_export_is_refused(tmp_path, target, capsys):
    """speculators defines no Medusa model (0.9.0): said, with what it does define; nothing written."""
    from specheads.cli import main

    folder = _saved(tmp_path, random_head(target, kind="medusa", num_heads=2))
    with pytest.raises(HeadKindError, match=r"^Medusa heads do not export to speculators: speculators defines no "
                                            r"Medusa model at 0.9.0 \(its types: eagle3, peagle, mtp, dflash, "):
        export_head(folder, "speculators", tmp_path / "sp")
    capsys.readouterr()
    assert main(["export", str(folder), "--format", "speculators", "--output", str(tmp_path / "sp")]) == 2
    err = capsys.readouterr().err
    assert "specheads export: error: Medusa heads do not export to speculators" in err and "Traceback" not in err
    assert "medusa heads export to vllm" in err
    assert not (tmp_path / "sp").exists()


def test_medusa_trains_through_the_cli(tmp_path, tiny_target_dir, prepared_dir):
    """head.kind=medusa with its shape options; every head trained (ttt_steps below the head count
    is refused), one metric entry per head."""
    from specheads.cli import main
    from specheads.heads.medusa import MedusaHead

    out = tmp_path / "run"
    common = ["train", "--target", str(tiny_target_dir), "--data", str(prepared_dir), "--output-dir", str(out),
              "--set", "train.deepspeed=null", "--set", "head.kind=medusa", "--set", "head.num_heads=2",
              "--set", "head.num_layers=1", "--set", "train.batch_size=2"]
    assert main(common + ["--max-steps", "1", "--set", "train.ttt_steps=1"]) == 2
    assert main(common + ["--max-steps", "6", "--set", "train.ttt_steps=2"]) == 0
    head = load_head(out / "final")
    assert isinstance(head, MedusaHead) and head.config.num_heads == 2
    summary = json.loads((out / "train_summary.json").read_text())
    assert len(summary["eval/acc"]) == 2
    shared = tmp_path / "shared"
    assert main([*common[:6], str(shared), *common[7:], "--max-steps", "2", "--set", "train.ttt_steps=2",
                 "--set", "head.shared_lm_head=true"]) == 0
    head = load_head(shared / "final")
    assert head.config.shared_lm_head and len(head.lm_heads) == 1


def test_shape_options_must_fit_the_kind():
    from specheads.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"head.num_heads=2 does not apply to mtp heads; it sets medusa heads"):
        load_config(None, ["head.kind=mtp", "head.num_heads=2"])
    with pytest.raises(ConfigError, match=r"head.num_modules=2 does not apply to eagle3 heads; it sets mtp heads"):
        load_config(None, ["head.num_modules=2"])
    with pytest.raises(ConfigError, match=r"head.shared_lm_head=True does not apply to eagle3 heads; it sets medusa"):
        load_config(None, ["head.shared_lm_head=true"])
    assert load_config(None, ["head.kind=medusa", "head.shared_lm_head=true"]).head.shape_options() == {
        "shared_lm_head": True}
