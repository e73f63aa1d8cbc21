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


@pytest.fixture(scope="module")
def full_vocab_dir(tmp_path_factory, tiny_target_dir, small_prepared_dir):
    """The small conversations prepared over the target's whole vocabulary (no draft vocab)."""
    from specheads.data.prepare import PrepareOptions, prepare

    out = tmp_path_factory.mktemp("full-vocab") / "prepared"
    prepare(PrepareOptions(target=str(tiny_target_dir), data=str(small_prepared_dir.parent / "small.json"),
                           output=str(out), max_length=64, draft_vocab_size=10 ** 9, eval_fraction=0.01))
    return out


def _train(trainer):
    """Which parameters a short run changed (run() sets the head up again, from the same seed)."""
    before = {n: p.detach().clone() for n, p in trainer.head.named_parameters()}
    trainer.run()
    after = dict(trainer.head.named_parameters())
    return {n: not torch.equal(before[n], after[n].detach()) for n in before}


@pytest.mark.parametrize("full, extra, frozen", [
    (True, [], True),  # MTP over the whole vocabulary: the target's lm_head, frozen (the layout)
    (False, [], False),  # a draft vocabulary: its lm_head trains (as EAGLE-3's)
    (True, ["head.freeze_lm_head=false"], False),
    (False, ["head.freeze_lm_head=true"], True)])
def test_an_mtp_lm_head_over_the_whole_vocab_is_the_targets_frozen(full, extra, frozen, tiny_target_dir,
                                                                   small_prepared_dir, full_vocab_dir, tmp_path):
    data = full_vocab_dir if full else small_prepared_dir
    trainer = _setup("mtp", tiny_target_dir, data, tmp_path, "train.max_steps=3", *extra)
    head, target = trainer.head, trainer.target
    assert (head.config.draft_vocab_size == target.spec.vocab_size) == full
    assert trainer.frozen_readout == (["lm_head.weight"] if frozen else [])
    changed = _train(trainer)
    assert changed["lm_head.weight"] != frozen
    assert changed["layers.0.eh_proj.weight"]  # the modules train either way
    if frozen:
        assert torch.equal(head.lm_head.weight.detach(), target.lm_head.weight[head.target_rows()].float())


def test_freezing_a_random_or_missing_lm_head_is_refused(tiny_target_dir, small_prepared_dir, tmp_path):
    from specheads.training.trainer import TrainingError

    with pytest.raises(TrainingError, match="starts it random: set head.lm_head_from_target=true"):
        _setup("mtp", tiny_target_dir, small_prepared_dir, tmp_path / "a", "head.freeze_lm_head=true",
               "head.lm_head_from_target=false")
    with pytest.raises(TrainingError, match="head.freeze_lm_head does not apply to .*: drop it"):
        _setup("eagle", tiny_target_dir, small_prepared_dir, tmp_path / "b", "head.freeze_lm_head=true")


def test_depth_weights_weigh_each_depth_of_the_unroll(tiny_target_dir, small_prepared_dir, tmp_path):
    """train.depth_weights: a weight a depth. Depths weighted 0 give their modules no gradient (the
    unroll feeds forward only), so those stay as they started; a wrong count is refused by name."""
    from specheads.config import ConfigError
    from specheads.training.trainer import TrainingError

    trainer = _setup("mtp", tiny_target_dir, small_prepared_dir, tmp_path / "w", "train.max_steps=3",
                     "train.depth_weights=[1.0, 0.0]", "train.weight_decay=0.0")
    changed = _train(trainer)
    assert changed["layers.0.eh_proj.weight"] and not changed["layers.1.eh_proj.weight"]
    with pytest.raises(TrainingError, match=r"train.depth_weights has 3 weights; this run trains 2 depths"):
        _setup("mtp", tiny_target_dir, small_prepared_dir, tmp_path / "n", "train.depth_weights=[1.0, 0.5, 0.2]")
    with pytest.raises((ConfigError, ValueError), match="at least one above 0"):
        _setup("mtp", tiny_target_dir, small_prepared_dir, tmp_path / "z", "train.depth_weights=[0.0, 0.0]")
