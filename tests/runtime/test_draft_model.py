"""A standalone draft model on the engine: greedy output equals plain decoding (chain and tree,
batch 1 and 4, eager torch and the Triton kernels under the interpreter), a draft that is the
target itself is accepted almost always (its cache and token ring follow the accepted paths),
seeded sampling is unchanged, rows move with their state; `--draft` tells a language model from a
head, and a draft with another tokenizer is refused."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specheads.drafters import DrafterError
from specheads.drafters.draft_model import DraftLM, check_same_tokenizer, is_language_model, load_draft
from specheads.runtime.engine import EngineError, SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import ar_tokens, make_target, random_prompts, run_joining

VOCAB = 64
PROMPTS = random_prompts(6, VOCAB, [3, 7, 1, 12, 5, 9], seed=11)
NEW = 24
TREES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=3, num_draft_tokens=8)}


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def small():
    """Another (smaller, random) model over the same vocabulary, padded by 8 rows."""
    return DraftLM(make_target(seed=5, vocab=VOCAB + 8, layers=2, max_positions=128))


@pytest.fixture(scope="module")
def reference(target):
    return ar_tokens(target, PROMPTS, NEW)


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("max_batch", [1, 4])
def test_greedy_output_equals_ar(target, small, reference, shape, max_batch):
    engine = SpecEngine(target, small, max_len=64, max_batch=max_batch, **TREES[shape])
    assert engine.method == "draft_model"
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference


@pytest.mark.parametrize("shape", list(TREES))
def test_the_target_as_its_own_draft_is_accepted(target, reference, shape):
    """Drafting with a copy of the target: every draft the target would make, so a chain of 3 is
    accepted whole almost every step (a tree of 8 keeps the greedy path to depth 3 less often);
    a cache or ring that fell behind the accepted tokens would show as rejections."""
    engine = SpecEngine(target, DraftLM(copy.deepcopy(target)), max_len=64, max_batch=4, **TREES[shape])
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference
    fewest = -(-(NEW - 1) // 4)  # every step accepting its 3 drafts (the prefill gives the first token)
    if shape == "chain":
        assert all(r.steps == fewest and r.accepted_tokens == NEW - 1 - fewest for r in results)
    else:
        assert all(r.steps <= fewest + 1 for r in results)


@needs_triton
def test_greedy_output_equals_ar_on_the_triton_kernels(target, reference, monkeypatch):
    interpret_triton(monkeypatch)
    engine = SpecEngine(target, DraftLM(copy.deepcopy(target)), max_len=64, max_batch=4, **TREES["tree"])
    results = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=10))
    assert [r.token_ids for r in results] == [r[:10] for r in reference[:3]]


def test_rows_joining_and_leaving(target, reference):
    """Requests of different lengths leave mid-run; the rows that move keep their draft state."""
    engine = SpecEngine(target, DraftLM(copy.deepcopy(target)), max_len=64, max_batch=3, **TREES["chain"])
    budgets = [5, NEW, 9, NEW, 3, 14]
    assert run_joining(engine, PROMPTS, budgets) == [ref[:n] for ref, n in zip(reference, budgets)]


def test_seeded_sampling_is_the_same_with_and_without_the_draft(target, small):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=16)
    plain = SpecEngine(target, method="ar", max_len=64, max_batch=2).generate(PROMPTS[:4], params)
    spec = SpecEngine(target, small, max_len=64, max_batch=2, **TREES["tree"]).generate(PROMPTS[:4], params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


def test_what_a_draft_model_cannot_do_is_refused(target, small):
    with pytest.raises(EngineError, match="static trees are not supported"):
        SpecEngine(target, small, static_tree="0;1;0,0", max_len=64)
    with pytest.raises(EngineError, match="needs a draft head"):
        SpecEngine(target, method="draft_model", max_len=64)
    short = DraftLM(make_target(seed=5, vocab=VOCAB, layers=1, max_positions=32))
    engine = SpecEngine(target, short, max_len=64, num_steps=2, topk=1)
    with pytest.raises(DrafterError, match="the draft model has 32 positions"):
        engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))


def test_tokenizers_must_match(tokenizer):
    from tests.helpers import build_tokenizer

    check_same_tokenizer(tokenizer, copy.deepcopy(tokenizer))
    with pytest.raises(DrafterError, match="tokenizer differs from the target's"):
        check_same_tokenizer(tokenizer, build_tokenizer(vocab_size=300, seed=5), "draft model 'x'")


def test_draft_tells_a_language_model_from_a_head(tmp_path, tokenizer, tiny_target_dir):
    from tests.helpers import build_tokenizer, save_random_target, tiny_llama_config

    assert is_language_model(tiny_target_dir) and is_language_model(tmp_path / "model.gguf")
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (head_dir / "specheads.json").write_text("{}")
    assert not is_language_model(head_dir)
    exported = tmp_path / "exported"  # a head exported for SGLang: a Llama config that names its kind
    exported.mkdir()
    (exported / "config.json").write_text(json.dumps({"model_type": "llama", "specheads_kind": "eagle"}))
    assert not is_language_model(exported)
    draft = load_draft(str(tiny_target_dir), tokenizer)
    assert isinstance(draft, DraftLM) and draft.spec.vocab_size == len(tokenizer)
    other = tmp_path / "other"
    other_tok = build_tokenizer(vocab_size=300, seed=5)
    save_random_target(other, tiny_llama_config(len(other_tok)), other_tok)
    with pytest.raises(DrafterError, match=f"draft model '{other}'"):
        load_draft(str(other), tokenizer)
    assert torch.is_tensor(next(draft.model.parameters()))


def test_generate_with_a_draft_model_from_the_command_line(capsys, tiny_target_dir):
    """`specheads generate --draft MODEL_FOLDER` drafts with the model (here the target itself):
    the method is draft_model and the tokens are plain decoding's."""
    from tests.runtime.test_cli_generate import _json

    spec = _json(capsys, tiny_target_dir, "--draft", str(tiny_target_dir), "--max-len", "256", "--num-steps", "3",
                 "--topk", "1")
    assert spec["stats"]["method"] == "draft_model" and spec["stats"]["mean_accept_length"] > 2.5
    ar = _json(capsys, tiny_target_dir, "--method", "ar", "--max-len", "256")
    assert [o["token_ids"] for o in spec["outputs"]] == [o["token_ids"] for o in ar["outputs"]]
