"""A head's own default tree: specheads.json's "tree" (written by `specheads evaluate --save-tree`
from the validation split), read and checked on load, used by generate / serve / evaluate / bench
where no tree is given, overridden value by value, and named on the card."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.cli import main
from specheads.evaluation.run import Method, check_save_tree, choose_tree
from specheads.evaluation.suite import SuiteError
from specheads.heads.format import HeadFormatError, head_tree, load_head, save_head, save_head_tree
from specheads.runtime.defaults import DEFAULT_TREE, resolve_tree
from tests.runtime.spec_helpers import random_head


@pytest.fixture
def head_dir(tiny_target, tmp_path):
    model, _ = tiny_target
    return save_head(random_head(model), tmp_path / "head", torch.float32)


def _set_tree(folder, entry):
    meta = json.loads((folder / "specheads.json").read_text())
    meta["tree"] = entry
    (folder / "specheads.json").write_text(json.dumps(meta))


def test_a_head_without_a_tree_drafts_the_default(head_dir):
    assert head_tree(head_dir) is None and load_head(head_dir).tree is None
    assert resolve_tree(None, None, None, load_head(head_dir)) == DEFAULT_TREE
    assert resolve_tree(None, None, None) == DEFAULT_TREE


def test_saved_tree_reads_back_and_fills_what_is_not_given(head_dir):
    save_head_tree(head_dir, (4, 4, 10), {"split": "validation", "speedup": 1.79})
    head = load_head(head_dir)
    assert head.tree == (4, 4, 10)
    assert json.loads((head_dir / "specheads.json").read_text())["tree"]["chosen_on"]["split"] == "validation"
    assert resolve_tree(None, None, None, head) == (4, 4, 10)
    assert resolve_tree(3, None, None, head) == (3, 4, 10)  # each value given wins on its own
    assert resolve_tree(None, 1, 4, head) == (4, 1, 4)


@pytest.mark.parametrize("entry", [
    {"num_steps": 4, "topk": 4},  # a field missing
    {"num_steps": 4, "topk": 4, "num_draft_tokens": 100},  # more nodes than depth 4, topk 4 can hold (52)
    {"num_steps": 0, "topk": 4, "num_draft_tokens": 3},
    {"num_steps": 4, "topk": True, "num_draft_tokens": 3},
    {"num_steps": "4", "topk": 4, "num_draft_tokens": 3},
    [4, 4, 10],
])
def test_a_malformed_tree_names_the_file_and_what_is_right(head_dir, entry):
    _set_tree(head_dir, entry)
    with pytest.raises(HeadFormatError, match=r"specheads.json: 'tree' is .*expected \{\"num_steps\": S"):
        load_head(head_dir)


def test_generate_drafts_with_the_heads_tree_unless_told_otherwise(head_dir, tiny_target_dir, monkeypatch, capsys):
    from specheads.runtime.engine import SpecEngine

    seen = []
    real = SpecEngine.__init__

    def spy(self, *a, **k):
        seen.append((k.get("num_steps"), k.get("topk"), k.get("num_draft_tokens")))
        real(self, *a, **k)

    monkeypatch.setattr(SpecEngine, "__init__", spy)
    save_head_tree(head_dir, (3, 2, 5), {"split": "validation"})
    base = ["generate", "--target", str(tiny_target_dir), "--draft", str(head_dir), "--prompt", "hi",
            "--max-new-tokens", "4", "--raw", "--speculation-policy", "fixed"]
    assert main(base) == 0
    assert main(base + ["--num-draft-tokens", "4"]) == 0
    assert seen == [(3, 2, 5), (3, 2, 4)]
    capsys.readouterr()


def test_load_engine_drafts_with_the_heads_tree(head_dir, tiny_target_dir):
    from specheads.server.launch import load_engine

    save_head_tree(head_dir, (3, 2, 5), {"split": "validation"})
    def tree(engine):  # the head's own tree (the default n-gram assist drafts beside it)
        d = getattr(engine.drafter, "inner", engine.drafter)
        return d.depth, d.num_draft

    engine, _, _ = load_engine(str(tiny_target_dir), str(head_dir), speculation_policy="fixed")
    assert tree(engine) == (3, 5)
    engine, _, _ = load_engine(str(tiny_target_dir), str(head_dir), num_steps=2, speculation_policy="fixed")
    assert tree(engine) == (2, 5)


def _report(speedups: dict[str, list[float]]) -> dict:
    cats = ["math", "coding"]
    return {"split": "validation", "card": "NVIDIA H200", "date": "2026-11-29", "batch_size": 1,
            "max_new_tokens": 256,
            "categories": {c: {"ar": {"prompts": 8, "speedup_vs_ar": 1.0},
                               **{name: {"speedup_vs_ar": v[i]} for name, v in speedups.items()}}
                           for i, c in enumerate(cats)}}


def test_choose_tree_takes_the_best_mean_speedup_of_the_heads_trees():
    methods = [Method("ar"), Method("eagle3@6,4,15", "eagle3", 6, 4, 15), Method("eagle3@4,4,10", "eagle3", 4, 4, 10),
               Method("chain@6", "eagle3", 6, 1, 6), Method("ngram@8", "ngram", 0, 0, 8)]
    # the chain and n-gram are faster still, but a chain is not a tree: only trees are candidates
    report = _report({"eagle3@6,4,15": [1.6, 2.0], "eagle3@4,4,10": [1.8, 2.2], "chain@6": [3, 3], "ngram@8": [4, 4]})
    tree, how = choose_tree(report, methods, "eagle3")
    assert tree == (4, 4, 10)
    assert how["speedup"] == 2.0 and how["candidates"] == {"eagle3@6,4,15": 1.8, "eagle3@4,4,10": 2.0}
    assert how["prompts"] == {"math": 8, "coding": 8} and how["card"] == "NVIDIA H200"


def test_save_tree_is_refused_off_the_validation_split_or_without_a_tree(head_dir):
    trees = [Method("ar"), Method("eagle3@4,4,10", "eagle3", 4, 4, 10)]
    check_save_tree("validation", str(head_dir), trees, "eagle3")
    with pytest.raises(SuiteError, match="pass --split validation"):
        check_save_tree("test", str(head_dir), trees, "eagle3")
    with pytest.raises(SuiteError, match="not a local folder"):
        check_save_tree("validation", "org/some-head", trees, "eagle3")
    with pytest.raises(SuiteError, match="needs a tree of the head's kind"):
        check_save_tree("validation", str(head_dir), [Method("ar"), Method("chain@6", "eagle3", 6, 1, 6)], "eagle3")


def test_evaluate_save_tree_records_the_fastest_tree(head_dir, tiny_target_dir, tmp_path, capsys):
    code = main(["evaluate", "--target", str(tiny_target_dir), "--draft", str(head_dir), "--methods", "eagle3@2,2,3",
                 "eagle3@3,2,5", "--categories", "math", "--limit", "1", "--max-new-tokens", "4", "--split",
                 "validation", "--save-tree", "--out", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads((tmp_path / "r.json").read_text())
    speed = {m: report["categories"]["math"][m]["speedup_vs_ar"] for m in ("eagle3@2,2,3", "eagle3@3,2,5")}
    best = max(speed, key=speed.get)
    assert head_tree(head_dir) == tuple(int(x) for x in best.split("@")[1].split(","))
    assert f"default tree {best.split('@')[1]}" in out.out
    # on the test split nothing is decoded and nothing written
    assert main(["evaluate", "--target", str(tiny_target_dir), "--draft", str(head_dir), "--methods", "eagle3@2,2,3",
                 "--split", "test", "--save-tree", "--out", str(tmp_path / "t")]) == 2
    assert "pass --split validation" in capsys.readouterr().err and not (tmp_path / "t.json").exists()


def test_the_card_names_the_heads_tree(head_dir, tmp_path):
    from specheads.publish import publish_head

    save_head_tree(head_dir, (4, 4, 10), {"split": "validation", "speedup": 1.7891, "card": "NVIDIA H200",
                                          "candidates": {"a": 1.59, "b": 1.79, "c": 1.41}})
    card = (publish_head(head_dir, "me/x", dry_run=True, output=tmp_path / "s").folder / "README.md").read_text()
    assert ("drafts with this head's own tree by default: 4 steps, topk 4, 10 draft tokens, the fastest of 3 trees "
            "measured on the evaluation suite's validation split (1.79x plain decoding on average, NVIDIA H200)") in card


def test_a_kind_default_tree_serves_where_the_folder_names_none(tmp_path):
    """A Medusa head without its own tree drafts its kind's (2,8,12: chosen on the validation split);
    the folder's own tree still wins, and a kind without one falls back to DEFAULT_TREE."""
    from specheads.heads.medusa import MedusaConfig, MedusaHead
    from specheads.heads.registry import head_kind as get_kind

    cfg = MedusaConfig(hidden_size=32, vocab_size=128, draft_vocab_size=128, target_hidden_size=32,
                       target_num_layers=2, num_heads=3)
    folder = save_head(MedusaHead(cfg), tmp_path / "medusa", torch.float32)
    assert head_tree(folder) is None
    assert load_head(folder).tree == get_kind("medusa").default_tree == (2, 8, 12)
    assert resolve_tree(None, None, None, load_head(folder)) == (2, 8, 12)
    save_head_tree(folder, (1, 4, 4), {"split": "validation"})
    assert load_head(folder).tree == (1, 4, 4)
    assert get_kind("eagle3").default_tree is None
