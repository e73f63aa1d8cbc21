"""Builders shared by the fixtures and the tests: everything offline, everything tiny."""

from __future__ import annotations

import json
import random
import shutil
import socket
from pathlib import Path

import pytest
import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

WORDS = (
    "the a cat dog sat on mat hello world how are you fine thanks model train draft head token speed fast slow "
    "and or but not is was be to of in for with this that what why when where who which user assistant system "
    "please tell me about reply answer question one two three red green blue"
).split()

TINY_LAYERS = 8
TINY_HIDDEN = 64
DRAFT_VOCAB = 200


REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """A script of the repository (e.g. "gpu_runs/kinds_table.py") imported as a module."""
    import importlib.util

    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_sentence(rng: random.Random, lo: int = 3, hi: int = 12) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ""])


def build_tokenizer(vocab_size: int = 400, seed: int = 1234):
    """A byte-level BPE trained on generated text, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    lines = [random_sentence(rng, 3, 15) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config_kwargs(vocab_size: int, **overrides) -> dict:
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=TINY_HIDDEN,
        intermediate_size=128,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    kw.update(overrides)
    return kw


def tiny_llama_config(vocab_size: int, **overrides):
    from transformers import LlamaConfig

    return LlamaConfig(**tiny_config_kwargs(vocab_size, **overrides))


def randomize_(model, seed: int = 0, std: float = 0.08) -> None:
    """Every parameter random (norm weights around 1, biases small), so that no term of the
    forward is trivially zero or one and mistakes in any of them show up in the logits."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.ndim >= 2:
                p.copy_(noise * std)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:  # biases
                p.copy_(0.1 * noise)


def save_random_target(folder: Path, hf_config, tokenizer, seed: int = 0, randomize: bool = False,
                       embed_std: float | None = None):
    """An HF checkpoint folder (config, safetensors, tokenizer) of a random model; returns the HF model.

    embed_std: re-draw the (tied) embedding with this std; a large one (1.0) makes the target's
    next-token distributions peaked, so a draft head has something to learn."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if randomize:
        randomize_(model, seed)
    if embed_std is not None:
        with torch.no_grad():
            emb = model.get_input_embeddings().weight
            emb.copy_(torch.randn(emb.shape, generator=torch.Generator().manual_seed(seed + 1)) * embed_std)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval()


def make_sharegpt_rows(n_good: int = 34, seed: int = 0) -> tuple[list[dict], dict]:
    """Good ShareGPT rows plus known bad ones. Returns (rows, expected skip counts by reason)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n_good):
        turns = []
        if i % 5 == 0:
            turns.append({"from": "system", "value": "You are a " + random_sentence(rng, 2, 4)})
        elif i % 7 == 3:
            # a split row that opens with an answer to an unseen question: stripped by the reader
            turns.append({"from": "gpt", "value": random_sentence(rng)})
        for _ in range(1 + (i % 3)):  # 1..3 exchanges
            turns.append({"from": "human", "value": random_sentence(rng)})
            turns.append({"from": rng.choice(["gpt", "chatgpt", "gpt"]), "value": random_sentence(rng, 4, 16)})
        rows.append({"id": f"good-{i}", "conversations": turns})
    bad = [
        {"id": "bad-noassistant", "conversations": [{"from": "human", "value": "hello there"}]},
        {"id": "bad-blankassistant", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "  "}]},
        {"id": "bad-role", "conversations": [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"id": "bad-empty", "conversations": []},
        {"id": "bad-onlygpt", "conversations": [{"from": "gpt", "value": "orphan answer"}]},
        {"id": "bad-nokey", "text": "no turns here"},
    ]
    expected = {
        "no assistant turn": 2,
        "unknown role 'narrator'": 1,
        "empty conversation": 2,
        "row has neither 'messages' nor 'conversations'": 1,
    }
    for j, b in enumerate(bad):  # interleaved with the good rows
        rows.insert(3 + 5 * j, b)
    return rows, expected


def messages_rows(n: int = 6, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": f"m-{seed}-{i}",
            "messages": [
                {"role": "user", "content": random_sentence(rng)},
                {"role": "assistant", "content": random_sentence(rng)},
            ],
        }
        for i in range(n)
    ]


BASE_OVERRIDES = [
    "train.batch_size=4", "train.ttt_steps=2", "train.lr=1e-3", "train.warmup_ratio=0.0",
    "train.log_every=1", "train.eval_every=100000", "train.save_every=100000", "train.export_dtype=float32",
    "data.eval_max_rows=4", "target.dtype=float32", "train.loss_chunk=64",
]


def train_config(target_dir, data_dir, output_dir, *overrides: str, **direct):
    """A RunConfig for quick CPU runs on the tiny target (later overrides win)."""
    from specheads.config import load_config

    return load_config(
        None, BASE_OVERRIDES + list(overrides),
        **{"target.path": str(target_dir), "data.path": str(data_dir), "output_dir": str(output_dir), **direct},
    )


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def train_records(path) -> list[dict]:
    """The per-step training records of a metrics.jsonl (not the eval ones)."""
    return [r for r in read_jsonl(path) if "loss" in r]


def final_state(run) -> dict:
    """The trained head's tensors of a run folder (run/final/model.safetensors)."""
    from safetensors.torch import load_file

    return load_file(str(Path(run) / "final" / "model.safetensors"))


def kill_and_resume(tmp_path, target_dir, data_dir, capsys, *overrides: str) -> tuple[dict, Path, Path]:
    """Train 4 steps (checkpoints at 2 and 4), remove what a kill after step 2's checkpoint would not
    have written (the later checkpoint, the export), and run the same command again: it says it resumed
    at step 2, appends the records of steps 3 and 4, and ends with the weights and those steps' losses
    of a run that never stopped (checked here). Returns (resumed tensors, the run, the uninterrupted run)."""
    from specheads.training.trainer import train

    args = (*overrides, "train.max_steps=4", "train.save_every=2", "train.batch_size=3")
    run = tmp_path / "run"
    train(train_config(target_dir, data_dir, run, *args))
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_4"]
    assert (ckpts / "step_2" / "done").read_text() == "2"
    n_before = len(read_jsonl(run / "metrics.jsonl"))
    shutil.rmtree(ckpts / "step_4")
    shutil.rmtree(run / "final")
    capsys.readouterr()
    train(train_config(target_dir, data_dir, run, *args))
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 2" in out
    appended = read_jsonl(run / "metrics.jsonl")[n_before:]
    assert [r["step"] for r in appended if "loss" in r] == [3, 4]
    straight = tmp_path / "straight"
    train(train_config(target_dir, data_dir, straight, *overrides, "train.max_steps=4", "train.batch_size=3"))
    resumed, reference = final_state(run), final_state(straight)
    assert set(resumed) == set(reference)
    for k in reference:
        torch.testing.assert_close(resumed[k], reference[k], atol=1e-5, rtol=0, msg=k)
    ref_rows = {r["step"]: r["loss"] for r in train_records(straight / "metrics.jsonl")}
    for r in appended:
        if "loss" in r:
            assert r["loss"] == pytest.approx(ref_rows[r["step"]], abs=1e-4)
    return resumed, run, straight


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matmuls: one thread is fastest, and 2 threads on a busy 2-core box are ~1000x slower.
    Imported by the conftest of each test folder that runs tiny models in loops."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
