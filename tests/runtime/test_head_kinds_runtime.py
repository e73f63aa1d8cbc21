"""The MTP, Medusa and EAGLE-1 heads and a two-layer EAGLE-3 head on the engine: greedy output
equals plain decoding (chain and tree, batch 1 and 4, eager torch and the Triton draft kernels
under the interpreter), seeded sampling gives the target's own tokens, rows move with their
drafter state (every layer's cache). (One-layer EAGLE-3: test_engine.py.)"""

from __future__ import annotations

import pytest

from specheads.heads.registry import head_kind
from specheads.runtime.engine import EngineError, SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import ar_tokens, make_target, random_head, random_prompts, run_joining, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
PROMPTS = TRAIN[:6]
NEW = 30
TREES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=3, num_draft_tokens=8)}


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


KINDS = {"mtp": dict(kind="mtp", num_modules=3), "medusa": dict(kind="medusa", num_heads=3, steps=100),
         "eagle": dict(kind="eagle"), "eagle3-2-layers": dict(kind="eagle3", num_layers=2)}


@pytest.fixture(scope="module", params=list(KINDS))
def head(target, request):
    return train_head(target, TRAIN, **KINDS[request.param])


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, NEW)


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("max_batch", [1, 4])
def test_greedy_output_equals_ar(target, head, reference, shape, max_batch):
    engine = SpecEngine(target, head, max_len=64, max_batch=max_batch, **TREES[shape])
    assert engine.method == head_kind(head.kind).default_method
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference
    steps = sum(r.steps for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    assert accepted / steps > 0.5, "the trained head should draft well on what it was trained on"


@needs_triton
def test_greedy_output_equals_ar_on_the_triton_draft_kernels(target, head, reference, monkeypatch):
    interpret_triton(monkeypatch)
    engine = SpecEngine(target, head, max_len=64, max_batch=4, **TREES["tree"])
    results = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=12))
    assert [r.token_ids for r in results] == [r[:12] for r in reference[:3]]


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=needs_triton)])
def test_fused_drafting_keeps_output_exact_and_drafts_as_the_modules(target, head, reference, kernels, monkeypatch):
    """The engine fuses the head on CUDA (drafter.prepare): its draft depths on the fused kernels
    (torch references here, or the Triton kernels interpreted) draft what the modules draft
    (bf16-free float32: the same accepted tokens), and with the int8 lm_head the output stays
    the target's."""
    import copy

    n, new = (6, NEW) if kernels == "torch" else (2, 10)
    params = SamplingParams(max_new_tokens=new)
    runs = {}
    for name, int8 in (("modules", None), ("fused", False), ("int8", True)):
        if kernels == "triton" and int8 is not None:  # the modules' run is the torch reference
            interpret_triton(monkeypatch)
        h = copy.deepcopy(head)
        engine = SpecEngine(target, h, max_len=64, max_batch=2, **TREES["tree"])
        if int8 is not None:
            # the head's drafter (the n-gram assist's inner one where the kind's method has the assist)
            getattr(engine.drafter, "inner", engine.drafter).lm_head_int8 = int8
            engine.drafter.prepare(engine.device)
            assert h.fused
            if h.kind == "medusa":  # each head's own projection, in int8 where asked
                assert all((p._lm_int8 is not None) == int8 for p in h.lm_heads)
        runs[name] = engine.generate(PROMPTS[:n], params)
        assert [r.token_ids for r in runs[name]] == [r[:new] for r in reference[:n]], name
    accepted = {name: [r.accepted_tokens for r in res] for name, res in runs.items()}
    assert accepted["fused"] == accepted["modules"]
    assert sum(accepted["int8"]) > 0


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("shared", [False, True])
def test_medusa_fused_readout_matches_the_modules(target, kernels, shared, monkeypatch):
    """MedusaHead.fuse_for_inference: the heads' logits through the stacked blocks and the
    projection kernel equal the modules' up to float rounding (the weights as loaded), and with the
    int8 copy stay within its rounding, for the first heads too; the drafter's lm_head_int8 option
    reaches the head."""
    import copy

    import torch

    head = random_head(target, kind="medusa", num_heads=3, shared_lm_head=shared)
    hidden = torch.randn(2, 1, head.config.hidden_size, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():  # blocks that are not the identity (as trained)
        for block in head.blocks:
            block.layers[0].weight.normal_(0, 0.05, generator=gen)
            block.layers[0].bias.normal_(0, 0.05, generator=gen)
    modules = head.draft_logits(hidden, 3)
    if kernels == "triton":
        interpret_triton(monkeypatch)
    for int8, heads in ((False, 3), (True, 3), (False, 2)):
        fused = copy.deepcopy(head).fuse_for_inference(lm_head_int8=int8)
        got = fused.draft_logits(hidden, heads)
        assert [g.shape for g in got] == [m.shape for m in modules[:heads]]
        for g, m in zip(got, modules):
            assert (g - m).abs().max() <= (0.02 if int8 else 1e-4) * m.abs().max()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    engine = SpecEngine(target, copy.deepcopy(head), max_len=64, drafter_options={"lm_head_int8": False},
                        **TREES["tree"])
    assert engine.drafter.inner.lm_head_int8 is False


def test_rows_move_with_their_drafter_state(target, head, reference):
    """Requests of different lengths leave at different steps: the last row moves into the
    freed one with its caches and rings, and the output stays exact."""
    engine = SpecEngine(target, head, max_len=64, max_batch=3, **TREES["tree"])
    budgets = [3, NEW, 7, NEW, 1, NEW]
    assert run_joining(engine, PROMPTS, budgets) == [ref[:n] for ref, n in zip(reference, budgets)]


def test_seeded_sampling_is_the_same_with_and_without_the_head(target, head):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=16)
    plain = SpecEngine(target, method="ar", max_len=64, max_batch=2).generate(PROMPTS[:4], params)
    spec = SpecEngine(target, head, max_len=64, max_batch=2, **TREES["tree"]).generate(PROMPTS[:4], params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


@pytest.mark.parametrize("kind, size, depth", [("mtp", {"num_modules": 2}, 2), ("medusa", {"num_heads": 2}, 2),
                                               ("eagle", {}, 6)])
def test_what_a_head_cannot_do_is_refused(target, kind, size, depth):
    head = random_head(target, kind=kind, **size)
    with pytest.raises(EngineError, match="static trees are not supported"):
        SpecEngine(target, head, static_tree="0;1;0,0", max_len=64)
    with pytest.raises(EngineError, match=f"needs a {kind} head; the head given is of kind 'eagle3'"):
        SpecEngine(target, random_head(target), method=kind, max_len=64)
    other = make_target(seed=1, vocab=80)
    with pytest.raises(EngineError, match="head expects vocab 64, target has 80"):
        SpecEngine(other, head, max_len=64)
    # a tree deeper than the head's modules is cut to them (EAGLE-1: one layer, any depth; the kind's own
    # method: with the n-gram assist the lookup's chain drafts deeper)
    assert SpecEngine(target, head, method=kind, num_steps=6, topk=1, max_len=64).num_steps == depth


def test_medusa_with_one_shared_projection_drafts_well_and_exactly(target, reference):
    """head.shared_lm_head: every head reads out through one projection (one product a step); the
    trained head's greedy output equals plain decoding, chain and tree, batch 1 and 4, and its
    drafts are taken."""
    head = train_head(target, TRAIN, kind="medusa", num_heads=3, steps=200, shared_lm_head=True)
    assert len(head.lm_heads) == 1
    for shape, max_batch in [(s, b) for s in TREES.values() for b in (1, 4)]:
        results = SpecEngine(target, head, max_len=64, max_batch=max_batch, **shape).generate(
            PROMPTS, SamplingParams(max_new_tokens=NEW))
        assert [r.token_ids for r in results] == reference
        assert sum(r.accepted_tokens for r in results) / sum(r.steps for r in results) > 0.5
