"""A head prepared for drafting twice keeps every tensor its drafts read at the same address.

CUDA graphs captured by an engine read the head's fused tensors (the int8 readout, EAGLE-3's
draft -> target id map) at the addresses they had at capture. A second drafter on the same head
(the evaluation's served-acceptance estimate runs one beside the engine of each method) prepares
the head again: when that made new tensors, the old ones were freed under the engine's graphs,
and the next category's steps read freed memory (an illegal memory access on an H200)."""

from __future__ import annotations

import pytest
import torch

from specheads.drafters import DraftSetup, build_drafter
from tests.runtime.spec_helpers import make_target, random_head


def drafted_tensors(head) -> dict:
    """Every tensor attribute of the head and its modules (parameters, buffers, fused weights,
    cached readouts) by name -> data_ptr."""
    out = {}
    for mod_name, mod in head.named_modules():
        for key, value in vars(mod).items():
            for i, t in enumerate(value if isinstance(value, tuple) else (value,)):
                if isinstance(t, torch.Tensor):
                    out[f"{mod_name}.{key}.{i}"] = t.data_ptr()
        for key, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            out[f"{mod_name}.{key}"] = t.data_ptr()
    return out


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "mtp", "medusa"])
def test_a_second_prepare_keeps_every_tensor_in_place(kind):
    target = make_target(seed=0, vocab=64, max_positions=128)
    head = random_head(target, kind=kind)
    tree = dict(num_steps=3, topk=2, num_draft_tokens=5)
    first = build_drafter(kind, DraftSetup(target, head, options={}, **tree))
    first.prepare(torch.device("cpu"))
    before = drafted_tensors(head)
    if kind != "medusa":
        assert head.fused and head._lm_int8 is not None
    second = build_drafter(kind, DraftSetup(target, head, options={}, **tree))  # as the estimate does
    second.prepare(torch.device("cpu"))
    after = drafted_tensors(head)
    assert after == before


def test_a_replaced_readout_stays_referenced():
    """Turning the int8 readout off after a capture replaces it; the old copy is kept alive."""
    target = make_target(seed=0, vocab=64, max_positions=128)
    head = random_head(target, kind="eagle3").fuse_for_inference(lm_head_int8=True)
    old = head._lm_int8
    head.fuse_for_inference(lm_head_int8=False)
    assert head._lm_int8 is None and any(x is old for x in head._superseded)
    head.fuse_for_inference(lm_head_int8=True)
    assert head._lm_int8 is not old and torch.equal(head._lm_int8[0], old[0])
