"""The n-gram assist (method KIND+ngram, drafters/assist.py): a head's tree, or where the history's
suffix repeats, the lookup's chain in its place. Greedy output equals plain decoding for every head
kind that can take the chain's deeper paths (chain and tree, batch 1 and 4, fixed and adaptive
policy), the chain is drafted and accepted past the head's depth where the output repeats, the
merged tree is the head's in rows without a match and the chain's in rows with one, and methods
that cannot take it are refused by name."""

from __future__ import annotations

import pytest
import torch

from specheads.drafters import DraftContext, DrafterError, DraftSetup, build_drafter, method_needs_head
from specheads.drafters.assist import GATE_CHAIN, GATE_LONG, NgramAssist, split_method
from specheads.runtime.engine import EngineError, Request, SpecControl, SpecEngine
from specheads.runtime.policy import FixedPolicy, TreeShape
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import ar_tokens, assert_targets_logprobs, make_target, random_prompts, train_head

VOCAB = 64
NEW = 60
# the ladder's tests: answers long enough that a ladder step runs before a request's last step (a step
# launched behind one where every row ends is not run)
LONG, LONG_LEN = 120, 160
TRAIN = random_prompts(12, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3], seed=11)
# std 0.2: a target whose greedy answers fall into short loops now and then (as small real ones do)
PROMPTS = TRAIN[:6] + [[13, 33] * 5, [8, 8, 8, 8, 8]]
TREES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=3, num_draft_tokens=8)}


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=192, std=0.2)


@pytest.fixture(scope="module", params=["eagle3", "eagle", "medusa"])
def head(target, request):
    extra = {"num_heads": 3} if request.param == "medusa" else {}
    return train_head(target, TRAIN, kind=request.param, **extra)


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, NEW, max_len=128)


def _run(engine, prompts, new=NEW):
    """Step the engine by hand: each request's tokens and every step's accepted drafts."""
    queue, handles, tokens, accepted = list(enumerate(prompts)), {}, {}, []
    while queue or engine.has_work:
        while queue and engine.free_slots > 0:
            i, p = queue.pop(0)
            h = engine.add(Request(p, SamplingParams(max_new_tokens=new)))
            handles[h], tokens[h] = i, []
        for out in engine.step():
            tokens[out.handle] += out.new_tokens
            if not out.prefill:
                accepted.append(out.accepted)
    return [tokens[h] for h in sorted(handles, key=handles.get)], accepted


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("max_batch", [1, 4])
def test_greedy_output_equals_ar_and_the_chain_runs_past_the_head(target, head, reference, shape, max_batch):
    kind = head.kind
    # (the assist alone: the gate off, so no step verifies a chain longer than the tree)
    engine = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=max_batch,
                        drafter_options={"ngram_gate": 0}, **TREES[shape])
    assert engine.method == f"{kind}+ngram" and isinstance(engine.drafter, NgramAssist)
    plain = SpecEngine(target, head, method=kind, max_len=128, max_batch=max_batch, **TREES[shape])
    n = plain.drafter.num_draft
    assert engine.drafter.depth == n  # the chain drafts as many tokens as the tree has nodes
    out, accepted = _run(engine, PROMPTS)
    assert out == reference
    assert max(accepted) <= n
    if shape == "tree":  # where the answer repeats, the chain was drafted and accepted past the head's depth
        assert max(accepted) > plain.drafter.depth
        _, alone = _run(plain, PROMPTS)
        assert sum(accepted) / len(accepted) > sum(alone) / len(alone)


def test_adaptive_policy_switches_tiers_and_keeps_output(target, reference):
    head = train_head(target, TRAIN)
    engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=4, speculation_policy="adaptive",
                        speculation_settings="explore_every=4", **TREES["tree"])
    tiers = [str(t) for t in engine.policy.tiers]
    assert tiers[-1] == f"{GATE_LONG},3,8" and "1,1,1" in tiers  # the full tier reaches the ladder's depth
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference
    used = set()
    for r in results:
        used |= set(r.steps_by_tree)
    assert len(used) > 1, used


def test_sampled_output_follows_the_target_noise(target):
    """Seeded sampling: the target's counter-based noise decides every token, drafts or not."""
    head = train_head(target, TRAIN)
    params = SamplingParams(max_new_tokens=30, temperature=0.8, seed=5)
    ref = [r.token_ids for r in SpecEngine(target, method="ar", max_len=128).generate(PROMPTS[:4], params)]
    engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=4, **TREES["tree"])
    assert [r.token_ids for r in engine.generate(PROMPTS[:4], params)] == ref


class _Fixed:
    """A stand-in head drafter: the same tree (tokens 40.., a chain of 3 under a fan) every step."""

    from specheads.drafters.base import Abilities
    abilities = Abilities(on_device=True, trees=True, tiers=False)
    needs = __import__("specheads.drafters.base", fromlist=["Needs"]).Needs()
    depth, num_draft, topk = 2, 4, 2

    def accept_depth(self, depth):
        self.accepted_depth = depth

    def propose(self, ctx):
        from specheads.runtime.tree import Tree
        b = ctx.rows
        tokens = torch.cat([ctx.roots[:, None], torch.arange(40, 44).expand(b, 4)], 1)
        parents = torch.tensor([-1, 0, 0, 1, 1]).expand(b, 5)
        depth = torch.tensor([0, 1, 1, 2, 2]).expand(b, 5)
        return Tree(tokens, parents, depth, torch.ones(b, 5, dtype=torch.bool), 2)


def test_merged_tree_takes_the_chain_only_where_the_suffix_repeats():
    inner = _Fixed()
    assist = NgramAssist(inner, max_ngram=4, min_ngram=3)
    assert inner.accepted_depth == 4 and assist.depth == 4
    assist.lookup.allocate(2, 32, "cpu", torch.float32)
    assist._allocate_chain("cpu")
    # row 0: ... 1 2 3 9 1 2 | root 3: "1 2 3" occurred before, followed by 9 1 2 3
    # row 1: 5 6 7 8 | root 6: only a 1-gram match (6), below min_ngram 3
    rows = [[1, 2, 3, 9, 1, 2], [5, 6, 7, 8]]
    roots = torch.tensor([3, 6])
    for i, r in enumerate(rows):  # (the row state holds the root at the history's length)
        assist.lookup.tokens[i, : len(r) + 1] = torch.tensor(r + [int(roots[i])])
        assist.lookup.length[i] = len(r)
    tree = assist.propose(DraftContext(2, 16, roots))
    assert tree.tokens.tolist() == [[3, 9, 1, 2, 3], [6, 40, 41, 42, 43]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3], [-1, 0, 0, 1, 1]]
    assert tree.depth.tolist() == [[0, 1, 2, 3, 4], [0, 1, 1, 2, 2]]
    assert tree.valid.all() and tree.max_depth == 4
    assert tree.ranks()[0].tolist() == [0, 1, 2, 3, 4]


def test_methods_and_refusals(target):
    assert split_method("eagle3+ngram") == ("eagle3", True) and split_method("ngram") == ("ngram", False)
    assert method_needs_head("eagle3+ngram") and not method_needs_head("ngram")
    head = train_head(target, TRAIN[:2], steps=2, kind="mtp", num_modules=3)
    with pytest.raises(EngineError, match=r"mtp\+ngram: .*MTPDrafter commits paths of at most 3"):
        SpecEngine(target, head, method="mtp+ngram", max_len=64, num_steps=3, topk=2, num_draft_tokens=6)
    with pytest.raises(EngineError, match=r"'ar\+ngram'.*KIND\+ngram"):
        SpecEngine(target, method="ar+ngram", max_len=64)
    with pytest.raises(EngineError, match="ngram_min must be in"):
        SpecEngine(target, head, method="mtp+ngram", max_len=64, drafter_options={"ngram_min": 5})
    assert DrafterError  # (EngineError carries the drafter's message)


@needs_triton
def test_greedy_output_equals_ar_on_the_triton_kernels(target, reference, monkeypatch):
    """The lookup's kernel (its min_ngram match) and the draft and verify kernels, interpreted."""
    head = train_head(target, TRAIN)
    interpret_triton(monkeypatch)
    engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=2, **TREES["tree"])
    out, _ = _run(engine, PROMPTS[-2:], new=16)
    assert out == [r[:16] for r in reference[-2:]]


def _gated_steps(engine) -> list[bool]:
    """Record, for every step the engine launches, whether the gate ran it without the head's tree."""
    seen, launch = [], engine._launch

    def spy(*args, **kwargs):
        out = launch(*args, **kwargs)
        seen.append(out.gated)
        return out

    engine._launch = spy
    return seen


@pytest.mark.parametrize("max_batch", [1, 4])
def test_the_gate_changes_a_steps_cost_not_its_drafts(target, head, reference, max_batch):
    """With the gate (ngram_gate; its chain the tree's, ngram_gate_chain 0), a full-tree step whose
    rows all match skips the head's tree and verifies the lookup's chain, as the full step would have: the same output and the same drafts
    accepted at every step as without it; at batch 1 it gates where the answer repeats."""
    kind = head.kind
    runs = {}
    for gate in (0, max_batch):
        engine = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=max_batch,
                            drafter_options={"ngram_gate": gate, "ngram_gate_chain": 0, "ngram_gate_long": 0},
                            **TREES["tree"])
        gated = _gated_steps(engine)
        runs[gate] = _run(engine, PROMPTS) + (gated,)
    (out0, acc0, gated0), (out1, acc1, gated1) = runs[0], runs[max_batch]
    assert out0 == out1 == reference
    assert acc1 == acc0
    assert not any(gated0)
    if max_batch == 1:
        assert sum(gated1) >= 5, sum(gated1)


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_gated_chain_longer_than_the_tree_keeps_the_output(target, head, reference, max_batch):
    """ngram_gate_chain: a gated step verifies a chain of up to that many drafts (its own verify
    width), other steps the tree as before: the output stays the target's, gated steps accept past
    the tree's draft count where the answer repeats (batch 1), and sampled output keeps its
    counter-based noise."""
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    engine = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=max_batch,
                        drafter_options={"ngram_gate": max_batch, "ngram_gate_chain": 3 * n, "ngram_gate_long": 0},
                        **TREES["tree"])
    assert engine.max_drafts == 3 * n and engine.num_draft_tokens == n and engine.num_steps == 3 * n
    gated = _gated_steps(engine)
    out, accepted = _run(engine, PROMPTS)
    assert out == reference
    if max_batch == 1:  # only a gated step verifies more than the tree's n drafts
        assert any(gated) and max(accepted) > n
    params = SamplingParams(max_new_tokens=30, temperature=0.8, seed=5)
    ref = [r.token_ids for r in SpecEngine(target, method="ar", max_len=128).generate(PROMPTS[:4], params)]
    assert [r.token_ids for r in engine.generate(PROMPTS[:4], params)] == ref
    with pytest.raises(EngineError, match="ngram_gate_chain sets the chain of the gate's steps: it needs the gate"):
        SpecEngine(target, head, method=f"{kind}+ngram", max_len=128,
                   drafter_options={"ngram_gate": 0, "ngram_gate_chain": 20}, **TREES["tree"])
    mine = FixedPolicy(TreeShape(3, 3, n))
    mine.name = "mine"  # a custom policy: the gate stays off unless asked
    with pytest.raises(EngineError, match="the gate is off under the mine policy unless asked: add ngram_gate=1"):
        SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, speculation_policy=mine,
                   drafter_options={"ngram_gate_chain": 20}, **TREES["tree"])


def test_only_a_gated_batch_feeds_the_long_chains_width_and_a_join_after_a_gated_step_catches_up(
        target, head, reference, monkeypatch):
    """A head that keeps its pending entries (EAGLE-3, EAGLE-1) feeds them at a fixed width a step:
    the gated chain's (ngram_gate_chain + 1) only after a gated step, the tree's (num_draft + 1)
    otherwise. A request that joins right after a gated step makes the batch wider than the gate's
    while its rows hold up to the gated chain's path: a plain step feeds them at the long width
    first. No step feeds fewer entries than a row holds, and the output stays the target's."""
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    engine = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=4,
                        drafter_options={"ngram_gate": 1, "ngram_gate_chain": 3 * n, "ngram_gate_long": 0},
                        **TREES["tree"])
    feeds, steps = [], []  # (rows stepped, width fed, the most entries a row held); (rows, tier, wide)
    inner = type(engine.drafter.inner)
    if hasattr(inner, "_feed"):
        feed = inner._feed

        def spy_feed(self, b, kv, masks=None, width=None):
            feeds.append((b, width or self.width, int(self.pending_n[:b].max())))
            return feed(self, b, kv, masks, width)
        monkeypatch.setattr(inner, "_feed", spy_feed)
    step = engine._step

    def spy_step(b, kv, sampled, tier, logprobs=False, wide=0):
        steps.append((b, tier, wide))
        return step(b, kv, sampled, tier, logprobs, wide)
    engine._step = spy_step
    gated = _gated_steps(engine)
    # one repeating request alone until the gate runs a step, then a second joins
    first = engine.add(Request(PROMPTS[-2], SamplingParams(max_new_tokens=NEW)))
    tokens = {first: []}
    while not any(gated):
        for out in engine.step():
            tokens[out.handle] += out.new_tokens
    assert engine._gated_last
    second = engine.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=NEW)))
    tokens[second] = []
    joined = len(steps)
    while engine.has_work:
        for out in engine.step():
            tokens[out.handle] += out.new_tokens
    assert [tokens[first], tokens[second]] == [reference[-2], reference[0]]
    b, tier, wide = steps[joined]  # the step after the join: plain, feeding the gated chain's paths
    assert b > engine._gate_rows and tier == 0 and wide == 2
    assert all(w != 2 for b, _, w in steps[:joined] + steps[joined + 1:] if b > engine._gate_rows)
    after = [w for (_, _, w), g in zip(steps[1:], gated) if g]  # the steps launched right after a gated one
    assert after and all(w == 2 for w in after)
    if feeds:
        assert all(held <= width for _, width, held in feeds), feeds
        widths = {(b <= engine._gate_rows, width) for b, width, _ in feeds if width > 1}
        assert {(True, n + 1), (False, n + 1), (False, 3 * n + 1)} <= widths, widths  # (False, long): the catch-up
    # one row at a time: the steps after a gated one feed the long width, the others the tree's
    feeds.clear()
    alone = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=1,
                       drafter_options={"ngram_gate": 1, "ngram_gate_chain": 3 * n}, **TREES["tree"])
    gated = _gated_steps(alone)
    assert _run(alone, PROMPTS[-2:-1])[0] == reference[-2:-1]
    assert any(gated)
    if feeds:
        assert all(held <= width for _, width, held in feeds), feeds
        assert {width for _, width, _ in feeds if width > 1} == {n + 1, 3 * n + 1}


def test_start_up_captures_the_catch_up_step_of_every_batch_wider_than_the_gates(target, head, monkeypatch):
    """The steps that feed a gated step's paths (`SpecEngine._fed`) are among the graphs captured at
    start: in the gate's batches every step's variant, in wider ones the plain catch-up after rows
    joined, for every context bucket, so no request waits on a capture (capture needs CUDA: recorded
    here)."""
    engine = SpecEngine(target, head, method=f"{head.kind}+ngram", max_len=120, max_batch=4,
                        drafter_options={"ngram_gate_long": 0}, **TREES["tree"])
    engine.use_graphs = True
    monkeypatch.setattr(engine, "_capture", lambda *key: ("step",) + key)
    monkeypatch.setattr(engine, "_prefill_graph", lambda width, sampled: None)
    engine.capture_common((1, 2, 3, 4))
    steps = {k for k in engine.graphs if k[0] != "prefill"}
    report = engine.graph_report
    gate = engine._gate_rows
    tiers = [0, *range(1, engine._full + 1), engine._gated]
    narrow = {(b, kv, False, t, False, 2) for b in report["batch_buckets"] if b <= gate
              for kv in report["context_buckets"] for t in tiers}
    wide = {(b, kv, False, 0, False, 2) for b in report["batch_buckets"] if b > gate
            for kv in report["context_buckets"]}
    assert narrow and wide and (narrow | wide) == {k for k in steps if len(k) > 5 and k[5] == 2}



@pytest.fixture(scope="module")
def looping():
    """A target whose greedy answers settle into long runs (std 0.1): an answer that copies far."""
    return make_target(seed=0, vocab=VOCAB, max_positions=256, std=0.1)  # (room for LONG_LEN and the ladder)


def _ladder_run(engine, prompts, params, spec=None):
    """Each request's tokens (all admitted as rows free up) and the chain's drafts of every launched step
    that the gate ran (0 for the others)."""
    gated = _gated_steps(engine)
    queue, handles, tokens = list(enumerate(prompts)), {}, {}
    while queue or engine.has_work:
        while queue and engine.free_slots > 0:
            i, prompt = queue.pop(0)
            h = engine.add(Request(prompt, params, spec=spec or SpecControl()))
            handles[h], tokens[h] = i, []
        for out in engine.step():
            tokens[out.handle] += out.new_tokens
    return [tokens[h] for h in sorted(handles, key=handles.get)], gated


@pytest.mark.parametrize("max_batch", [1, 4])
def test_the_ladder_verifies_its_longer_chain_after_a_fully_accepted_gated_step(looping, head, max_batch):
    """ngram_gate_long: a gated step right after a gated one whose rows all drafted and accepted the whole
    chain verifies the ladder's chain (its own verify width), any other gated step the gated chain: the
    output stays the target's, greedy and sampled, a long copy takes fewer steps, the steps after a ladder
    step feed its paths at its width, and a request whose own draft limit cuts the chain gets no ladder."""
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    copying = [TRAIN[2], TRAIN[3]] * (max_batch // 2 or 1)  # (answers that settle into one long run)
    prompts = PROMPTS + copying
    reference = ar_tokens(looping, prompts, LONG, max_len=LONG_LEN)
    options = {"ngram_gate": max_batch, "ngram_gate_chain": 2 * n}
    runs = {}
    for long in (0, 5 * n):
        engine = SpecEngine(looping, head, method=f"{kind}+ngram", max_len=LONG_LEN, max_batch=max_batch,
                            drafter_options={**options, "ngram_gate_long": long}, **TREES["tree"])
        assert engine.max_drafts == (long or 2 * n) and engine.num_steps == (long or 2 * n)
        steps = []
        step = engine._step

        def spy_step(b, kv, sampled, tier, logprobs=False, wide=0, step=step, steps=steps):
            steps.append(wide)
            return step(b, kv, sampled, tier, logprobs, wide)
        engine._step = spy_step
        out, gated = _ladder_run(engine, prompts, SamplingParams(max_new_tokens=LONG))
        assert out == reference
        runs[long] = (len(gated), gated, steps)
    (n0, gated0, _), (n1, gated1, steps1) = runs[0], runs[5 * n]
    assert 5 * n not in gated0
    # the ladder ran, only right behind a gated step, and the copies took fewer steps
    assert 5 * n in gated1 and all(gated1[i - 1] for i, g in enumerate(gated1) if g == 5 * n)
    assert n1 < n0
    # the step after a gated one feeds the chain's paths (wide 2), after a ladder step the ladder's (3)
    # (at batch 4 a ladder step may be the rows' last: no step runs behind one where every row ends)
    fed = {(g, w) for g, w in zip(gated1, steps1[1:]) if g}
    assert fed <= {(2 * n, 2), (5 * n, 3)} and (2 * n, 2) in fed and ((5 * n, 3) in fed or max_batch > 1)
    # sampled output keeps its counter-based noise, with ladder steps among its steps (batch 1)
    params = SamplingParams(max_new_tokens=LONG, temperature=0.2, seed=5)
    ref = [r.token_ids for r in SpecEngine(looping, method="ar", max_len=LONG_LEN).generate(copying, params)]
    gated = _gated_steps(engine)
    assert [r.token_ids for r in engine.generate(copying, params)] == ref
    assert 5 * n in gated or max_batch > 1  # (four sampled rows rarely all copy at once)
    # a request that lets a step draft 3 tokens never takes the ladder (its chain is always cut to 3)
    out, gated = _ladder_run(engine, copying, SamplingParams(max_new_tokens=LONG), SpecControl(num_draft_tokens=3))
    assert out == reference[len(PROMPTS):] and any(gated) and 5 * n not in gated


@pytest.mark.parametrize("temperature", [0.0, 0.2])
def test_logprobs_through_gated_and_ladder_steps_are_the_targets_own(looping, head, temperature):
    """With the default drafting at batch 1 (the gate, its chain and the ladder, unset), a request that asks
    for log-probabilities gets the target's own at every token, the gated and ladder steps' among them."""
    copying = [TRAIN[2], TRAIN[3]]
    engine = SpecEngine(looping, head, method=f"{head.kind}+ngram", max_len=LONG_LEN, max_batch=1, **TREES["tree"])
    assert engine.drafter.gate_long == GATE_LONG
    gated = _gated_steps(engine)
    for i, prompt in enumerate(copying):
        h = engine.add(Request(prompt, SamplingParams(max_new_tokens=LONG, temperature=temperature, seed=3 + i),
                               top_logprobs=2))
        tokens, lps = [], []
        while engine.has_work:
            for out in engine.step():
                assert out.handle == h and len(out.logprobs) == len(out.new_tokens)
                tokens += out.new_tokens
                lps += out.logprobs
        assert_targets_logprobs(looping, prompt, tokens, lps, 2)
    assert GATE_LONG in gated  # (the answers copy: the ladder ran)


def test_the_ladder_under_the_adaptive_policy_and_its_graphs_at_start_up(looping, head, monkeypatch):
    """The ladder's steps count as the full tree's under the adaptive policy, and start-up captures the
    ladder's step and every step after one: all of them in the gate's batches, the plain catch-up in a
    wider one (recorded: capture needs CUDA)."""
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    copying = [TRAIN[2], TRAIN[3]]
    options = {"ngram_gate_chain": 2 * n, "ngram_gate_long": 5 * n}
    adaptive = SpecEngine(looping, head, method=f"{kind}+ngram", max_len=128, max_batch=1, speculation_policy="adaptive",
                          drafter_options=options, **TREES["tree"])
    out, gated = _ladder_run(adaptive, PROMPTS + copying, SamplingParams(max_new_tokens=NEW))
    assert out == ar_tokens(looping, PROMPTS + copying, NEW, max_len=128) and 5 * n in gated
    engine = SpecEngine(looping, head, method=f"{kind}+ngram", max_len=128, max_batch=4, drafter_options=options,
                        **TREES["tree"])
    engine.use_graphs = True
    monkeypatch.setattr(engine, "_capture", lambda *key: ("step",) + key)
    monkeypatch.setattr(engine, "_prefill_graph", lambda width, sampled: None)
    engine.capture_common((1, 2))
    keys = {k for k in engine.graphs if k[0] != "prefill"}
    assert engine._gate_rows == 1
    tiers = [0, *range(1, engine._full + 1), engine._gated, engine._gated_long]
    kvs = engine.graph_report["context_buckets"]
    assert {(1, kv, False, t, False, w) for kv in kvs for t in tiers for w in (2, 3)} <= keys
    assert {(1, kv, False, engine._gated_long) for kv in kvs} <= keys
    assert {(2, kv, False, 0, False, w) for kv in kvs for w in (2, 3)} <= keys
    assert not any(k[0] == 2 and k[3] in (engine._gated, engine._gated_long) for k in keys)


def test_the_ladder_is_refused_without_the_gate_or_shorter_than_its_chain(target, head):
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    with pytest.raises(EngineError, match="ngram_gate_long sets the chain of a gated step after a fully accepted one"):
        SpecEngine(target, head, method=f"{kind}+ngram", max_len=128,
                   drafter_options={"ngram_gate": 0, "ngram_gate_long": 40}, **TREES["tree"])
    with pytest.raises(EngineError, match=r"ngram_gate_long=20 must be longer than the gated chain \(31 drafts\)"):
        SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, drafter_options={"ngram_gate_long": 20},
                   **TREES["tree"])
    with pytest.raises(EngineError, match="ngram_gate_long=100 needs room past the longest sequence"):
        SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, drafter_options={"ngram_gate_long": 100},
                   **TREES["tree"])

def test_a_wider_batch_weighs_and_records_the_full_tier_at_the_trees_draft_count(target, head, reference):
    """Under the adaptive policy the assist's full tier is as deep as its gated chain, which runs only
    in the gate's batches: a wider batch's choice is told depth caps of at most the tree's draft count
    (an estimate over the gated chain's depths would overprice the full tree there), and a full-tree
    step that was not gated records what it offered, at most that many; the gate's batches are told
    the gated chain's depth."""
    kind, n = head.kind, TREES["tree"]["num_draft_tokens"]
    # (share_all 0: these prompts' steps then reach a batch of one drafting row, the gate's batch)
    engine = SpecEngine(target, head, method=f"{kind}+ngram", max_len=128, max_batch=4, speculation_policy="adaptive",
                        drafter_options={"ngram_gate": 1, "ngram_gate_chain": 3 * n, "ngram_gate_long": 0},
                        speculation_settings="share_all=0", **TREES["tree"])
    told, offered = [], []
    choose, observe = engine.policy.choose, engine.policy.observe

    def spy_choose(rows, batch, kv, *args, **kwargs):
        told.append((batch, max(r[1] for r in rows if r is not None)))
        return choose(rows, batch, kv, *args, **kwargs)

    def spy_observe(rows, tier, offers, accepted):
        offered.append((tier, max(offers)))
        return observe(rows, tier, offers, accepted)
    engine.policy.choose, engine.policy.observe = spy_choose, spy_observe
    gated = _gated_steps(engine)
    out, _ = _run(engine, PROMPTS)
    assert out == reference
    assert {cap for b, cap in told if b > 1} == {n} and {cap for b, cap in told if b == 1} == {3 * n}
    full = len(engine.policy.tiers)
    deep = [o for tier, o in offered if tier == full and o > n]
    assert len(deep) == sum(gated) and set(deep) <= {3 * n}  # only gated steps offered past the tree


def test_the_gate_its_long_chain_and_the_ladder_are_on_at_batch_1_by_default(target, head):
    """Measured to pay at batch 1 on an H200 under the fixed and the adaptive policy
    (drafters/assist.py): unset, the engine gates batches of one row under either, its gated steps
    verifying the lookup's chain up to GATE_CHAIN drafts and, right after a gated step that accepted
    all it drafted, up to GATE_LONG (the ladder), each where the sequence leaves room for it; set, as
    it says. A drafter built outside an engine leaves the gate for the engine to settle."""
    n = TREES["tree"]["num_draft_tokens"]

    def engine(max_len=128, **kw):  # the target holds 192 positions
        e = SpecEngine(target, head, method=f"{head.kind}+ngram", max_len=max_len, max_batch=1, **TREES["tree"], **kw)
        e._allocate()
        return e
    fixed = engine()
    assert fixed.drafter.gate == 1 and fixed.gate_rows == 1 and fixed._gated is not None
    assert fixed.drafter.gate_chain == GATE_CHAIN and fixed.drafter.gate_long == GATE_LONG > GATE_CHAIN
    assert fixed.max_drafts == GATE_LONG and fixed.num_draft_tokens == n and fixed._gated_long is not None
    adaptive = engine(speculation_policy="adaptive")
    assert adaptive.gate_rows == 1 and adaptive._gated is not None and adaptive.max_drafts == GATE_LONG
    unasked = engine(speculation_policy="adaptive", drafter_options={"ngram_gate": 0})
    assert unasked.gate_rows == 0 and unasked._gated is None and unasked.max_drafts == n
    assert unasked.drafter.gate_long == 0
    off = engine(drafter_options={"ngram_gate": 0})
    assert off.gate_rows == 0 and off._gated is None and off.max_drafts == n == off.num_steps
    no_ladder = engine(drafter_options={"ngram_gate_long": 0})
    assert no_ladder.drafter.gate_long == 0 and no_ladder.max_drafts == GATE_CHAIN
    tree_chain = engine(drafter_options={"ngram_gate_chain": 0})  # 0: the tree's draft count
    assert tree_chain.gate_rows == 1 and tree_chain.drafter.gate_chain == n and tree_chain.max_drafts == GATE_LONG
    # past the longest sequence a chain needs room: the ladder where 64 positions are left, the gated
    # chain where 32 are, else the tree's chain
    assert engine(max_len=192 - GATE_LONG - 1).max_drafts == GATE_LONG
    assert engine(max_len=192 - GATE_LONG).max_drafts == GATE_CHAIN == engine(max_len=192 - GATE_CHAIN - 1).max_drafts
    tight = engine(max_len=192 - GATE_CHAIN)
    assert tight.gate_rows == 1 and tight.max_drafts == n and tight.drafter.gate_long == 0
    built = build_drafter(f"{head.kind}+ngram", DraftSetup(target, head, options={}, **TREES["tree"]))
    assert built.gate is None and built.gate_chain == n and built.gate_long == 0


def test_the_gate_keeps_sampled_output_and_the_adaptive_policy(target, reference):
    head = train_head(target, TRAIN)
    params = SamplingParams(max_new_tokens=30, temperature=0.8, seed=5)
    ref = [r.token_ids for r in SpecEngine(target, method="ar", max_len=128).generate(PROMPTS[:4], params)]
    engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=1,
                        drafter_options={"ngram_gate": 1}, **TREES["tree"])
    gated = _gated_steps(engine)
    assert [r.token_ids for r in engine.generate(PROMPTS[:4], params)] == ref
    assert any(gated)
    engine = SpecEngine(target, head, method="eagle3+ngram", max_len=128, max_batch=1, speculation_policy="adaptive",
                        drafter_options={"ngram_gate": 1}, **TREES["tree"])
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference
    # (the static costs here pick the smaller tiers most of the time; the gate takes any drafting step whose
    # lookup matched)
    # a gated step counts as the full tree's to the policy (it is that step, without the head's tree)
    assert set().union(*(r.steps_by_tree for r in results)) <= {"none"} | {str(t) for t in engine.policy.tiers}


@pytest.mark.parametrize("buckets", [False, True])
def test_the_gate_takes_a_smaller_tiers_step_where_the_lookup_matches(looping, head, buckets):
    """Under the adaptive policy the gate runs the lookup's chain in place of whichever tree the policy
    chose (here always the smallest tier): every step the lookup matched behind a drafting step is gated,
    in a context bucket with room for the chain, and the output is the target's own."""
    from tests.runtime.test_tiers import scripted

    kind = head.kind
    copying = [TRAIN[2], TRAIN[3]]
    probe = SpecEngine(looping, head, method=f"{kind}+ngram", max_len=128, max_batch=1,
                       speculation_policy="adaptive", **TREES["tree"])
    policy = scripted(probe.full_tree, "1,1,1;2,1,2", schedule=[1])
    engine = SpecEngine(looping, head, method=f"{kind}+ngram", max_len=128, max_batch=1, speculation_policy=policy,
                        drafter_options={"ngram_gate": 1}, **TREES["tree"])  # (a policy object: the gate asked for)
    engine.buckets = buckets
    planned, launch = [], engine._launch

    def spy(ahead, plan=None):
        out = launch(ahead, plan)
        planned.append((plan[3] if plan else None, out.gated, plan[1] if plan else None))
        return out

    engine._launch = spy
    out, _ = _run(engine, PROMPTS + copying, new=NEW)
    assert out == ar_tokens(looping, PROMPTS + copying, NEW, max_len=128)
    gated = [p for p in planned if p[1]]
    assert gated and all(t in (engine._gated, engine._gated_long) for t, _, _ in gated)
    assert sum(1 for t, g, _ in planned if t == 1 and not g) > 0  # the chosen tier where the lookup missed
    if buckets:  # (each gated step's context bucket holds the chain after the step in flight)
        assert all(kv >= 1 + engine.drafter.gate_chain for _, _, kv in gated)


def test_lookup_only_drafts_the_chain_or_the_root_alone():
    inner = _Fixed()
    assist = NgramAssist(inner, max_ngram=4, min_ngram=3, gate=1)
    assist.lookup.allocate(2, 32, "cpu", torch.float32)
    assist._allocate_chain("cpu")
    inner.keep_up = lambda ctx, wide=True: setattr(inner, "kept", ctx.rows)
    rows, roots = [[1, 2, 3, 9, 1, 2], [5, 6, 7, 8]], torch.tensor([3, 6])
    for i, r in enumerate(rows):
        assist.lookup.tokens[i, : len(r) + 1] = torch.tensor(r + [int(roots[i])])
        assist.lookup.length[i] = len(r)
    ctx = DraftContext(2, 16, roots)
    assert assist.next_found(ctx).tolist() == [True, False]
    tree = assist.lookup_only().propose(ctx)
    assert inner.kept == 2  # the head took in the last path, and drafted nothing
    assert tree.size == 1 + assist.num_draft and tree.max_depth == 4
    assert tree.tokens[0].tolist() == [3, 9, 1, 2, 3] and tree.valid[0].all()
    assert not tree.valid[1, 1:].any()  # no match: the root alone
    with pytest.raises(ValueError, match="ngram_gate must be a batch size"):
        NgramAssist(_Fixed(), gate=-1)


def test_drafter_options_in_a_method_spec():
    from specheads.drafters import parse_options
    from specheads.evaluation.run import parse_methods
    from specheads.evaluation.suite import SuiteError

    assert parse_options("ngram_gate=1, lm_head_int8=false,x=a") == {"ngram_gate": 1, "lm_head_int8": False, "x": "a"}
    with pytest.raises(DrafterError, match="expected name=value"):
        parse_options("ngram_gate")
    m = parse_methods(["eagle3+ngram@6,4,15:ngram_gate=1"], (6, 4, 15))[1]
    assert (m.name, m.method, m.options) == ("eagle3+ngram@6,4,15:ngram_gate=1", "eagle3+ngram", (("ngram_gate", 1),))
    with pytest.raises(SuiteError, match="expected name=value"):
        parse_methods(["eagle3:gate"], (6, 4, 15))
    with pytest.raises(SuiteError, match=r":name=value"):
        parse_methods(["ngram@4:ngram_gate=1"], (6, 4, 15))
    # options joined with ':' are two options (they once reached the drafter as one value, '47:ngram_max=6')
    m = parse_methods(["eagle3+ngram@6,4,15:ngram_gate_chain=47:ngram_max=6"], (6, 4, 15))[1]
    assert m.options == (("ngram_gate_chain", 47), ("ngram_max", 6))
    with pytest.raises(DrafterError, match="separate options with ','"):
        parse_options("ngram_gate_chain=47:ngram_max=6")


def test_no_step_runs_behind_one_where_every_row_ends(target, head, reference):
    """Where every row ends in the step in flight, nothing is launched behind it: the assist's gate reads
    that step first (a budget or a stop); without the gate a step that may reach every row's budget is
    read first (`SpecEngine._all_end`), one that holds every row's last token of budget is not launched
    behind, and a stop long before the budget still has a step run behind it (dropped). Every other
    launched step is one a request counts; outputs stay plain decoding's."""
    budgets = [NEW, 9, 1, 17, NEW, 5, 30, 2]
    stop = reference[4][6]  # (a stop token in one answer: it ends at the stop, before its budget)
    for method in (f"{head.kind}+ngram", head.kind, "ar"):
        engine = SpecEngine(target, head if method != "ar" else None, method=method, max_len=128, max_batch=1,
                            **(TREES["tree"] if method != "ar" else {}))
        launched = []
        launch = engine._launch
        engine._launch = lambda *a, **k: launched.append(1) or launch(*a, **k)
        tokens, steps = [], 0
        for i, (prompt, n) in enumerate(zip(PROMPTS, budgets)):
            r = engine.generate([prompt], SamplingParams(max_new_tokens=n), stop_ids=[stop] if i == 4 else ())[0]
            tokens.append(r.token_ids)
            steps += r.steps
        want = [ref[:n] for ref, n in zip(reference, budgets)]
        want[4] = reference[4][:reference[4].index(stop)]
        assert tokens == want
        # (without the gate one step runs behind the answer that ends at its stop, long before its budget:
        # a budget's end is seen coming, the step in flight read where it may end the request)
        assert len(launched) == steps + (not method.endswith("+ngram"))
