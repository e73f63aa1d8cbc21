"""The Triton kernels of every tier's step compile for the GPU (sm_90), here on CPU: a smaller
tree launches the draft, verify and commit kernels with other compile-time shapes (node counts,
depths, frontier widths) than the full tree (tests/kernels/test_compile_sm90.py compiles the
full tree's)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.compile_sm90 import compile_all, distinct, recording, tiny_target
from tests.kernels.interpret import needs_triton
from tests.runtime.test_tiers import run, scripted


@pytest.fixture(scope="module")
def tier_launches():
    from specheads.drafters.draft_model import DraftLM
    from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.model import TargetModel

    with recording() as launches:
        cfg, target = tiny_target()
        head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab_size=128)).eval()
        head.fuse_for_inference(lm_head_int8=True)
        draft = DraftLM(TargetModel(cfg).eval().requires_grad_(False).fuse_for_inference())
        prompts = [list(range(1, 20)), list(range(5, 12))]
        builds = [lambda: SpecEngine(target, head, num_steps=4, topk=3, num_draft_tokens=8, max_batch=2, max_len=128),
                  lambda: SpecEngine(target, draft, num_steps=4, topk=3, num_draft_tokens=8, max_batch=2, max_len=128),
                  lambda: SpecEngine(target, method="ngram", num_draft_tokens=4, max_batch=2, max_len=128)]
        with torch.no_grad():
            for i, build in enumerate(builds):  # each tier once (the drafts are random: about a token a step)
                engine = build()
                engine.policy = scripted(engine.full_tree, "1,1,1;2,1,2" if i == 2 else "1,1,1;2,1,2;3,2,5",
                                         schedule=[1, 2, 3, 4, 0] if i < 2 else [1, 2, 3, 0])
                run(engine, prompts, SamplingParams(max_new_tokens=6), 2)
    return distinct(launches)


@needs_triton
def test_every_tier_kernel_compiles_for_sm90(tier_launches):
    assert {"_select_tree_kernel", "_tree_mask_kernel", "_accept_kernel"} <= {d["name"] for d in tier_launches}
    failed = compile_all(tier_launches)
    assert not failed, "\n".join(failed)
