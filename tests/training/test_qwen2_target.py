"""The whole head pipeline on a tiny random Qwen2 target (the family of Qwen2.5-Coder-0.5B-Instruct,
whose attention has q/k/v biases): `specheads prepare` of a small conversation file, `specheads
train` of an EAGLE-3 head for a few tens of steps, the saved head folder's config, and greedy
speculative generation with the trained head (chain and tree, batch 1 and 3) that must equal plain
autoregressive decoding token for token while accepting some drafted tokens.

Everything runs on CPU in float32 with the session's tiny ChatML tokenizer, so the target's vocab
is the tokenizer's."""

from __future__ import annotations

import json
import random

import pytest
import torch

from specheads.cli import main
from tests.helpers import (
    BASE_OVERRIDES,
    DRAFT_VOCAB,
    TINY_HIDDEN,
    TINY_LAYERS,
    random_sentence,
    save_random_target,
    tiny_config_kwargs,
    train_records,
)

STEPS = 30
REGEN_TOKENS = 32  # the longest answer the target writes for itself in `prepare --regenerate`
# The tiny Llama fixture re-draws the embedding with std 1.0: its greedy continuations then repeat the
# prompt's last token forever ("\n" after a chat prompt, a token prepare's draft vocab leaves out). A
# smaller std keeps the next-token distributions peaked enough to learn in 30 steps, and the
# continuations depend on the context (they switch tokens), so the exactness check below has teeth.
EMBED_STD = 0.3
NEW = 24  # new tokens per generated prompt
TREES = {"chain": {"num_steps": 3, "topk": 1}, "tree": {"num_steps": 3, "topk": 3, "num_draft_tokens": 8}}


@pytest.fixture(scope="module")
def qwen2_config(tokenizer):
    """The tiny Llama fixture's sizes (tests/helpers.py) as a transformers Qwen2Config."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(**tiny_config_kwargs(len(tokenizer)))
    assert cfg.model_type == "qwen2" and cfg.vocab_size == len(tokenizer)
    return cfg


@pytest.fixture(scope="module")
def qwen2_target_dir(tmp_path_factory, tokenizer, qwen2_config):
    """An HF checkpoint folder of a random Qwen2 model, built like the `tiny_target_dir` fixture
    (every weight random, biases included, the embedding re-drawn) but with EMBED_STD (see above)."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    save_random_target(folder, qwen2_config, tokenizer, seed=0, randomize=True, embed_std=EMBED_STD)
    return folder


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    """A small ShareGPT file: eight short single-exchange conversations (path, rows)."""
    rng = random.Random(7)
    rows = [
        {"id": f"q{i}", "conversations": [{"from": "human", "value": random_sentence(rng, 3, 5)},
                                          {"from": "gpt", "value": random_sentence(rng, 8, 12)}]}
        for i in range(8)
    ]
    path = tmp_path_factory.mktemp("qwen2-data") / "small.json"
    path.write_text(json.dumps(rows))
    return path, rows


@pytest.fixture(scope="module")
def prepared_qwen2(tmp_path_factory, qwen2_target_dir, conversations):
    """`specheads prepare --regenerate` of the conversation file for the Qwen2 target: the target
    writes the assistant turns itself (greedy, on CPU), as EAGLE heads are trained in practice; the
    conversations' own answers are text the random target would never write."""
    out = tmp_path_factory.mktemp("qwen2-prepared") / "prepared"
    assert main(["prepare", "--target", str(qwen2_target_dir), "--data", str(conversations[0]), "--output", str(out),
                 "--max-length", "64", "--draft-vocab-size", str(DRAFT_VOCAB), "--eval-fraction", "0.01",
                 "--regenerate", "--max-new-tokens", str(REGEN_TOKENS), "--devices", "cpu"]) == 0
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, qwen2_target_dir, prepared_qwen2):
    """`specheads train` of an EAGLE-3 head on the Qwen2 target: 30 steps on the prepared conversations."""
    out = tmp_path_factory.mktemp("qwen2-run")
    args = ["train", "--target", str(qwen2_target_dir), "--data", str(prepared_qwen2), "--output-dir", str(out),
            "--max-steps", str(STEPS)]
    for o in [*BASE_OVERRIDES, "train.lr=3e-3"]:
        args += ["--set", o]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def target(qwen2_target_dir):
    from specheads.target.loader import load_target

    model, tok, _ = load_target(qwen2_target_dir)
    return model, tok


@pytest.fixture(scope="module")
def head(run):
    from specheads.heads.format import load_head

    return load_head(run / "final", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(target, conversations):
    """Three chat prompts (the user turns of three training conversations, ChatML-templated)."""
    _, tok = target
    _, rows = conversations
    out = []
    for row in rows[:3]:
        text = tok.apply_chat_template([{"role": "user", "content": row["conversations"][0]["value"]}],
                                       tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


@pytest.fixture(scope="module")
def reference(target, prompts):
    """Plain autoregressive greedy decoding of the prompts (method "ar")."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    model, _ = target
    results = SpecEngine(model, method="ar", max_len=64, max_batch=3).generate(prompts,
                                                                           SamplingParams(max_new_tokens=NEW))
    return [r.token_ids for r in results]


def test_the_target_is_a_qwen2_with_qkv_biases(qwen2_target_dir, target):
    """The checkpoint is a Qwen2 one whose q/k/v projections carry non-zero biases (and o_proj
    none), and our loader reads it as a biased-attention qwen2 target."""
    from safetensors.torch import load_file

    saved = json.loads((qwen2_target_dir / "config.json").read_text())
    assert saved["model_type"] == "qwen2" and saved["architectures"] == ["Qwen2ForCausalLM"]
    state = load_file(str(qwen2_target_dir / "model.safetensors"))
    for proj in ("q_proj", "k_proj", "v_proj"):
        bias = state[f"model.layers.0.self_attn.{proj}.bias"]
        assert float(bias.abs().sum()) > 0, proj
    assert "model.layers.0.self_attn.o_proj.bias" not in state
    model, tok = target
    assert model.spec.model_type == "qwen2" and model.spec.attention_bias
    assert model.spec.vocab_size == len(tok)
    torch.testing.assert_close(model.model.layers[0].self_attn.q_proj.bias,
                               state["model.layers.0.self_attn.q_proj.bias"])


def test_prepare_regenerated_the_answers_with_the_target(prepared_qwen2, conversations, tokenizer, reference):
    """prepare kept all eight conversations (seven train, one eval), picked a draft vocab of
    DRAFT_VOCAB tokens, and replaced every assistant turn with the target's own greedy answer: the
    first three answers begin with the text of plain greedy decoding of the same chat prompts."""
    import gzip

    from specheads.training.data import load_prepared

    report = json.loads((prepared_qwen2 / "prepare_report.json").read_text())
    assert report["regenerated"] is True
    assert report["conversations"] == {"train": 7, "eval": 1}
    assert report["vocab_size"] == report["tokenizer_size"] == len(tokenizer)
    assert report["draft_vocab_size"] == DRAFT_VOCAB
    data = load_prepared(prepared_qwen2)
    assert len(data.train_ids) == 7 and int(data.t2d.sum()) == DRAFT_VOCAB
    _, rows = conversations
    with gzip.open(prepared_qwen2 / "regenerated.jsonl.gz", "rt") as f:
        regenerated = {r["id"]: r for r in map(json.loads, f)}
    assert set(regenerated) == {r["id"] for r in rows}
    for row, ref in zip(rows, reference):
        messages = regenerated[row["id"]]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[0]["content"] == row["conversations"][0]["value"]
        assert messages[1]["content"] != row["conversations"][1]["value"]
        assert messages[1]["content"].startswith(tokenizer.decode(ref)), row["id"]


def test_training_on_the_qwen2_target(run):
    """`specheads train` ran its 30 steps with a record for each, the loss fell by more than half
    (the head overfits the few conversations), the held-out draft accuracy is above zero, and the
    final head folder was written."""
    rows = train_records(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # batches alternate between longer and shorter answers: compare the last five steps' mean
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    assert rows[-1]["acc"][0] > rows[0]["acc"][0]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["eval/acc"][0] > 0
    assert (run / "final" / "model.safetensors").is_file()


def test_saved_head_config_matches_the_qwen2_target(run, qwen2_config, head):
    """config.json and specheads.json record the target's hidden size, vocab, layer count, model type,
    and the three captured layers (EAGLE-3's low/mid/high: outputs of layers 1, L/2 - 1, L - 4),
    SGLang's ids as outputs of layers and vLLM's as inputs (one higher)."""
    n = qwen2_config.num_hidden_layers
    assert n == TINY_LAYERS and qwen2_config.hidden_size == TINY_HIDDEN
    ids = [1, n // 2 - 1, n - 4]
    cfg = json.loads((run / "final" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["target_hidden_size"] == qwen2_config.hidden_size
    assert cfg["hidden_size"] == qwen2_config.hidden_size
    assert cfg["vocab_size"] == qwen2_config.vocab_size
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]
    meta = json.loads((run / "final" / "specheads.json").read_text())
    assert meta["kind"] == "eagle3"
    assert meta["config"]["target_model_type"] == "qwen2"
    assert meta["config"]["target_num_layers"] == n
    assert meta["config"]["target_hidden_size"] == qwen2_config.hidden_size
    assert meta["config"]["target_layer_ids"] == ids
    # the loaded head reads the same layers, and its fc takes three of the target's hidden states
    assert head.config.target_layer_ids == ids
    assert tuple(head.fc.weight.shape) == (qwen2_config.hidden_size, 3 * qwen2_config.hidden_size)


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("max_batch", [1, 3])
def test_greedy_generation_with_the_head_equals_ar(target, head, prompts, reference, shape, max_batch):
    """Greedy speculative decoding with the trained head (chain or tree, one row or three at a
    time) gives exactly the tokens of plain decoding, and accepts some of the head's drafts."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    model, _ = target
    assert all(len(r) == NEW for r in reference), "the reference should not stop early"
    # the continuations change token mid-way (they depend on the context, not on the last token alone)
    assert all(len(set(r)) >= 2 for r in reference), reference
    engine = SpecEngine(model, head, max_len=64, max_batch=max_batch, **TREES[shape])
    assert engine.method == "eagle3+ngram"
    results = engine.generate(prompts, SamplingParams(max_new_tokens=NEW))
    assert [r.token_ids for r in results] == reference
    accepted = sum(r.accepted_tokens for r in results)
    steps = sum(r.steps for r in results)
    assert accepted > 0, "the trained head should have some drafts accepted"
    # it was trained on the target's answers to these very prompts: well over one draft every two steps
    assert accepted > steps / 2, (accepted, steps)
    # every token after the prefill's came from a verify step: its bonus token or an accepted draft
    # (a stop token is produced but not returned)
    assert all(len(r.token_ids) + (r.finish_reason == "stop") == 1 + r.steps + r.accepted_tokens for r in results)
