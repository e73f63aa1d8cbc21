"""The eagle head kind (EAGLE-1 feature head) end to end on CPU: its config (JSON and config.json
round trips, validation), the weight table, `specheads train --set head.kind=eagle` on the tiny
target (the loss falls, the held-out evaluation reproduces), the head folder round trip and its
validation, the training loss against a plain reference, the SGLang and vLLM exports checked
against the layouts of docs/formats/medusa-eagle-sources.md (section 3, "What specheads should
write": EAGLE-1), and the speculators export against speculators' `eagle` type at v0.4.0
(docs/formats/speculators-eagle.md)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specheads.cli import main
from specheads.heads.eagle import (LAUNCH, EagleConfig, EagleHead, eagle_loss, eagle_unroll, sglang_tensors,
                                   weight_shapes)
from specheads.heads.format import (HeadFormatError, config_from_folder, hf_config, load_head, save_head,
                                    validate_weights)
from specheads.heads.registry import drafter_class, head_kind, kind_of
from specheads.hub import export_head
from specheads.training.trainer import evaluate_head
from tests.helpers import BASE_OVERRIDES, TINY_HIDDEN, TINY_LAYERS, train_records
from tests.helpers import one_torch_thread  # noqa: F401  (autouse: tiny matmuls run fastest on one thread)

STEPS = 30
TTT_STEPS = 3


# ------------------------------------------------------------------ the layouts the engines load (the fact sheet)
def sheet_layout(fmt: str, c: EagleConfig) -> dict:
    """What docs/formats/medusa-eagle-sources.md says each engine loads for an EAGLE-1 head of config c:
    tensor name -> shape, the config.json keys with their values, and names that must not be there.

    vLLM 0.33.0 `llama_eagle` (3a): fc [H, 2H] without bias; layers.0 q/k/v/o, gate/up/down,
    post_attention_layernorm; no layers.0.input_layernorm, no norm, no lm_head (AutoWeightsLoader raises
    on unknown names); a plain Llama config, architectures ["LlamaForCausalLM"].
    SGLang 0.5.23 `LlamaForCausalLMEagle` (3b): the same tensors plus fc.bias [H] (nn.Linear(2H, H)
    with a bias; a missing one keeps its random init); architectures ["LlamaForCausalLMEagle"]."""
    h, i = c.hidden_size, c.intermediate_size
    hq, hkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    tensors = {
        "fc.weight": (h, 2 * h),
        "layers.0.self_attn.q_proj.weight": (hq, h), "layers.0.self_attn.k_proj.weight": (hkv, h),
        "layers.0.self_attn.v_proj.weight": (hkv, h), "layers.0.self_attn.o_proj.weight": (h, hq),
        "layers.0.mlp.gate_proj.weight": (i, h), "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i), "layers.0.post_attention_layernorm.weight": (h,),
    }
    absent = {"layers.0.input_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight"}
    if fmt == "sglang":
        tensors["fc.bias"] = (h,)
    else:
        absent.add("fc.bias")
    config = {
        "architectures": ["LlamaForCausalLMEagle"] if fmt == "sglang" else ["LlamaForCausalLM"],
        "model_type": "llama", "num_hidden_layers": 1, "hidden_size": h, "intermediate_size": i,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings, "rope_theta": c.rope_parameters["rope_theta"],
        "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "vocab_size": c.vocab_size, "torch_dtype": "bfloat16",
    }
    return {"tensors": tensors, "config": config, "absent": absent}


def speculators_layout(c: EagleConfig, verifier: str | None) -> dict:
    """What speculators' `eagle` type loads for an EAGLE-1 head of config c, read from
    vllm-project/speculators@d2914dce0dde75a653ba88aa7b2ef05faa757761 (tag v0.4.0), the type's last
    release (removed in 792b9e6c):

    src/speculators/models/eagle.py: `speculators_model_type: "eagle"` (77); architectures
    ["EagleSpeculator"] plus the decoder layer's class, "LlamaDecoderLayer" (78-86, 592-600, 632-636);
    `transformer_layer_config` a Llama config dict with its model_type (96-105, 158-179: AutoConfig.for_model);
    `layernorms`, `fusion_bias` (106-127). Modules (350-361, 572-590): `fusion_fc` Linear(2H, H, bias=
    fusion_bias) over cat([embedding, hidden]) (507-509); `transformer` one LlamaDecoderLayer whose
    input_layernorm is nn.Identity without layernorms (no tensor); `embedding_layernorm` and
    `pre_lm_head_layernorm` only with layernorms; embed_tokens and lm_head are the verifier's, never
    saved (237-246). src/speculators/config.py: speculators_version (270-273), speculators_config
    {algorithm, proposal_methods, default_proposal_method, verifier {name_or_path, architectures}}
    (109-157); no top-level model_type (296-322). src/speculators/proposals/greedy.py: greedy's
    speculative_tokens, verifier_accept_k, accept_tolerance (38-73)."""
    h, i = c.hidden_size, c.intermediate_size
    hq, hkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    p = "transformer."
    tensors = {
        "fusion_fc.weight": (h, 2 * h),
        p + "self_attn.q_proj.weight": (hq, h), p + "self_attn.k_proj.weight": (hkv, h),
        p + "self_attn.v_proj.weight": (hkv, h), p + "self_attn.o_proj.weight": (h, hq),
        p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        p + "post_attention_layernorm.weight": (h,),
    }
    absent = {"fusion_fc.bias", p + "input_layernorm.weight", "embedding_layernorm.weight",
              "pre_lm_head_layernorm.weight", "embed_tokens.weight", "lm_head.weight"}
    config = {
        "speculators_model_type": "eagle", "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "transformer_layer_architecture": "LlamaDecoderLayer", "layernorms": False, "fusion_bias": False,
        "speculators_config": {
            "algorithm": "eagle",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
    layer = {"model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": h, "intermediate_size": i,
             "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
             "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
             "rope_theta": c.rope_parameters["rope_theta"], "attention_bias": False, "mlp_bias": False}
    return {"tensors": tensors, "absent": absent, "config": config, "layer": layer}


# specheads' own keys beside the engines' (none holds "num" next to "layers" or "heads")
SPECHEADS_KEYS = {"specheads_kind", "specheads_target", "specheads_target_depth", "specheads_feature_layer",
                  "specheads_target_model_type"}


# ------------------------------------------------------------------ config
def test_config_round_trips_and_validates(tiny_target):
    model = tiny_target[0]
    cfg = EagleConfig.for_target(model, 123, None, intermediate_size=96)  # a draft vocabulary does not apply
    assert cfg.target_layer_ids == [TINY_LAYERS] and cfg.draft_vocab_size == cfg.vocab_size == model.spec.vocab_size
    assert cfg.hidden_size == cfg.target_hidden_size == TINY_HIDDEN and cfg.intermediate_size == 96
    assert cfg.fixed_depth() is None  # one layer, unrolled to any depth
    assert EagleConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert EagleConfig.from_hf(json.loads(json.dumps(cfg.to_hf(torch.float32, "org/t")))) == cfg
    assert kind_of(cfg) is head_kind("eagle")  # not eagle3, whose config it extends
    assert hf_config(cfg, torch.float32, None)["specheads_kind"] == "eagle"
    with pytest.raises(ValueError, match=r"final hidden state.*target_layer_ids=\[8\]\); got target_layer_ids=\[5\]"):
        EagleConfig.for_target(model, None, [5])
    bad = EagleConfig.from_dict({**cfg.to_dict(), "draft_vocab_size": 100})
    with pytest.raises(ValueError, match="whole vocabulary"):
        bad.validate()
    with pytest.raises(ValueError, match="target's hidden size"):
        EagleConfig.from_dict({**cfg.to_dict(), "hidden_size": 32}).validate()


def test_weight_table_is_the_modules_state(tiny_target):
    head = EagleHead(EagleConfig.for_target(tiny_target[0], None))
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == weight_shapes(head.config)
    assert head.fc.bias is None and "layers.0.input_layernorm.weight" not in head.state_dict()
    kind = head_kind("eagle")
    assert kind.architectures() == ("LlamaForCausalLMEagle", "LlamaForCausalLM", "EagleSpeculator", "LlamaDecoderLayer")
    assert drafter_class(kind).__name__ == "Eagle1Drafter"


def test_the_target_lm_head_is_read_not_owned(tiny_target):
    model = tiny_target[0]
    head = EagleHead(EagleConfig.for_target(model, None))
    x = torch.randn(3, TINY_HIDDEN)
    with pytest.raises(RuntimeError, match="attach_target"):
        head.readout(x)
    head.attach_target(model)
    features, weight = head.readout(x)
    assert features is x and weight.data_ptr() == model.lm_head.weight.data_ptr()
    torch.testing.assert_close(head.logits(x), model.lm_head(x))
    assert not any(p is model.lm_head.weight for p in head.parameters())
    assert set(head.state_dict()) == set(weight_shapes(head.config))  # nothing of the target's is saved
    assert torch.equal(head.target_rows(), torch.arange(model.spec.vocab_size))


# ------------------------------------------------------------------ the loss
def test_loss_is_smooth_l1_plus_a_tenth_of_the_soft_cross_entropy(tiny_target):
    """eagle_loss against a plain autograd reference (value and gradients), two unrolled steps."""
    model = tiny_target[0]
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.for_target(model, None)).attach_target(model)
    ids = torch.randint(0, model.spec.vocab_size, (2, 12))
    mask = torch.zeros_like(ids)
    mask[:, 5:] = 1
    with torch.no_grad():
        out = model(ids, capture_layers=[TINY_LAYERS], return_logits=False)
    torch.testing.assert_close(out.aux_hidden, out.hidden)  # capture id L: the final normed hidden state
    w = model.lm_head.weight
    stats = eagle_loss(head, model.embed_tokens, ids, mask, out.aux_hidden, out.hidden, w, steps=2, decay=0.5,
                       chunk=7)
    stats.loss.backward()
    assert model.lm_head.weight.grad is None  # the target's lm_head is read, not trained
    got = {n: p.grad.clone() for n, p in head.named_parameters()}
    head.zero_grad()
    w = w.detach()
    outputs = eagle_unroll(head, model.embed_tokens, ids, out.aux_hidden, 2)
    denom = int(mask[:, 2:].sum())
    ref = 0.0
    for k, pred in enumerate(outputs):
        rows = torch.zeros_like(mask, dtype=torch.bool)
        rows[:, : 12 - 2 - k] = mask[:, 2 + k:].bool()
        target = torch.zeros_like(out.hidden)
        target[:, : 12 - 1 - k] = out.hidden[:, 1 + k:]
        h, t = pred[rows], target[rows]
        feat = torch.nn.functional.smooth_l1_loss(h, t, reduction="none").mean(-1).sum()
        ce = -(torch.softmax(t @ w.t(), -1) * torch.log_softmax(h @ w.t(), -1)).sum()
        ref = ref + 0.5**k * (feat + 0.1 * ce) / denom
        assert stats.step_rows[k] == int(rows.sum())
    torch.testing.assert_close(stats.loss, ref)
    ref.backward()
    for n, p in head.named_parameters():
        torch.testing.assert_close(got[n], p.grad, atol=1e-6, rtol=1e-4, msg=n)


# ------------------------------------------------------------------ training from the CLI
@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_target_dir, small_prepared_dir):
    """`specheads train` of an EAGLE-1 head: 30 steps on four short conversations (it overfits them)."""
    out = tmp_path_factory.mktemp("eagle-run")
    args = ["train", "--target", str(tiny_target_dir), "--data", str(small_prepared_dir), "--output-dir", str(out),
            "--max-steps", str(STEPS)]
    for o in [*BASE_OVERRIDES, "head.kind=eagle", f"train.ttt_steps={TTT_STEPS}", "train.lr=3e-3"]:
        args += ["--set", o]
    assert main(args) == 0
    return out


def test_cli_trains_an_eagle_head(run, tiny_target):
    rows = train_records(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert rows[-1]["acc"][0] > rows[0]["acc"][0]
    assert all(len(r["acc"]) == TTT_STEPS for r in rows)  # any depth: one entry per unrolled step
    meta = json.loads((run / "final" / "specheads.json").read_text())
    assert meta["kind"] == "eagle" and meta["config"]["target_layer_ids"] == [TINY_LAYERS]
    # the data's draft vocabulary (DRAFT_VOCAB) does not apply: the target's lm_head reads out every token
    assert meta["config"]["draft_vocab_size"] == tiny_target[0].spec.vocab_size
    summary = json.loads((run / "train_summary.json").read_text())
    assert len(summary["eval/acc"]) == TTT_STEPS and summary["eval/acc"][0] > 0
    assert 1.0 <= summary["eval/accept_length"] <= 1 + TTT_STEPS


def test_eval_of_the_saved_head_reproduces_the_runs_evaluation(run, tiny_target_dir, small_prepared_dir):
    """`specheads eval` rebuilds the trainer, which hands the head the target's lm_head."""
    summary = json.loads((run / "train_summary.json").read_text())
    got = evaluate_head(str(run / "final"), str(small_prepared_dir), str(tiny_target_dir), rows=4, batch_size=4,
                        ttt_steps=TTT_STEPS)
    for key in ("eval/acc", "eval/chain_acc", "eval/loss"):
        assert got[key] == pytest.approx(summary[key], abs=2e-4), key
    assert got["eval/accept_length"] == pytest.approx(summary["eval/accept_length"], abs=2e-4)


# ------------------------------------------------------------------ the head folder
def test_head_folder_round_trip(run, tmp_path):
    final = run / "final"
    head = load_head(final)
    assert isinstance(head, EagleHead) and head.kind == "eagle"
    raw = json.loads((final / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["specheads_kind"] == "eagle"
    tensors = load_file(str(final / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == weight_shapes(head.config)
    state = torch.load(run / "checkpoints" / f"step_{STEPS}" / "state.pt", weights_only=True)["head"]
    for name, t in tensors.items():  # the exported weights (float32) are the trainer's last weights
        assert torch.equal(t, state[name]), name
    again = load_head(save_head(head, tmp_path / "again", torch.float32))
    assert isinstance(again, EagleHead) and again.config == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], t), name
    bare = tmp_path / "bare"  # without specheads.json: config.json's keys give the same head
    shutil.copytree(final, bare)
    (bare / "specheads.json").unlink()
    assert load_head(bare).config == head.config


def _wrong_shape(t):
    t["fc.weight"] = torch.zeros(TINY_HIDDEN, 3 * TINY_HIDDEN)


def _input_norm(t):  # layer 0 has no input norm (vLLM would refuse the name)
    t["layers.0.input_layernorm.weight"] = torch.ones(TINY_HIDDEN)


def _final_norm(t):  # nor a final norm
    t["norm.weight"] = torch.ones(TINY_HIDDEN)


def _missing(t):
    del t["layers.0.post_attention_layernorm.weight"]


@pytest.mark.parametrize("edit, message", [
    (_wrong_shape, rf"fc.weight has shape \({TINY_HIDDEN}, {3 * TINY_HIDDEN}\), expected \({TINY_HIDDEN}, "
                   rf"{2 * TINY_HIDDEN}\)"),
    (_input_norm, r"unexpected tensors \['layers.0.input_layernorm.weight'\]"),
    (_final_norm, r"unexpected tensors \['norm.weight'\]"),
    (_missing, r"missing tensor layers.0.post_attention_layernorm.weight"),
], ids=["shape", "input-norm", "final-norm", "missing"])
def test_validation_rejects_wrong_tensors(run, tmp_path, edit, message):
    folder = tmp_path / "edited"
    shutil.copytree(run / "final", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(HeadFormatError, match=message):
        validate_weights(tensors, load_head(run / "final").config, "under test")
    with pytest.raises(HeadFormatError, match=message):
        load_head(folder)


# ------------------------------------------------------------------ exports
@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_export_has_the_layout_the_engine_loads(run, tmp_path, fmt):
    head = load_head(run / "final")
    out = export_head(run / "final", fmt, tmp_path / fmt, dtype=torch.bfloat16)
    want = sheet_layout(fmt, head.config)
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == want["tensors"]
    assert not want["absent"] & set(tensors)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    state = head.state_dict()
    for name, t in tensors.items():
        if name == "fc.bias":  # SGLang's fc has a bias; the head trains without one
            assert not t.any()
        else:
            assert torch.equal(t, state[name].to(torch.bfloat16)), name
    cfg = json.loads((out / "config.json").read_text())
    assert set(cfg) == set(want["config"]) | SPECHEADS_KEYS
    assert {k: cfg[k] for k in want["config"]} == want["config"]
    assert cfg["specheads_kind"] == "eagle" and cfg["specheads_feature_layer"] == TINY_LAYERS
    serving = (out / "SERVING.md").read_text()
    if fmt == "sglang":
        assert "--speculative-algorithm EAGLE " in serving and str(out.resolve()) in serving
        assert not (out / "specheads.json").exists()  # SGLang's tensor names: no longer specheads' own folder
    else:
        assert '"method": "eagle"' in serving and str(out.resolve()) in serving
        assert isinstance(load_head(out), EagleHead)  # the head's own tensors: it loads back


def test_sglang_tensors_add_only_a_zero_bias():
    tensors = {"fc.weight": torch.randn(4, 8, dtype=torch.float16), "layers.0.mlp.up_proj.weight": torch.randn(6, 4)}
    out = sglang_tensors(tensors, None)
    assert set(out) == set(tensors) | {"fc.bias"}
    assert out["fc.bias"].dtype == torch.float16 and out["fc.bias"].shape == (4,) and not out["fc.bias"].any()


def test_publish_dry_run_names_eagle1_and_both_engines(run, tmp_path, capsys):
    out = tmp_path / "staged"
    assert main(["publish", str(run / "final"), "--repo-id", "me/tiny-eagle", "--dry-run", "--output", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "# EAGLE-1 draft head for" in card and "- eagle\n" in card.split("---")[1]
    assert "| architecture | EAGLE-1 feature head" in card
    assert "--speculative-algorithm EAGLE " in card and '"method": "eagle"' in card
    assert "specheads export --format sglang" in card
    assert LAUNCH["vllm"].split()[0] == "vllm"


# ------------------------------------------------------------------ speculators' eagle type (v0.4.0)
def _speculators_export(run, out, target_name="HuggingFaceTB/SmolLM2-135M-Instruct"):
    folder = out.parent / "named"  # the run's head, with a target that has a hub id (the verifier's name_or_path)
    head = load_head(run / "final")
    save_head(head, folder, torch.float32, target_name=target_name)
    return head, export_head(folder, "speculators", out, dtype=torch.bfloat16)


def test_speculators_export_has_the_layout_speculators_loads(run, tmp_path):
    head, out = _speculators_export(run, tmp_path / "spec")
    want = speculators_layout(head.config, "HuggingFaceTB/SmolLM2-135M-Instruct")
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == want["tensors"]
    assert not want["absent"] & set(tensors)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    state = head.state_dict()
    for name, t in tensors.items():  # fc as fusion_fc, layers.0 as transformer: the same values
        theirs, ours = ("fusion_fc.", "fc.") if name.startswith("fusion_fc.") else ("transformer.", "layers.0.")
        ours += name[len(theirs):]
        assert torch.equal(t, state[ours].to(torch.bfloat16)), name
    cfg = json.loads((out / "config.json").read_text())
    assert {k: cfg[k] for k in want["config"]} == want["config"]
    assert "model_type" not in cfg  # speculators' to_dict drops it
    assert {k: cfg["transformer_layer_config"][k] for k in want["layer"]} == want["layer"]
    assert cfg["dtype"] == "bfloat16" and cfg["speculators_version"] == "0.4.0"
    assert cfg["specheads_kind"] == "eagle" and cfg["specheads_feature_layer"] == TINY_LAYERS
    # speculators' names: no longer specheads' own folder; no engine at our pins serves the type, so no launch
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_speculators_export_round_trips(run, tmp_path, capsys):
    """The exported folder reads back as the same head (its bf16 weights), and exports again to the
    same speculators folder and to vLLM's layout."""
    head, out = _speculators_export(run, tmp_path / "spec")
    assert config_from_folder(out) == head.config
    back = load_head(out)
    assert isinstance(back, EagleHead) and back.config == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], t.to(torch.bfloat16)), name
    again = export_head(out, "speculators", tmp_path / "again")
    assert json.loads((again / "config.json").read_text()) == json.loads((out / "config.json").read_text())
    a, b = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    vllm = load_file(str(export_head(out, "vllm", tmp_path / "vllm") / "model.safetensors"))
    assert set(vllm) == set(weight_shapes(head.config))
    capsys.readouterr()
    assert main(["export", str(run / "final"), "--format", "speculators", "--output", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    assert "no SERVING.md" in printed and (tmp_path / "cli" / "model.safetensors").is_file()


def test_a_speculators_eagle_folder_of_another_tool(run, tmp_path):
    """A speculators eagle folder without specheads' keys (another tool wrote it) loads: its layer
    from transformer_layer_config, the target's family from the verifier's architecture."""
    head, out = _speculators_export(run, tmp_path / "spec")
    cfg = json.loads((out / "config.json").read_text())
    theirs = {k: v for k, v in cfg.items() if not k.startswith("specheads_")}
    theirs["speculators_config"]["verifier"]["architectures"] = ["Qwen2ForCausalLM"]
    (out / "config.json").write_text(json.dumps(theirs))
    got = load_head(out).config
    layer = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "rms_norm_eps", "max_position_embeddings", "rope_parameters", "vocab_size", "draft_vocab_size")
    assert {k: getattr(got, k) for k in layer} == {k: getattr(head.config, k) for k in layer}
    assert got.target_model_type == "qwen2"
    for flag in ("layernorms", "fusion_bias"):  # another function than this head's: refused, named
        (out / "config.json").write_text(json.dumps({**theirs, flag: True}))
        with pytest.raises(HeadFormatError, match=f"{flag}=true is not an EAGLE-1 head of specheads"):
            load_head(out)
    qwen3 = {**theirs, "transformer_layer_config": {**theirs["transformer_layer_config"], "model_type": "qwen3"},
             "transformer_layer_architecture": "Qwen3DecoderLayer"}
    (out / "config.json").write_text(json.dumps(qwen3))
    with pytest.raises(HeadFormatError, match=r"a qwen3 layer \(Qwen3DecoderLayer\) is not an EAGLE-1 head"):
        load_head(out)
