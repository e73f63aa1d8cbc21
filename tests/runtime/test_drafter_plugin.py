"""A drafter written here, in the test, registered under a method name: the engine runs it
with no edit anywhere else, and greedy output equals plain decoding (`ar`).

Two kinds: a device drafter (proposes and commits inside the step, keeps per-row state that
must follow its row when rows move) and a host drafter (proposes from the token histories)."""

from __future__ import annotations

import pytest
import torch

from specheads.drafters import (Abilities, DraftContext, Drafter, DraftSetup, Needs, StepResult, method_names,
                                register_method, unregister_method)
from specheads.runtime.engine import EngineError, Request, SpecEngine
from specheads.runtime.sampling import SamplingParams
from specheads.runtime.tree import Tree
from tests.runtime.spec_helpers import ar_tokens, make_target, random_prompts

VOCAB = 64
PROMPTS = random_prompts(7, VOCAB, [3, 9, 1, 12, 5, 7, 2], seed=4)


class BigramDrafter(Drafter):
    """On the device: a fixed token -> next-token table, two children under the root (the
    table's two guesses) and a chain under the first. Per row it counts the drafts the
    target accepted (state that moves with its row)."""

    needs = Needs()
    abilities = Abilities(on_device=True, trees=True)

    def __init__(self, table: torch.Tensor, depth: int = 3):
        self.table = table  # [V, 2]
        self.depth = depth
        self.num_draft = depth + 1
        self.parents = torch.tensor([-1, 0, 0] + list(range(2, depth + 1)))
        self.levels = torch.tensor([0, 1, 1] + list(range(2, depth + 1)))

    def allocate(self, rows, cap, device, dtype):
        self.accepted = torch.zeros(rows, dtype=torch.long, device=device)
        self.parents, self.levels, self.table = (t.to(device) for t in (self.parents, self.levels, self.table))

    def state(self):
        return [self.accepted]

    def move_row(self, src, dst, length):
        self.accepted[dst] = self.accepted[src]

    def clear_row(self, row):
        self.accepted[row] = 0

    def propose(self, ctx: DraftContext) -> Tree:
        b, roots = ctx.rows, ctx.roots
        first, second = self.table[roots, 0], self.table[roots, 1]
        chain = [first]
        for _ in range(self.depth - 1):
            chain.append(self.table[chain[-1], 0])
        tokens = torch.stack([roots, first, second] + chain[1:], 1)
        ones = torch.ones_like(tokens, dtype=torch.bool)
        return Tree(tokens, self.parents.expand(b, -1), self.levels.expand(b, -1), ones, self.depth)

    def commit(self, step: StepResult) -> None:
        self.accepted[: step.rows] += step.accepted - 1


class RepeatDrafter(Drafter):
    """On the host: the last k tokens of the history, again (a chain)."""

    needs = Needs(history=True)

    def __init__(self, k: int):
        self.depth = self.num_draft = k
        self.calls = 0

    def propose(self, ctx: DraftContext) -> Tree:
        self.calls += 1
        b = len(ctx.histories)
        tokens = torch.tensor([([h[-1]] + (h * self.depth)[-self.depth:]) for h in ctx.histories])
        parents = torch.arange(-1, self.depth).expand(b, -1)
        depth = torch.arange(self.depth + 1).expand(b, -1)
        return Tree(tokens.to(ctx.roots.device), parents, depth, torch.ones_like(tokens, dtype=torch.bool), self.depth)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, 24)


@pytest.fixture
def registered(target):
    """The table: the target's greedy next token from a lone token (often right) and a random one."""
    with torch.no_grad():
        ids = torch.arange(VOCAB)[:, None]
        best = target(ids).logits[:, 0].argmax(-1)
    table = torch.stack([best, torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))], 1)
    made = []

    def bigram(setup: DraftSetup):
        made.append(BigramDrafter(table, depth=setup.num_steps))
        return made[-1]

    register_method("bigram", bigram)
    register_method("repeat", lambda setup: RepeatDrafter(setup.num_draft_tokens))
    yield made
    unregister_method("bigram")
    unregister_method("repeat")


@pytest.mark.parametrize("max_batch", [1, 3, 8])
def test_a_device_drafter_defined_here_equals_ar(target, reference, registered, max_batch):
    assert "bigram" in method_names()
    engine = SpecEngine(target, method="bigram", num_steps=3, max_len=64, max_batch=max_batch)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24))
    assert [r.token_ids for r in results] == reference
    accepted = sum(r.accepted_tokens for r in results)
    assert accepted > 0, "the table never guessed right: the test would not exercise acceptance"
    assert engine.drafter is registered[-1]


def test_device_drafter_state_follows_its_row(target, registered):
    """Rows leave and the last row moves into the freed one: the drafter's per-row count must
    move with it and match what the engine reports for that request."""
    engine = SpecEngine(target, method="bigram", num_steps=3, max_len=64, max_batch=4)
    params = [SamplingParams(max_new_tokens=n) for n in (3, 20, 5, 20)]
    handles = [engine.add(Request(p, sp)) for p, sp in zip(PROMPTS[:4], params)]
    accepted = dict.fromkeys(handles, 0)
    while engine.has_work:
        for out in engine.step():
            accepted[out.handle] += out.accepted
            if out.finish_reason is None:
                row = [r.handle for r in engine.rows].index(out.handle)
                # the engine may run one step ahead: its drafts are counted once it is read
                assert engine.drafter.accepted[row].item() >= accepted[out.handle]
    assert sum(accepted.values()) > 0


def test_a_host_drafter_defined_here_equals_ar(target, reference, registered):
    engine = SpecEngine(target, method="repeat", num_draft_tokens=4, max_len=64, max_batch=3)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24))
    assert [r.token_ids for r in results] == reference
    assert engine.drafter.calls > 0


def test_sampled_output_with_a_plugin_drafter_is_the_targets(target, registered):
    """Seeded sampling: the same tokens with the drafter and without (the verify draws the
    target's own tokens; drafts only decide how many land per step)."""
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_new_tokens=16)
    plain = SpecEngine(target, method="ar", max_len=64, max_batch=1).generate(PROMPTS[:3], params)
    spec = SpecEngine(target, method="bigram", num_steps=3, max_len=64, max_batch=1).generate(PROMPTS[:3], params)
    assert [len(r.token_ids) for r in spec] == [16] * 3
    # per-node draws are keyed by sequence position, so they agree token for token
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


def test_unknown_method_names_the_known_ones(target):
    with pytest.raises(EngineError, match=r"method 'nope' is not one of ar, ngram.*eagle3"):
        SpecEngine(target, method="nope")
    with pytest.raises(EngineError, match="needs a draft head"):
        SpecEngine(target, method="eagle3")
