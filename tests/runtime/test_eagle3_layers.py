"""EAGLE-3 heads of several decoder layers (head.num_layers) on the engine: each layer its own
cache, greedy output equals plain decoding with a static tree (chain and dynamic trees, the
Triton kernels and moving rows: test_head_kinds_runtime.py), the unroll the trainer runs is what
the drafter computes, and the adaptive policy's tiers share every layer's cache."""

from __future__ import annotations

import pytest
import torch

from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.runtime.spec_helpers import ar_tokens, make_target, random_prompts, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
PROMPTS = TRAIN[:6]
NEW = 30
TREES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=3, num_draft_tokens=8),
         "static": dict(static_tree="0;1;0,0;0,1;1,0;0,0,0")}


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def head(target):
    return train_head(target, TRAIN, num_layers=2)


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, NEW)


def test_the_head_has_two_layers_each_with_its_own_cache(target, head):
    assert head.config.num_layers == 2 and len(head.decoder_layers()) == 2
    assert head.layers["1"].self_attn.q_proj.weight.shape[1] == head.config.hidden_size  # a plain Llama layer
    engine = SpecEngine(target, head, method="eagle3", max_len=64, max_batch=3, **TREES["tree"])
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
    assert engine.drafter.k.shape[0] == 2 and engine.drafter.k.shape[1] >= 3  # [layers, rows, ...]


def test_greedy_output_equals_ar_with_a_static_tree(target, head, reference):
    """Chain and dynamic tree, batch 1 and 4, the Triton draft kernels and moving rows:
    test_head_kinds_runtime.py (its eagle3-2-layers head)."""
    for max_batch in (1, 3):
        engine = SpecEngine(target, head, max_len=64, max_batch=max_batch, **TREES["static"])
        results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
        assert [r.token_ids for r in results] == reference


def test_the_unroll_is_what_the_drafter_computes(target, head):
    """The trainer's unroll at step 0 and step 1 equals the head's `step` over the same inputs with
    each layer attending to its own earlier keys (what the drafter's per-layer caches hold)."""
    from specheads.training.ttt import shift_left, ttt_unroll

    ids = torch.tensor([PROMPTS[3]])
    t = ids.shape[1]
    out = target(ids, capture_layers=head.config.target_layer_ids, return_logits=False)
    steps = ttt_unroll(head, target.embed_tokens, ids, out.aux_hidden, 2)
    pos = torch.arange(t)[None]
    h0, k0, v0 = head.step(target.embed_tokens(shift_left(ids, 1)), head.project(out.aux_hidden), pos)
    assert k0.shape[0] == 2  # one key block a layer
    torch.testing.assert_close(h0, steps[0])
    # step 1, row r: the step-0 keys of rows <= r (causal) plus its own step-1 key
    for r in range(t - 2):
        mask = torch.zeros(1, 1, 1, t + 1, dtype=torch.bool)
        mask[..., : r + 1] = True
        mask[..., t] = True
        emb = target.embed_tokens(ids[:, r + 2: r + 3])
        h1, _, _ = head.step(emb, h0[:, r: r + 1], pos[:, r: r + 1] + 1, k0, v0, mask)
        torch.testing.assert_close(h1[0, 0], steps[1][0, r], atol=1e-4, rtol=1e-4)  # two attention orders


def test_the_tiers_of_the_adaptive_policy_share_every_layers_cache(target, head, reference):
    """A smaller tier drafts over the full tree's per-layer caches (same buffers, its own scratch)."""
    from tests.runtime.test_tiers import run

    engine = SpecEngine(target, head, max_len=64, max_batch=3, speculation_policy="adaptive",
                        speculation_tiers="1,1,1;2,1,2;3,2,5", num_steps=4, topk=3, num_draft_tokens=8,
                        speculation_settings="explore_every=3")  # every tier runs, whatever it accepts
    tokens, trees = run(engine, PROMPTS, SamplingParams(max_new_tokens=NEW), 3)
    assert tokens == reference
    assert len({t for steps in trees for t, _ in steps}) >= 2  # more than one tree size ran
