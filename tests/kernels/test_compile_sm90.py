"""Every Triton kernel an engine step launches compiles for the GPU (sm_90, H100/H200), here on
CPU: the interpreter that the other kernel tests use accepts some programs the GPU compiler
rejects (compile_sm90.py)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.compile_sm90 import compile_all, distinct, recording, tiny_target
from tests.kernels.interpret import needs_triton


# a prefill of 19 + 4 tokens and two steps launch every kernel variant that 19 + 7 tokens and five
# steps did (58 distinct), in about half the interpreted time
PROMPTS = [list(range(1, 20)), list(range(5, 9))]


@pytest.fixture(scope="module")
def step_launches():
    """The launches of a prefill and two steps (eagle3 tree, then plain decode) of
    tiny fused models, kernels interpreted; one per distinct compiled kernel."""
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.model import TargetModel

    with recording() as launches:
        cfg, target = tiny_target()
        with torch.no_grad():
            for method, int8 in (("eagle3", False), ("eagle3", True), ("ar", False)):
                head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab_size=128)).eval()
                head.fuse_for_inference(lm_head_int8=int8)  # the draft lm_head in int8 too
                engine = SpecEngine(target, head if method == "eagle3" else None, method=method, num_steps=3, topk=3,
                                    num_draft_tokens=6, max_batch=2, max_len=128)
                engine.generate(PROMPTS, SamplingParams(max_new_tokens=3))
            # the feature-head kinds on the final hidden state (their drafters' own kernel variants)
            from specheads.heads.registry import head_kind

            for kind, size in (("eagle", {}), ("mtp", {"num_modules": 2}), ("medusa", {"num_heads": 2})):
                entry = head_kind(kind)
                head = entry.module(entry.config.for_target(target, draft_vocab_size=256, **size)).eval()
                engine = SpecEngine(target, head, num_steps=2, topk=2, num_draft_tokens=4, max_batch=2, max_len=128)
                engine.drafter.prepare(engine.device)  # the fused draft layers and int8 lm_head, as on CUDA
                engine.generate(PROMPTS, SamplingParams(max_new_tokens=3))
            # a standalone draft model (its window feed, masked frontier, plain top-k expansion)
            from specheads.drafters.draft_model import DraftLM

            draft = TargetModel(cfg).eval().requires_grad_(False).fuse_for_inference()
            engine = SpecEngine(target, DraftLM(draft), num_steps=3, topk=2, num_draft_tokens=4, max_batch=2,
                                max_len=128)
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=3))
            # the target attention's other variants: split-K over a long cache, a tree, a window
            from specheads.kernels import attention
            from specheads.kernels.verify import ancestors_reference

            q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 300, 16)
            parents = torch.tensor([[-1, 0, 0], [-1, 0, 1]])
            depth = torch.tensor([[0, 1, 1], [0, 1, 2]])
            tree = (torch.tensor([250, 260]), ancestors_reference(parents, 2), depth)
            from specheads.kernels import tuning

            for split in (True, False):
                attention.causal_attention(q, k, k, tree[0][:, None] + depth, tree=tree, split=split)
                with tuning.using(tuning.active().replace(attention_tree_many_batch=1)):  # all tokens that fit
                    attention.causal_attention(q, k, k, tree[0][:, None] + depth, tree=tree, split=split)
                attention.causal_attention(q, k, k, torch.tensor([[5, 6, 7], [280, 281, 282]]), window=64, split=split)
            # split programs of two chunks each (caps 16 and 8: a third fewer than one a chunk)
            with tuning.using(tuning.active().replace(attention_split_programs=16)):
                attention.causal_attention(q, k, k, tree[0][:, None] + depth, tree=tree, split=True)
            with tuning.using(tuning.active().replace(attention_split_programs=8)):
                attention.causal_attention(q, k, k, torch.tensor([[5, 6, 7], [280, 281, 282]]), window=64, split=True)
            # the projection's folded norm (Numerics.linear_norm), plain and with silu
            from specheads.kernels.linear import linear

            with tuning.using(tuning.active().replace(linear_norm="folded")):
                x, nw = torch.randn(3, 64), torch.rand(64) + 0.5
                linear(x, torch.randn(32, 64), norm_weight=nw, eps=1e-5)
                linear(x, torch.randn(64, 64), norm_weight=nw, eps=1e-5, silu=True)
            # the n-gram lookup: one token, n-gram's default 3, the assist's 4 (found from 3), the longest tested
            from specheads.kernels.ngram import KERNEL_MAX_NGRAM, ngram_lookup

            h = torch.randint(0, 5, (2, 40))
            for longest in (1, 3, 4, KERNEL_MAX_NGRAM):
                ngram_lookup(h, torch.tensor([30, 39]), torch.tensor([1, 2]), torch.arange(8), longest, min(3, longest))
    return distinct(launches)


@needs_triton
def test_the_step_covers_the_kernels(step_launches):
    names = {desc["name"] for desc in step_launches}
    assert len(step_launches) >= 58  # what the longer run (PROMPTS) launched: no variant lost
    assert any(d["name"] == "_linear_kernel" and d["constexprs"]["SCALED"] for d in step_launches)
    assert any(d["name"] == "_topk_kernel" and d["constexprs"]["NODE_ROW"] for d in step_launches)
    assert any(d["name"] == "_topk_kernel" and d["constexprs"]["SHARED"] for d in step_launches)  # Medusa
    assert sum(d["name"] == "_causal_kernel" for d in step_launches) >= 5
    assert any(d["name"] == "_causal_kernel" and d["constexprs"]["MULTI"] for d in step_launches)
    assert {"_linear_kernel", "_split_kernel", "_causal_kernel", "_topk_kernel", "_select_tree_kernel", "_feed_kernel", "_embedding_kernel",
            "_tree_mask_kernel", "_accept_kernel", "_commit_kernel", "_head_input_kernel", "_ring_path_kernel", "_mtp_window_kernel",
            "_tree_plan_kernel", "_ngram_kernel", "_argmax_kernel"} <= names, names
    assert {d["constexprs"]["MAX_NGRAM"] for d in step_launches if d["name"] == "_ngram_kernel"} == {1, 3, 4, 8}
    assert any(d["name"] == "_head_input_kernel" and not d["constexprs"]["NORM"] for d in step_launches)  # EAGLE-1
    assert any(d["name"] == "_linear_kernel" and d["constexprs"]["FOLD"] for d in step_launches)


@needs_triton
def test_every_step_kernel_compiles_for_sm90(step_launches):
    failed = compile_all(step_launches)
    assert not failed, "\n".join(failed)
