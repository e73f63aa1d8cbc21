"""Sampling parameters, the warper, and plain batched decoding on the engine (stops, seeds, errors)."""

from __future__ import annotations

import pytest
import torch

from specheads.runtime.engine import decode
from specheads.runtime.sampling import SamplingParams, warp_probs


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
    ],
)
def test_validate_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs).validate()


def test_validate_accepts_edges():
    p = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=1)
    assert p.validate() is p and p.greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_top_k_zeroes_all_but_k():
    logits = torch.tensor([[1.0, 5.0, 3.0, 2.0, 4.0], [0.0, -1.0, 2.0, 1.0, -3.0]])
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs[0] > 0).tolist() == [False, True, False, False, True]
    assert (probs[1] > 0).tolist() == [False, False, True, True, False]
    torch.testing.assert_close(probs[0, [1, 4]], torch.softmax(torch.tensor([5.0, 4.0]), -1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    p = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = p.log()
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    # sorted 0.5, 0.3 | 0.15, 0.05: 0.5 < 0.7, so 0.3 is needed too; then 0.8 >= 0.7
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.0, 0.375, 0.0]]))
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.0, 0.375, 0.0]]))
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.0, 0.3, 0.15]]) / 0.95)
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_top_k_and_top_p_together():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    k3 = torch.softmax(torch.tensor([4.0, 3.0, 2.0]), -1)  # 0.665, 0.245, 0.090 after the top-k cut
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.95))
    assert (probs > 0).tolist() == [[True, True, True, False, False]]
    torch.testing.assert_close(probs[0, :3], k3)
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.9))  # 0.665 + 0.245 >= 0.9
    assert (probs > 0).tolist() == [[True, True, False, False, False]]
    torch.testing.assert_close(probs[0, :2], k3[:2] / k3[:2].sum())
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.6))
    assert (probs > 0).tolist() == [[True, False, False, False, False]]


def test_temperature():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    torch.testing.assert_close(warp_probs(logits, SamplingParams(temperature=0.5)), torch.softmax(logits / 0.5, -1))
    assert warp_probs(torch.tensor([[1.0, 3.0]]), SamplingParams(temperature=0.0))[0, 1] == pytest.approx(1.0)


# ------------------------------------------------------------------ plain decoding (`decode`) on the tiny target
PROMPTS = [[1, 50, 60, 70, 80], [1, 90, 91], [1, 100, 120, 140, 160, 180, 200, 220, 240]]


def test_batch_equals_one_by_one(tiny_target):
    model, _ = tiny_target
    params = SamplingParams(max_new_tokens=10)
    together = decode(model, PROMPTS, params)
    alone = [decode(model, [p], params)[0] for p in PROMPTS]
    assert together == alone
    assert all(len(x) == 10 for x in together)


def test_stops(tiny_target):
    model, _ = tiny_target
    full = decode(model, PROMPTS, SamplingParams(max_new_tokens=12))
    stop = full[0][3]  # a token row 0 produces; rows finish at different steps
    expected = [row[: row.index(stop)] if stop in row else row for row in full]
    assert len({len(e) for e in expected}) > 1
    assert decode(model, PROMPTS, SamplingParams(max_new_tokens=12), {stop}) == expected
    # one row at a time: a finished row's slot takes the next prompt
    assert decode(model, PROMPTS, SamplingParams(max_new_tokens=12), {stop}, max_batch=1) == expected


def test_all_rows_stop_immediately(tiny_target):
    model, _ = tiny_target
    first = [r[0] for r in decode(model, PROMPTS, SamplingParams(max_new_tokens=1))]
    assert decode(model, PROMPTS, SamplingParams(max_new_tokens=8), set(first)) == [[]] * 3


def test_seeded_sampling_is_reproducible(tiny_target):
    model, _ = tiny_target
    # the tiny target is confident: a high temperature makes the draws depend on the seed
    params = SamplingParams(temperature=50.0, top_p=0.95, seed=7, max_new_tokens=8)
    a = decode(model, PROMPTS, params)
    assert a == decode(model, PROMPTS, params)
    others = [decode(model, PROMPTS, SamplingParams(temperature=50.0, seed=s, max_new_tokens=8))
              for s in range(8, 12)]
    assert any(o != a for o in others)
    assert a != decode(model, PROMPTS, SamplingParams(max_new_tokens=8))


def test_decode_errors(tiny_target):
    model, _ = tiny_target
    limit = model.rotary.max_positions
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        decode(model, [[1, 2], []], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match=f"prompt 0 has {limit} tokens"):
        decode(model, [[1] * limit], SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="top_p"):
        decode(model, [[1]], SamplingParams(top_p=2.0))
    # the answer stops at the target's last position
    assert len(decode(model, [[1] * (limit - 12)], SamplingParams(max_new_tokens=20))[0]) == 12
