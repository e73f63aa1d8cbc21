"""The served-acceptance estimate without the decode loop equals what the engine measures
(greedy, batch 1, float32 on CPU) for each head kind, n-gram lookup and a standalone draft
model, prompt by prompt; and it rides along in `evaluate`."""

from __future__ import annotations

import copy

import pytest

from specheads.drafters.draft_model import DraftLM
from specheads.evaluation import estimate
from specheads.evaluation.estimate import root_chunks, served_acceptance, walk
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.runtime.spec_helpers import make_target, random_prompts, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)
NEW = 30
TREE = dict(num_steps=3, topk=3, num_draft_tokens=8)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def eagle3_head(target):
    """The EAGLE-3 head both tests below use (training it takes most of a test's time)."""
    return train_head(target, TRAIN, kind="eagle3")


def test_root_chunks_keep_within_rows_and_tokens():
    roots = list(range(10, 40))
    chunks = root_chunks(roots, rows=8, tokens=100)
    assert [r for c in chunks for r in c] == roots  # every root once, in order
    assert all(len(c) <= 8 and (len(c) == 1 or len(c) * max(c) <= 100) for c in chunks)
    assert [len(c) for c in chunks] == [6, 5, 4, 3, 3, 3, 2, 2, 2]  # 6 x 15 <= 100 < 7 x 16, ...
    assert [len(c) for c in root_chunks(roots, rows=4, tokens=1 << 30)] == [4] * 7 + [2]
    assert root_chunks([500, 501], rows=8, tokens=100) == [[500], [501]]  # one root a chunk at least
    assert root_chunks(roots, rows=64, tokens=1 << 30) == [roots]


def test_the_estimate_is_the_same_in_chunks_of_any_size(target, eagle3_head, monkeypatch):
    head = eagle3_head
    prompts, answers = TRAIN[:3], []
    answers = [r.token_ids for r in SpecEngine(target, method="ar", max_len=80).generate(
        prompts, SamplingParams(max_new_tokens=NEW))]
    whole = served_acceptance(target, head, "eagle3", TREE, prompts, answers)
    monkeypatch.setattr(estimate, "PREFILL_TOKENS", 24)  # a root or two a chunk
    assert served_acceptance(target, head, "eagle3", TREE, prompts, answers) == whole


def test_walk():
    # roots at 0, 3 (0 + 2 + 1), 4: 2 + 0 accepted, then a last step whose drafts the budget cuts
    assert walk([2, 9, 9, 0, 5, 9], 6) == (3, 2)
    assert walk([9] * 8, 6) == (1, 4)
    assert walk([0] * 5, 5) == (4, 0)


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "mtp", "medusa", "ngram", "draft_model"])
def test_the_estimate_equals_the_engines_acceptance(target, eagle3_head, kind):
    if kind == "ngram":
        head = None
    elif kind == "eagle3":
        head = eagle3_head
    elif kind == "draft_model":
        head = DraftLM(copy.deepcopy(target))
    else:
        head = train_head(target, TRAIN, kind=kind, **({"num_modules": 3} if kind == "mtp" else
                                                      {"num_heads": 3, "steps": 100} if kind == "medusa" else {}))
    prompts = TRAIN[:6]
    engine = SpecEngine(target, head, method=kind, max_len=80, max_batch=1, **TREE)
    served = engine.generate(prompts, SamplingParams(max_new_tokens=NEW))
    # ar's answers a tree's depth longer: the last step's tree is scored past the budget (the budget cuts the count)
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=80).generate(
        prompts, SamplingParams(max_new_tokens=NEW + TREE["num_steps"] + 1))]
    est = served_acceptance(target, head, kind, TREE, prompts, longer, [NEW] * len(prompts))
    assert [(e["steps"], e["accepted_tokens"]) for e in est] == [(r.steps, r.accepted_tokens) for r in served]
    assert sum(r.accepted_tokens for r in served) > 5, "the drafts should be accepted at times"


def test_evaluate_sets_the_estimate_beside_the_measure(tiny_target):
    from specheads.evaluation.run import evaluate, parse_methods
    from tests.evaluation.test_run import _prompts

    model, tok = tiny_target
    methods = parse_methods(["ngram@4"], (6, 4, 15))
    report = evaluate(model, tok, None, _prompts(), methods, max_new_tokens=10, progress=lambda s: None,
                      estimate=True)
    for cell in report["categories"].values():
        x = cell["ngram@4"]
        assert x["estimated_accept_length"] == pytest.approx(x["mean_accept_length"])
    assert "estimated_accept_length" in report["chat_macro_average"]["ngram@4"]


def test_the_estimate_follows_the_assists_gated_long_chain():
    """With the n-gram assist, and with its gated steps verifying a longer chain than the tree
    (ngram_gate_chain; by default GATE_CHAIN at batch 1 under the fixed policy), the estimate scores a matched root
    with that chain as the batch-1 engine verifies it, and with the ladder (ngram_gate_long) the ladder's chain
    after a fully accepted gated step: the same steps and accepted drafts, prompt by prompt, and each chain
    changes them."""
    target = make_target(seed=0, vocab=VOCAB, max_positions=192, std=0.1)  # answers that settle into long runs
    train = random_prompts(12, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3], seed=11)
    head = train_head(target, train, kind="eagle3")
    prompts, new = train[:6] + [[13, 33] * 5, [8, 8, 8, 8, 8]], 60
    longer = [r.token_ids for r in SpecEngine(target, method="ar", max_len=150).generate(
        prompts, SamplingParams(max_new_tokens=new + 25))]
    seen = {}
    # the tree's chain, the default's (with its ladder where the positions leave room), the default's
    # without a ladder, 20, and 8 with the ladder's 20 after a fully accepted gated step
    for options in ({"ngram_gate_chain": 0}, {}, {"ngram_gate_long": 0}, {"ngram_gate_chain": 20},
                    {"ngram_gate_chain": 8, "ngram_gate_long": 20}):
        engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=1, drafter_options=options,
                            **TREE)
        served = [(r.steps, r.accepted_tokens) for r in engine.generate(prompts, SamplingParams(max_new_tokens=new))]
        est = served_acceptance(target, head, "eagle3+ngram", TREE, prompts, longer, [new] * len(prompts),
                                options=options)
        assert [(e["steps"], e["accepted_tokens"]) for e in est] == served
        seen[(options.get("ngram_gate_chain"), options.get("ngram_gate_long"))] = served
    assert seen[None, None] != seen[0, None] and seen[20, None] != seen[0, None]
    assert seen[8, 20] not in (seen[20, None], seen[0, None])


def test_the_ladder_walk_takes_the_longer_chain_only_after_a_fully_accepted_gated_step():
    """ladder_walk: a gated root verifies the gated chain (2 drafts here), or the ladder's (5) right after
    a gated step that accepted all it verified; a tree step or a partly accepted chain resets it."""
    from specheads.evaluation.estimate import ladder_walk

    tree = [1] * 20  # the head's tree accepts one draft at every root
    chains = [-1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9]  # the lookup's chain, -1: no match
    kinds = {}
    # tokens emitted after each step: root 0 (the tree) 3, root 2 (the chain, all accepted) 6, root 5 (the
    # ladder) 12, root 11 (the ladder, 1 of 5 accepted) 14, root 13 (the chain) 17, root 16 (the ladder, cut
    # at the budget of 20) 20
    assert ladder_walk(tree, chains, 20, 2, 5, kinds) == (6, 13)
    assert kinds == {"tree": 1, "chain": 2, "ladder": 3}
    # without the ladder's chain longer than the gated one, it is the gated walk
    assert ladder_walk(tree, chains, 20, 2, 2) == walk([tree[i] if c < 0 else min(c, 2) for i, c in enumerate(chains)], 20)
