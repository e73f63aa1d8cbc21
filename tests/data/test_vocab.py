"""Draft vocabulary: the most frequent loss-masked tokens, as d2t offsets and a t2d mask."""

from __future__ import annotations

import pytest
import torch

from specheads.data.vocab import (
    build_vocab_map,
    draft_to_target,
    load_vocab_map,
    save_vocab_map,
    token_frequencies,
)


def _counts(v=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randperm(v, generator=g) * 3  # distinct, so the top set is unambiguous
    counts[torch.randint(0, v, (40,), generator=g)] = 0  # some never seen
    return counts


@pytest.mark.parametrize("k", [1, 17, 100, 300])
def test_build_vocab_map_round_trip(k):
    counts = _counts()
    v = counts.numel()
    d2t, t2d = build_vocab_map(counts, k)
    assert d2t.dtype == torch.int64 and d2t.shape == (k,)
    assert t2d.dtype == torch.bool and t2d.shape == (v,)
    target_ids = torch.arange(k) + d2t
    assert torch.equal(target_ids, draft_to_target(d2t))
    # draft ids keep the target's order
    assert bool((target_ids[1:] > target_ids[:-1]).all())
    assert int(target_ids.min()) >= 0 and int(target_ids.max()) < v
    # exactly the k most frequent tokens (ties by lower id)
    key = [(-int(c), i) for i, c in enumerate(counts.tolist())]
    expected = sorted(i for _, i in sorted(key)[:k])
    assert target_ids.tolist() == expected
    # t2d is True exactly at those ids
    assert t2d.nonzero().squeeze(1).tolist() == expected
    assert int(t2d.sum()) == k


def test_ties_broken_by_lower_id():
    counts = torch.tensor([5, 0, 7, 5, 5, 0])
    d2t, t2d = build_vocab_map(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 3]
    d2t, _ = build_vocab_map(counts, 5)
    assert (torch.arange(5) + d2t).tolist() == [0, 1, 2, 3, 4]  # unseen ids 1, 5: lower first


@pytest.mark.parametrize("k", [0, -1, 301])
def test_draft_vocab_size_out_of_range(k):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_map(_counts(), k)


def test_token_frequencies_counts_only_masked_tokens():
    rows = [
        {"input_ids": [1, 2, 3, 3], "loss_mask": [0, 1, 1, 1]},
        {"input_ids": [3, 4, 9], "loss_mask": [1, 0, 1]},
    ]
    counts = token_frequencies(rows, 10)
    assert counts.dtype == torch.int64
    assert counts.tolist() == [0, 0, 1, 3, 0, 0, 0, 0, 0, 1]


def test_save_load_round_trip(tmp_path):
    counts = _counts()
    d2t, t2d = build_vocab_map(counts, 50)
    save_vocab_map(tmp_path / "v.safetensors", d2t, t2d, counts)
    d2t2, t2d2 = load_vocab_map(tmp_path / "v.safetensors")
    assert torch.equal(d2t, d2t2) and torch.equal(t2d, t2d2)
    assert d2t2.dtype == torch.int64 and t2d2.dtype == torch.bool


def test_prepared_vocab_map_matches_the_data(prepared_dir):
    """The vocab map written by prepare is the top-k of the train split's loss-masked tokens."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from tests.helpers import DRAFT_VOCAB

    saved = load_file(str(prepared_dir / "vocab_map.safetensors"))
    train = load_from_disk(str(prepared_dir))["train"]
    counts = token_frequencies(train, saved["t2d"].numel())
    assert torch.equal(saved["counts"], counts)
    d2t, t2d = build_vocab_map(counts, DRAFT_VOCAB)
    assert torch.equal(saved["d2t"], d2t) and torch.equal(saved["t2d"], t2d)
    # every loss token of the train split is in the draft vocab (the vocab is big enough here)
    assert bool(t2d[counts > 0].all())
