"""MTP heads of a Qwen3-family target take the target's q/k norms in their modules (as speculators'
`mtp` layer and Qwen3's own layers do): trained on the tiny target, they draft losslessly (greedy output
equals `ar` at batch 1 and 4, chain and tree), their folder round-trips with the norms, and a folder of
a head made before the option (no q/k norms) still loads and runs."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.heads.format import load_head, save_head
from specheads.heads.mtp import MTPHead, weight_shapes
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.helpers import one_torch_thread  # noqa: F401  (autouse)
from tests.runtime.spec_helpers import random_prompts, train_head

VOCAB, NEW = 64, 24


def qwen3_target(seed: int = 0, std: float = 0.5):
    from transformers import Qwen3Config

    from specheads.target.model import TargetModel

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = TargetModel(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std if p.ndim >= 2 else 1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def case():
    target = qwen3_target()
    assert target.spec.qk_norm
    prompts = random_prompts(6, VOCAB, [5, 9, 3, 12, 7, 4], seed=2)
    head = train_head(target, prompts, new_tokens=30, steps=30, kind="mtp", num_modules=2)
    ar = [r.token_ids for r in SpecEngine(target, method="ar", max_len=64).generate(
        prompts, SamplingParams(max_new_tokens=NEW))]
    return target, head, prompts, ar


def test_the_modules_take_the_targets_qk_norms(case):
    _, head, _, _ = case
    assert head.config.qk_norm
    names = set(head.state_dict())
    assert {"layers.0.self_attn.q_norm.weight", "layers.1.self_attn.k_norm.weight"} <= names
    assert {k: tuple(v.shape) for k, v in head.state_dict().items() if k in weight_shapes(head.config)} == \
        weight_shapes(head.config)
    assert weight_shapes(head.config)["layers.0.self_attn.q_norm.weight"] == (16,)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", [(2, 1, 2), (2, 4, 6)], ids=["chain", "tree"])
def test_greedy_equals_ar(case, batch, tree):
    target, head, prompts, ar = case
    steps, topk, n = tree
    engine = SpecEngine(target, head, method="mtp", max_len=64, max_batch=batch, num_steps=steps, topk=topk,
                        num_draft_tokens=n)
    res = engine.generate(prompts, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in res] == ar
    assert sum(r.accepted_tokens for r in res) > 0, "the trained head's drafts should be accepted at times"


def test_the_folder_round_trips_with_the_norms(case, tmp_path):
    _, head, _, _ = case
    folder = save_head(head, tmp_path / "head", torch.float32)
    assert json.loads((folder / "config.json").read_text())["specheads_qk_norm"] is True
    again = load_head(folder)
    assert isinstance(again, MTPHead) and again.config == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], t), name
    # a folder without specheads.json (config.json's keys) gives the same config
    (folder / "specheads.json").unlink()
    assert load_head(folder).config.qk_norm


def test_a_head_without_qk_norms_still_loads_and_drafts(case, tmp_path):
    """Heads made before the option have no q/k norms: their specheads.json has no qk_norm key."""
    target, _, prompts, ar = case
    head = train_head(target, prompts, new_tokens=30, steps=5, kind="mtp", num_modules=2, qk_norm=False)
    folder = save_head(head, tmp_path / "old", torch.float32)
    meta = json.loads((folder / "specheads.json").read_text())
    del meta["config"]["qk_norm"]
    (folder / "specheads.json").write_text(json.dumps(meta))
    old = load_head(folder)
    assert not old.config.qk_norm and "layers.0.self_attn.q_norm.weight" not in old.state_dict()
    res = SpecEngine(target, old, method="mtp", max_len=64, num_steps=2, topk=1, num_draft_tokens=2).generate(
        prompts, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in res] == ar


def _exportable(target):
    from specheads.heads.mtp import MTPConfig

    torch.manual_seed(0)
    return MTPHead(MTPConfig.for_target(target, draft_vocab_size=VOCAB, num_modules=1)).eval()


@pytest.mark.parametrize("opts, refused", [({}, False), ({"freeze_lm_head": False}, True),
                                           ({"lm_head_from_target": False}, True)],
                         ids=["defaults", "trained-lm-head", "random-lm-head"])
def test_speculators_export_refuses_a_head_whose_run_trained_its_lm_head(case, tmp_path, opts, refused):
    """speculators' mtp model reads out through the verifier's lm_head: a run that trained its own is refused."""
    from specheads.heads.kind import HeadKindError
    from specheads.hub import export_head

    target = case[0]
    folder = save_head(_exportable(target), tmp_path / "head", torch.float32, {"run_config": {"head": opts}})
    out = tmp_path / "spec"
    if not refused:
        assert (export_head(folder, "speculators", out) / "config.json").is_file()
        return
    with pytest.raises(HeadKindError, match="its run trained its own lm_head"):
        export_head(folder, "speculators", out)
    assert not out.exists()
