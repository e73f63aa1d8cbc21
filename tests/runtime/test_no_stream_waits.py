"""The engine's row bookkeeping between steps (a request joining, leaving, switching drafting off
and on) writes no Python number into a single element of a tensor: on CUDA `t[i] = 0` copies a
host scalar to the card and waits for its stream, so every request that finished made the host
wait for the step in flight (1.3 ms a request at batch 64 on an H100, the card idle meanwhile).
`t[i].fill_(0)` launches the same write in the stream's order without waiting. Checked on CPU by
watching every tensor write while requests of each drafter kind join and leave."""

from __future__ import annotations

import copy
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

from specheads.drafters.draft_model import DraftLM
from specheads.runtime.engine import Request, SpecControl, SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.runtime.spec_helpers import make_target, random_head, random_prompts

VOCAB = 64
PROMPTS = random_prompts(7, VOCAB, [3, 7, 1, 12, 5, 9, 4], seed=3)
BUDGETS = [9, 4, 12, 6, 3, 10, 7]


class ScalarWrites(TorchFunctionMode):
    """Records where specheads writes a Python number into one element (`t[i] = number`)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__setitem__:
            tensor, index, value = args
            if isinstance(value, (bool, int, float)) and tensor[index].dim() == 0:
                ours = [f for f in traceback.extract_stack() if "/specheads/" in f.filename]
                self.seen.append(f"{ours[-1].filename.rsplit('/specheads/', 1)[-1]}:{ours[-1].lineno}"
                                 if ours else "outside specheads")
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


def _engine(target, kind: str) -> SpecEngine:
    common = dict(max_len=64, max_batch=3)
    if kind == "ar":
        return SpecEngine(target, method="ar", **common)
    if kind == "ngram":
        return SpecEngine(target, method="ngram", num_steps=3, topk=1, **common)
    if kind == "draft-model":
        return SpecEngine(target, DraftLM(copy.deepcopy(target)), num_steps=3, topk=1, **common)
    if kind == "eagle3+ngram":
        return SpecEngine(target, random_head(target), method="eagle3+ngram", num_steps=3, topk=2,
                          num_draft_tokens=6, speculation_policy="adaptive", **common)
    return SpecEngine(target, random_head(target, kind=kind, **({"num_heads": 3} if kind == "medusa" else {})),
                      num_steps=3, topk=2, num_draft_tokens=6, **common)


@pytest.mark.parametrize("kind", ["ar", "eagle3", "eagle3+ngram", "ngram", "medusa", "draft-model"])
def test_rows_joining_and_leaving_write_no_number_into_one_element(target, kind):
    engine = _engine(target, kind)
    auto = SpecControl(enabled="auto", min_acceptance=0.9, window=1, probe_every=2)  # off and on again
    todo = [Request(p, SamplingParams(max_new_tokens=n, temperature=0.7 * (i % 2), seed=i),
                    spec=auto if i % 3 == 0 and kind != "ar" else SpecControl())
            for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]
    watch, done = ScalarWrites(), 0
    with watch:
        while engine.has_work or todo:
            while todo and engine.free_slots:
                engine.add(todo.pop(0))
            done += sum(out.finish_reason is not None for out in engine.step())
    assert done == len(PROMPTS)
    assert watch.seen == [], f"`t[i] = number` waits for the stream on CUDA; use fill_: {sorted(set(watch.seen))}"


def test_the_watch_sees_a_number_written_into_one_element():
    t = torch.zeros(3, dtype=torch.long)
    with ScalarWrites() as watch:
        t[1:] = 4  # a slice: a fill, no copy
        t[0].fill_(2)
        t[2] = 5
    assert t.tolist() == [2, 4, 5] and len(watch.seen) == 1
