"""head.lm_head_from_target: a new head's draft lm_head (and the norm before it) start as the
target's rows of the draft vocabulary, by default for MTP (DeepSeek-V3's modules share the
model's output head) and Medusa (Medusa initializes its heads from the LM head), on request for
EAGLE-3; refused for EAGLE-1, which reads out through the target's lm_head itself."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import train_config

SIZES = {"mtp": ["head.num_modules=2"], "medusa": ["head.num_heads=2"], "eagle3": [], "eagle": []}


def _setup(kind, tiny_target_dir, small_prepared_dir, tmp_path, *extra):
    from specheads.training.trainer import Trainer

    trainer = Trainer(train_config(tiny_target_dir, small_prepared_dir, tmp_path / kind, f"head.kind={kind}",
                                   *SIZES[kind], *extra))
    trainer.setup()
    return trainer


def _readouts(head):
    """(lm_head weights, final norms) of a head kind."""
    if head.kind == "medusa":
        return [m.weight for m in head.lm_heads], []
    if head.kind == "mtp":
        return [head.lm_head.weight], [m.shared_head.norm.weight for m in head.layers]
    return [head.lm_head.weight], [head.norm.weight]


@pytest.mark.parametrize("kind, extra, from_target", [
    ("mtp", [], True), ("medusa", [], True), ("eagle3", [], False),
    ("eagle3", ["head.lm_head_from_target=true"], True), ("mtp", ["head.lm_head_from_target=false"], False)])
def test_the_readout_starts_as_the_targets_where_asked(kind, extra, from_target, tiny_target_dir, small_prepared_dir,
                                                       tmp_path):
    trainer = _setup(kind, tiny_target_dir, small_prepared_dir, tmp_path, *extra)
    head, target = trainer.head, trainer.target
    rows = head.target_rows()
    assert rows.numel() < target.spec.vocab_size  # a draft vocabulary: the rows are picked, not all
    want = target.lm_head.weight[rows].float()
    weights, norms = _readouts(head)
    for w in weights:
        assert torch.equal(w, want) == from_target
    for n in norms:
        assert torch.equal(n, target.model.norm.weight.float()) == from_target
    assert not torch.equal(target.model.norm.weight, torch.ones_like(target.model.norm.weight))  # a real check


def test_a_head_reading_the_targets_lm_head_refuses_the_option(tiny_target_dir, small_prepared_dir, tmp_path):
    from specheads.training.trainer import TrainingError

    with pytest.raises(TrainingError, match="head.lm_head_from_target does not apply to .*: drop it"):
        _setup("eagle", tiny_target_dir, small_prepared_dir, tmp_path, "head.lm_head_from_target=true")
    _setup("eagle", tiny_target_dir, small_prepared_dir, tmp_path / "default")  # no option: fine
