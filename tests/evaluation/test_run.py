"""`specheads evaluate` on the tiny target: every method, per-category figures, the multi-turn
context, lossless outputs (float32), the report and its plot; bad method specs are clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.cli import main
from specheads.evaluation.run import Method, contexts, evaluate, parse_methods, save
from specheads.evaluation.suite import EvalPrompt, SuiteError
from tests.runtime.spec_helpers import random_head


def _prompts():
    def p(i, cat, *turns):
        return EvalPrompt(f"t:{i}", cat, "test", tuple(turns), "test", "MIT")
    return [p(0, "writing", "write a poem about the sea"), p(1, "writing", "hello there"),
            p(2, "coding", "def add(a, b):"), p(3, "multi-turn", "hi", "and then what"),
            p(4, "math", "what is two plus two")]


def test_parse_methods():
    ms = parse_methods(["eagle3", "chain@3", "ngram@5", "eagle3@2,2,3"], (6, 4, 15))
    assert [m.name for m in ms] == ["ar", "eagle3@6,4,15", "chain@3", "ngram@5", "eagle3@2,2,3"]
    assert ms[2] == Method("chain@3", "eagle3", 3, 1, 3)
    with pytest.raises(SuiteError, match=r"expected ar, ngram\[@N\], chain\[@S\] or a head kind \(eagle3, mtp, medusa, eagle\)"):
        parse_methods(["hydra"], (6, 4, 15))
    with pytest.raises(SuiteError, match="method 'mtp@2,x,3'"):
        parse_methods(["mtp@2,x,3"], (6, 4, 15))
    ms = parse_methods(["mtp", "chain@2"], (3, 2, 6), "mtp")
    assert ms[1] == Method("mtp@3,2,6", "mtp", 3, 2, 6) and ms[2] == Method("chain@2", "mtp", 2, 1, 2)


def test_multi_turn_context_holds_the_targets_own_first_answer(tiny_target):
    from specheads.data.chat import render
    from specheads.data.regenerate import stop_token_ids
    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams

    model, tok = tiny_target
    prompts = _prompts()
    ctx = contexts(model, tok, prompts, max_new_tokens=6, max_prompt_tokens=512)
    first = tok(render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True),
                add_special_tokens=False)["input_ids"]
    answer = decode(model, [first], SamplingParams(max_new_tokens=6), stop_token_ids(tok))[0]
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": tok.decode(answer, skip_special_tokens=True)},
            {"role": "user", "content": "and then what"}]
    assert ctx[3] == tok(render(tok, msgs, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    assert ctx[0] == tok(render(tok, [{"role": "user", "content": prompts[0].turns[0]}], add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"]


def test_evaluate_reports_every_category_and_method(tiny_target, tmp_path):
    model, tok = tiny_target
    head = random_head(model)
    methods = parse_methods(["eagle3@3,2,4", "chain@3", "ngram@4"], (6, 4, 15))
    report = evaluate(model, tok, head, _prompts(), methods, max_new_tokens=10, progress=lambda s: None)
    assert list(report["categories"]) == ["writing", "math", "coding", "multi-turn"]  # the suite's order
    for cat, cell in report["categories"].items():
        assert set(cell) == {m.name for m in methods}
        assert cell["ar"]["speedup_vs_ar"] == 1.0 and cell["ar"]["mean_accept_length"] == 1.0
        for name, x in cell.items():
            assert x["tokens"] > 0 and x["tokens_per_s"] > 0 and 0 <= x["loop_share"] <= 1
            if name != "ar":
                assert x["identical_to_ar"] == 1.0, (cat, name)  # lossless in float32
                assert x["mean_accept_length"] >= 1.0
    chat = report["chat_macro_average"]["chain@3"]
    chat_cats = ["writing", "math", "multi-turn"]
    assert chat["speedup_vs_ar"] == pytest.approx(
        sum(report["categories"][c]["chain@3"]["speedup_vs_ar"] for c in chat_cats) / 3)
    assert len(report["prompts"]) == 5 and set(report["prompts"][3]["methods"]) == {m.name for m in methods}
    js, png = save(report, tmp_path / "suite")
    assert json.loads(js.read_text())["batch_size"] == 1 and png.stat().st_size > 1000


def test_evaluate_times_the_methods_in_turn_and_in_both_orders(tiny_target, monkeypatch):
    """Every engine is built first, then each category runs the methods one after another, forward in
    one category and backward in the next (a drift over the run falls on every method alike); the
    figures other than time equal those of the methods run one after another (`interleave=False`)."""
    model, tok = tiny_target
    head = random_head(model)
    methods = parse_methods(["eagle3@3,2,4", "ngram@4"], (6, 4, 15))
    calls = []
    build = Method.engine

    def engine(self, *a):
        e = build(self, *a)
        gen = e.generate

        def generate(*args, **kw):
            calls.append(self.name)
            return gen(*args, **kw)
        e.generate = generate
        return e

    monkeypatch.setattr(Method, "engine", engine)
    report = evaluate(model, tok, head, _prompts(), methods, max_new_tokens=8, progress=lambda s: None)
    names = [m.name for m in methods]
    assert calls == names + names[::-1] + names + names[::-1]  # four categories
    calls.clear()
    one = evaluate(model, tok, head, _prompts(), methods, max_new_tokens=8, progress=lambda s: None, interleave=False)
    assert calls == [n for n in names for _ in range(4)]
    for cat, cell in report["categories"].items():
        for name, x in cell.items():
            y = one["categories"][cat][name]
            assert (x["tokens"], x["mean_accept_length"], x["identical_to_ar"]) == (
                y["tokens"], y["mean_accept_length"], y["identical_to_ar"])
    assert report["prompts"] == one["prompts"]
    # each cell holds the machine's clocks read after its run (the host's at least, where it tells one)
    assert all(isinstance(x["machine"], dict) for cell in report["categories"].values() for x in cell.values())


def test_evaluate_command(capsys, tiny_target_dir, tmp_path):
    out = tmp_path / "r"
    code = main(["evaluate", "--target", str(tiny_target_dir), "--methods", "ngram@4", "--categories", "math", "coding",
                 "--limit", "2", "--max-new-tokens", "6", "--split", "validation", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["split"] == "validation" and list(report["categories"]) == ["math", "coding"]
    assert all(c["ar"]["prompts"] == 2 for c in report["categories"].values())
    assert "ngram@4" in captured.out and out.with_suffix(".png").is_file()
    assert not out.with_suffix(".partial.json").exists()  # a finished run leaves the report only


def test_evaluate_command_keeps_the_cells_of_a_run_that_dies(tiny_target_dir, tmp_path, monkeypatch):
    """A run that fails partway (a killed process, a fault) leaves the cells it measured."""
    from specheads.runtime.engine import SpecEngine

    calls, real = [], SpecEngine.generate

    def failing(self, *a, **k):
        calls.append(self.method)
        if len(calls) == 3:  # the first category ran both methods; the second (backward: ngram first) dies
            raise RuntimeError("the card fell over")
        return real(self, *a, **k)

    monkeypatch.setattr(SpecEngine, "generate", failing)
    out = tmp_path / "r"
    with pytest.raises(RuntimeError, match="fell over"):
        main(["evaluate", "--target", str(tiny_target_dir), "--methods", "ngram@4", "--categories", "math", "coding",
              "--limit", "1", "--max-new-tokens", "4", "--split", "validation", "--out", str(out)])
    assert not out.with_suffix(".json").exists()
    kept = json.loads(out.with_suffix(".partial.json").read_text())
    assert kept["complete"] is False and kept["split"] == "validation"
    assert {c: list(v) for c, v in kept["categories"].items()} == {"math": ["ar", "ngram@4"]}
    assert kept["categories"]["math"]["ar"]["tokens"] > 0


def test_evaluate_command_eagle3_without_head_is_a_user_error(capsys, tiny_target_dir, tmp_path):
    code = main(["evaluate", "--target", str(tiny_target_dir), "--methods", "chain", "--out", str(tmp_path / "r")])
    assert code == 2 and "need a draft head (--draft)" in capsys.readouterr().err


def test_evaluate_command_runs_the_heads_own_kind(capsys, tiny_target, tiny_target_dir, tmp_path):
    """With an MTP head and no --methods, the suite runs that head's kind (and chain under it);
    a method of another kind is refused by name."""
    from specheads.heads.format import save_head
    from tests.runtime.spec_helpers import random_head

    model, _ = tiny_target
    folder = save_head(random_head(model, kind="mtp", num_modules=2), tmp_path / "mtp", torch.float32)
    args = ["evaluate", "--target", str(tiny_target_dir), "--draft", str(folder), "--categories", "math", "--limit",
            "1", "--max-new-tokens", "4", "--split", "validation"]
    code = main(args + ["--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((tmp_path / "r.json").read_text())
    assert "mtp@6,4,15" in report["categories"]["math"]
    assert main(args + ["--methods", "eagle3@2,2,3", "--out", str(tmp_path / "s")]) == 2
    assert "need a head of their kind; --draft is a mtp head" in capsys.readouterr().err
