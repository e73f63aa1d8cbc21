"""The draft stopped on the device (EAGLE-3 drafter option draft_stop): a step's draft ends after the
first depth where no row's best node keeps a cumulative probability of at least the threshold; greedy
output still equals plain decoding (batch 1 and 3, every tier), the interpreted Triton kernels (whose
deeper depths return at once) draft the same trees as the torch references (which compute every
depth), the default follows the policy, and a bad threshold is refused naming the option."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from specheads.drafters import DrafterError
from specheads.drafters.eagle import DRAFT_STOP
from specheads.kernels.draft import topk_expand, topk_expand_reference
from specheads.kernels.fused import skip_stopped
from specheads.runtime.engine import EngineError, Request, SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import ar_tokens, train_head
from tests.runtime.test_tiers import FULL, NEW, PROMPTS, TRAIN, reference, target  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def head(target):
    return train_head(target, TRAIN, kind="eagle3")


def run(engine, prompts, new=NEW):
    """Each prompt's tokens and its steps' (depth offered, drafts accepted), rows joining as they free up."""
    todo, got, steps, order = list(prompts), {}, {}, []
    while todo or engine.has_work:
        while todo and engine.free_slots:
            h = engine.add(Request(todo.pop(0), SamplingParams(max_new_tokens=new)))
            got[h], steps[h] = [], []
            order.append(h)
        for out in engine.step():
            got[out.handle] += out.new_tokens
            if not out.prefill and out.draft_tree is not None:
                steps[out.handle].append((out.draft_depth, out.accepted))
    return [got[h] for h in order], [steps[h] for h in order]


def inner(drafter):
    """The EAGLE-3 drafter (inside the n-gram assist of the default method)."""
    return getattr(drafter, "inner", drafter)


@pytest.mark.parametrize("stop", [0.05, 0.3, 0.9])
@pytest.mark.parametrize("max_batch", [1, 3])
@pytest.mark.parametrize("method", ["eagle3", "eagle3+ngram"])
def test_greedy_output_equals_ar_with_the_draft_stopped(target, head, reference, stop, max_batch, method):
    engine = SpecEngine(target, head, method=method, max_len=64, max_batch=max_batch,
                        drafter_options={"draft_stop": stop, "draft_stop_rows": max_batch}, **FULL)
    assert inner(engine.drafter).draft_stop == stop
    tokens, steps = run(engine, PROMPTS)
    assert tokens == reference
    depths = [d for row in steps for d, _ in row]
    assert all(a <= d for row in steps for d, a in row)  # nothing accepted past the depth drafted
    if stop == 0.9:  # a threshold most depths miss: drafts stop early, at depth 1 too
        assert min(depths) == 1 and sum(d < FULL["num_steps"] for d in depths) > len(depths) // 2
        # and inside full_drafts (where the engine times its steps) every step drafts its whole depth
        again = SpecEngine(target, head, method=method, max_len=64, max_batch=max_batch,
                           drafter_options={"draft_stop": stop, "draft_stop_rows": max_batch}, **FULL)
        again.add(Request(PROMPTS[0], SamplingParams(max_new_tokens=NEW)))
        again.step()  # (allocated)
        with again.drafter.full_drafts():
            inner_depths = []
            while again.has_work:
                inner_depths += [o.draft_depth for o in again.step() if not o.prefill and o.draft_tree is not None]
        assert inner_depths and max(inner_depths) > 1 and inner(again.drafter).stop_log.item() == pytest.approx(math.log(stop))


def test_a_stopped_draft_accepts_less_only_where_it_stopped(target, head, reference):
    """The full draft's acceptance against a threshold no depth misses (the same trees) and one that
    stops: fewer depths drafted, and the tokens still the target's."""
    full = SpecEngine(target, head, method="eagle3", max_len=64, max_batch=1, **FULL)
    never = SpecEngine(target, head, method="eagle3", max_len=64, max_batch=1, drafter_options={"draft_stop": 1e-30},
                       **FULL)
    a, sa = run(full, PROMPTS[:3])
    b, sb = run(never, PROMPTS[:3])
    assert a == b == reference[:3] and sa == sb


def test_the_adaptive_policy_stops_drafts_by_default(target, head, reference):
    adaptive = SpecEngine(target, head, max_len=64, max_batch=3, speculation_policy="adaptive",
                          speculation_tiers="1,1,1;2,1,2;3,2,5", **FULL)
    fixed = SpecEngine(target, head, max_len=64, max_batch=3, **FULL)
    assert inner(adaptive.drafter).draft_stop == DRAFT_STOP and inner(fixed.drafter).draft_stop == 0.0
    assert run(adaptive, PROMPTS)[0] == reference
    off = SpecEngine(target, head, max_len=64, max_batch=1, speculation_policy="adaptive",
                     drafter_options={"draft_stop": 0}, **FULL)
    assert inner(off.drafter).draft_stop == 0.0


def test_a_wider_batch_drafts_whole_unless_asked(target, head, reference):
    """By default the stop applies to batches of one row (DRAFT_STOP_ROWS): while three rows run, every
    step drafts the full depth; the last row alone stops."""
    engine = SpecEngine(target, head, method="eagle3", max_len=64, max_batch=3, drafter_options={"draft_stop": 0.9},
                        **FULL)
    assert inner(engine.drafter).draft_stop_rows == 1
    handles = [engine.add(Request(p, SamplingParams(max_new_tokens=n))) for p, n in zip(PROMPTS[:3], (NEW, NEW, 40))]
    got, wide, alone = {h: [] for h in handles}, [], []
    while engine.has_work:
        outs = engine.step()
        rows = len(engine.rows) + sum(o.finish_reason is not None for o in outs)
        for o in outs:
            got[o.handle] += o.new_tokens
            if not o.prefill and o.draft_tree is not None:
                (wide if rows > 1 else alone).append(o.draft_depth)
    assert [got[h] for h in handles] == [reference[0], reference[1], ar_tokens(target, PROMPTS[2:3], 40)[0]]
    assert wide and alone and max(wide) == FULL["num_steps"] and min(alone) == 1


@pytest.mark.parametrize("option, value", [("draft_stop", 1.5), ("draft_stop", -0.1), ("draft_stop", "often"),
                                           ("draft_stop", True), ("draft_stop_rows", 0), ("draft_stop_rows", "all")])
def test_a_bad_threshold_is_refused_naming_the_option(target, head, option, value):
    with pytest.raises((DrafterError, EngineError, ValueError), match=option):
        SpecEngine(target, head, max_len=64, max_batch=1, drafter_options={option: value}, **FULL)


@needs_triton
@pytest.mark.parametrize("max_batch", [1, 2])
def test_the_interpreted_kernels_skip_and_draft_the_same_trees(target, head, reference, max_batch, monkeypatch):
    """On the Triton path (interpreted) a stopped depth's kernels return at once; the trees, the depths
    drafted and the output equal the torch references' (which compute every depth)."""
    fused_target, fused_head = copy.deepcopy(target), copy.deepcopy(head)  # (fused on CUDA by the engine)
    fused_target.fuse_for_inference()
    fused_head.fuse_for_inference(lm_head_int8=False)
    want = run(SpecEngine(fused_target, fused_head, method="eagle3", max_len=64, max_batch=max_batch,
                          drafter_options={"draft_stop": 0.3, "draft_stop_rows": max_batch}, **FULL), PROMPTS[:2], 12)
    interpret_triton(monkeypatch)
    engine = SpecEngine(fused_target, fused_head, method="eagle3", max_len=64, max_batch=max_batch,
                        drafter_options={"draft_stop": 0.3, "draft_stop_rows": max_batch}, **FULL)
    got = run(engine, PROMPTS[:2], 12)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert got[0] == want[0] == [r[:12] for r in reference[:2]]
    assert got[1] == want[1]
    assert any(d < FULL["num_steps"] for row in got[1] for d, _ in row)


@needs_triton
@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("log_stop", [-0.5, -3.0, -50.0])
def test_topk_expand_writes_the_stop_and_skips_after_it(monkeypatch, b, log_stop):
    interpret_triton(monkeypatch)
    g = torch.Generator().manual_seed(b)
    n, k, vocab = 2, 3, 40
    logits = torch.randn(b, n, vocab, generator=g) * 3
    front_score = -torch.rand(b, n, generator=g)
    front_pool = torch.arange(n).expand(b, n).contiguous()
    target_ids = torch.arange(vocab)

    def call(state, depth, ref=False):
        pools = [torch.zeros(b, n * k, dtype=torch.long), torch.zeros(b, n * k), torch.zeros(b, n * k, dtype=torch.long)]
        if ref:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        out = topk_expand(logits, front_score, front_pool, k, target_ids, *pools, 4,
                          stop=(state, torch.tensor([log_stop]), depth))
        if ref:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        return out, pools

    s_tri, s_ref = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    (tri, _), (ref, _) = call(s_tri, 2), call(s_ref, 2, ref=True)
    want = topk_expand_reference(logits, front_score, front_pool, k, target_ids,
                                 torch.zeros(b, n * k, dtype=torch.long), torch.zeros(b, n * k),
                                 torch.zeros(b, n * k, dtype=torch.long), 4)
    best = want[1][:, 0].max().item()
    assert s_tri.tolist() == s_ref.tolist() == [int(best < log_stop), 2, 0]
    assert torch.allclose(tri[1], want[1], atol=1e-5) and torch.equal(tri[0], want[0])
    # inside skip_stopped: where the state says stopped, the launch writes nothing and keeps the state
    s_tri[0] = s_ref[0] = 1
    with skip_stopped(s_tri):
        _, pools = call(s_tri, 3)
    with skip_stopped(s_ref):
        call(s_ref, 3, ref=True)
    assert s_tri.tolist() == s_ref.tolist() == [1, 2, 0]
    assert not pools[1].any()  # the pool untouched
    s_tri[0] = s_ref[0] = 0  # not stopped: it runs and decides again
    with skip_stopped(s_tri):
        call(s_tri, 3)
    with skip_stopped(s_ref):
        call(s_ref, 3, ref=True)
    assert s_tri.tolist() == s_ref.tolist() == [int(best < log_stop), 3, 0]


@needs_triton
def test_the_stopped_draft_kernels_compile_for_sm90():
    """The kernels a stopped draft launches (a depth's projections, rotary, attention and top-k
    expansion reading the stop, the expansion writing it, the selection under its depth) compile for
    the GPU (sm_90), here on CPU."""
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from tests.kernels.compile_sm90 import compile_all, distinct, recording, tiny_target

    with recording() as launches:
        _, tiny = tiny_target()
        draft = Eagle3Head(Eagle3Config.for_target(tiny, draft_vocab_size=128)).eval()
        draft.fuse_for_inference(lm_head_int8=True)
        with torch.no_grad():
            for method in ("eagle3", "eagle3+ngram"):
                engine = SpecEngine(tiny, draft, method=method, num_steps=4, topk=3, num_draft_tokens=8, max_batch=2,
                                    max_len=128, speculation_policy="adaptive", speculation_tiers="1,1,1;2,1,2;3,2,5",
                                    drafter_options={"draft_stop_rows": 2})
                assert inner(engine.drafter).draft_stop == DRAFT_STOP
                for p in (list(range(1, 20)), list(range(5, 12))):
                    engine.add(Request(p, SamplingParams(max_new_tokens=6)))
                while engine.has_work:
                    engine.step()
    descs = distinct(launches)
    skipping = {d["name"] for d in descs if d["constexprs"].get("SKIP") or d["constexprs"].get("STOP")
                or d["constexprs"].get("LIMIT")}
    assert {"_linear_kernel", "_rope_cache_kernel", "_split_kernel", "_topk_kernel", "_select_tree_kernel"} <= skipping
    chosen = [d for d in descs if d["name"] in skipping]
    with_pdl = [{**d, "constexprs": {**d["constexprs"], "PDL": 1}} for d in chosen]  # as launched on an H100
    failed = compile_all(chosen + with_pdl)
    assert not failed, "\n".join(failed)
