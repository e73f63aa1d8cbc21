"""EAGLE-3 draft head.

    h0      = fc(concat(target layer outputs low, mid, high))        [.., H]
    x       = concat(input_layernorm(embed(token)), hidden_norm(h))  [.., 2H]  (embeddings first)
    h'      = h + o_proj(attn(x))
    h'      = h' + mlp(post_attention_layernorm(h'))
    logits  = lm_head(norm(h'))                                       over the draft vocab
    next step feeds on h' (pre-norm), not on fc again.

With `num_layers` > 1 the layer above is the first of a stack: each later layer is a plain
Llama decoder layer on the hidden state (h' = h + o_proj(attn(input_layernorm(h))), then the
MLP), with its own KV cache, and the last one's output is h'. vLLM loads that stack
(`layers.{i}.*` beside `midlayer.*`); SGLang does not (see `EXPORT_REFUSALS`).

The token embedding is the target's (frozen, shared, never saved): callers pass embeddings
(`draft_step` takes token ids and the table).
Parameter names match the checkpoint layout SGLang and vLLM load (`fc`, `midlayer.*`,
`norm`, `lm_head`, buffers `d2t`, `t2d`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specheads.heads.kind import HeadKindError
from specheads.heads.draft_vocab import DraftVocab, readout_from_target
from specheads.heads.fused_layer import draft_logits, draft_tile, fuse_layer, fuse_readout, layer_finish, layer_over_cache
from specheads.kernels.attention import tree_attention
from specheads.kernels.draft import head_input, head_input_reference
from specheads.kernels.fused import rmsnorm, rope_cache
from specheads.kernels.linear import linear
from specheads.modules import GatedMLP, RMSNorm, RotaryTable, apply_rotary, repeat_kv, rope_inv_freq

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what SGLang and vLLM load an EAGLE-3 head folder as


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    # outputs of these target decoder layers (0-based) feed `fc`, in this order
    target_layer_ids: list[int] = field(default_factory=list)
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    target_model_type: str = "llama"
    num_layers: int = 1  # draft decoder layers: the first fuses [embedding; hidden], later ones are plain Llama layers

    # the run config's head.* shape options this kind takes (kinds whose configs subclass this one set their own)
    SHAPE_OPTIONS = ("num_layers",)
    MAX_LAYERS = 8

    @classmethod
    def for_target(cls, target, draft_vocab_size: int, layer_ids: list[int] | None = None, **overrides):
        spec = target.spec
        hf = target.hf_config
        layer_ids = list(layer_ids) if layer_ids else target.default_capture_layers()
        cfg = cls(
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            head_dim=spec.head_dim,
            rms_norm_eps=spec.rms_norm_eps,
            max_position_embeddings=spec.max_position_embeddings,
            vocab_size=spec.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=spec.hidden_size,
            target_num_layers=spec.num_hidden_layers,
            target_layer_ids=layer_ids,
            rope_parameters=dict(getattr(hf, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}),
            target_model_type=spec.model_type,
        )
        for k, v in overrides.items():
            if v is not None:
                setattr(cfg, k, v)
        cfg.validate()
        return cfg

    def validate(self) -> "Eagle3Config":
        if len(self.target_layer_ids) != 3:
            raise ValueError(f"EAGLE-3 fuses 3 target layers; got target_layer_ids={self.target_layer_ids}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_num_layers]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} outside the target's layers 0..{self.target_num_layers - 1}"
            )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) \
                or not 1 <= self.num_layers <= self.MAX_LAYERS:
            raise ValueError(f"head.num_layers={self.num_layers!r}: an EAGLE-3 head has 1..{self.MAX_LAYERS} draft "
                             "decoder layers (an integer; 1 is the published EAGLE-3 shape)")
        return self

    def fixed_depth(self) -> int | None:
        """Draft depths fixed by the head's shape (None: the layers unrolled to any depth)."""
        return None

    def refused_exports(self) -> dict[str, str]:
        """Export formats this head's shape cannot be loaded in, with the reason (export and the
        model card read it)."""
        if self.num_layers == 1:
            return {}
        return {fmt: f"a {self.num_layers}-layer EAGLE-3 head (head.num_layers={self.num_layers}) does not load in "
                     f"{fmt}: {why}; export it for vllm or speculators (vLLM loads several layers), or train "
                     "head.num_layers=1" for fmt, why in MULTI_LAYER_REFUSALS.items()}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Eagle3Config":
        return cls(**d)

    def to_hf(self, dtype: torch.dtype, target_name: str | None) -> dict:
        """config.json as SGLang and vLLM load it, with both engines' layer-id keys.

        Our `target_layer_ids` are OUTPUTS of 0-based decoder layers. SGLang reads
        `eagle_config.eagle_aux_hidden_state_layer_ids` in that same convention (it adds one to
        get the layer whose input it captures); vLLM reads the top-level
        `eagle_aux_hidden_state_layer_ids` as the layer whose INPUT it captures, i.e. ours + 1.
        Writing both makes one folder load in either engine."""
        return {
            "architectures": [ARCHITECTURE],
            **self.llama_layer_hf(),
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "norm_before_residual": False,
            # vLLM: ids of the layers whose input is captured (= our output ids + 1)
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in self.target_layer_ids],
            # SGLang: ids of the layers whose output is captured
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.target_layer_ids),
                "use_aux_hidden_state": True,
            },
            "torch_dtype": str(dtype).replace("torch.", ""),
            "specheads_target": target_name,
        }

    def llama_layer_hf(self) -> dict:
        """The head's decoder layers as a Llama config (the keys both engines read)."""
        return {"model_type": "llama", "num_hidden_layers": self.num_layers, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim, "hidden_act": "silu",
                "rms_norm_eps": self.rms_norm_eps, "max_position_embeddings": self.max_position_embeddings,
                **self.hf_rope(), "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
                "vocab_size": self.vocab_size}

    def hf_rope(self) -> dict:
        """rope_theta and rope_scaling (None for the default rope) as HF configs write them."""
        rope = dict(self.rope_parameters)
        return {"rope_theta": rope.get("rope_theta", 10000.0),
                "rope_scaling": None if rope.get("rope_type", "default") == "default" else
                {k: v for k, v in rope.items() if k != "rope_theta"}}

    @staticmethod
    def rope_from_hf(raw: dict) -> dict:
        """rope_parameters from an HF config's rope_theta and rope_scaling."""
        rope = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)}
        if raw.get("rope_scaling"):
            rope = {**raw["rope_scaling"], "rope_theta": raw.get("rope_theta", 10000.0)}
            rope.setdefault("rope_type", rope.pop("type", "default"))
        return rope

    @staticmethod
    def layer_from_hf(raw: dict) -> dict:
        """The decoder layer's fields from an HF config (sizes, heads, norm eps, positions)."""
        return dict(hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
                    num_attention_heads=raw["num_attention_heads"],
                    num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
                    head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
                    rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
                    max_position_embeddings=raw.get("max_position_embeddings", 2048))

    @classmethod
    def from_hf(cls, raw: dict) -> "Eagle3Config":
        """The config of a head folder written by another tool, from its config.json keys."""
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is None and raw.get("eagle_aux_hidden_state_layer_ids"):
            ids = [i - 1 for i in raw["eagle_aux_hidden_state_layer_ids"]]
        rope = cls.rope_from_hf(raw)
        n_target = raw.get("target_num_hidden_layers") or (max(ids) + 4 if ids else 32)
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            vocab_size=raw["vocab_size"],
            draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
            target_num_layers=n_target,
            target_layer_ids=ids or [1, n_target // 2 - 1, n_target - 4],
            rope_parameters=rope,
            num_layers=raw.get("num_hidden_layers", 1),
        )

    def rope_config(self):
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=dict(self.rope_parameters),
        )


def head_mismatches(cfg: Eagle3Config, spec) -> list[str]:
    """What keeps a head of config `cfg` from running on a target of spec `spec` (empty: it fits)."""
    problems = []
    if cfg.hidden_size != spec.hidden_size:
        problems.append(f"head hidden size {cfg.hidden_size} differs from the target's embedding width {spec.hidden_size}")
    if cfg.target_hidden_size != spec.hidden_size:
        problems.append(f"head expects target hidden size {cfg.target_hidden_size}, target has {spec.hidden_size}")
    if cfg.vocab_size != spec.vocab_size:
        problems.append(f"head expects vocab {cfg.vocab_size}, target has {spec.vocab_size}")
    if max(cfg.target_layer_ids) >= spec.num_hidden_layers:
        problems.append(f"head reads target layers {cfg.target_layer_ids}, target has {spec.num_hidden_layers}")
    return problems


def weight_shapes(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a saved head, name -> shape (the names SGLang and vLLM load; no embed_tokens).
    Layers after the first are `layers.{i}.*` (i >= 1), the names vLLM's loader gives them."""
    c = cfg
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    later = {}
    for i in range(1, c.num_layers):
        p = f"layers.{i}."
        later.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "hidden_norm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (q, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        })
    return {
        "fc.weight": (c.hidden_size, 3 * c.target_hidden_size),
        "midlayer.input_layernorm.weight": (c.hidden_size,),
        "midlayer.hidden_norm.weight": (c.hidden_size,),
        "midlayer.post_attention_layernorm.weight": (c.hidden_size,),
        "midlayer.self_attn.q_proj.weight": (c.num_attention_heads * c.head_dim, 2 * c.hidden_size),
        "midlayer.self_attn.k_proj.weight": (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
        "midlayer.self_attn.v_proj.weight": (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
        "midlayer.self_attn.o_proj.weight": (c.hidden_size, c.num_attention_heads * c.head_dim),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
        "midlayer.mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        **later,
        "norm.weight": (c.hidden_size,),
        "lm_head.weight": (c.draft_vocab_size, c.hidden_size),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }


# Exports for one engine: only the layer-id key that engine reads, in its own convention, so
# nothing depends on which key an engine version prefers.
# Why an engine cannot load a head of several decoder layers (read from the loaders' sources):
# vLLM (vllm/model_executor/models/llama_eagle3.py at 00bd149) builds `layers.0..n-1` from
# num_hidden_layers, renames `midlayer.` to `layers.0.`, gives layers after the first a qkv over
# the hidden size and a pre-norm Llama layer (input_layernorm with the residual): it loads ours.
# Its loader refuses a checkpoint that leaves a parameter unset, and it builds `hidden_norm` in
# every layer, so later layers carry one (unused, like vLLM's).
MULTI_LAYER_REFUSALS = {
    "sglang": ("SGLang's LlamaForCausalLMEagle3 (python/sglang/srt/models/llama_eagle3.py at 03d5a77) runs "
               "layers after the first as `additional_layers.{i-1}` of BasicDecoderLayer, which norms with "
               "hidden_norm and drops the residual the layer before returns, so it computes another function "
               "than this head's plain Llama layers (and its loader skips names it does not know, so "
               "`layers.{i}.*` would be left random without an error)"),
}


def refuse_multi_layer(cfg: "Eagle3Config", fmt: str) -> None:
    reason = cfg.refused_exports().get(fmt)
    if reason:
        raise HeadKindError(reason)


def sglang_config(head: "Eagle3Head", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json for SGLang: `eagle_config.eagle_aux_hidden_state_layer_ids` = outputs of layers (ours)."""
    refuse_multi_layer(head.config, "sglang")
    cfg = head.config.to_hf(dtype, target_name)
    del cfg["eagle_aux_hidden_state_layer_ids"]
    return cfg


def vllm_config(head: "Eagle3Head", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json for vLLM: top-level `eagle_aux_hidden_state_layer_ids` = inputs of layers (ours + 1)."""
    cfg = head.config.to_hf(dtype, target_name)
    cfg["eagle_config"] = {"use_aux_hidden_state": True}
    return cfg


# vLLM's speculators format (speculators 0.9.0, read by vLLM 0.33.0): docs/formats/speculators-eagle3.md
SPECULATORS_ARCHITECTURE = "Eagle3DraftModel"
SPECULATORS_VERSION = "0.9.0"  # the release whose layout the export writes (docs/formats/speculators-eagle3.md)
VERIFIER_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM"}


def speculators_section(algorithm: str, cfg: "Eagle3Config", target_name: str | None) -> dict:
    """`speculators_config` of a speculators folder (the same keys in 0.4.0 and 0.9.0): one greedy
    proposal method of 5 tokens, the verifier by hub id (null where none is known)."""
    from specheads.heads.fetch import base_model_id

    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1,
                              "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": base_model_id(target_name),
                     "architectures": [VERIFIER_ARCHITECTURES.get(cfg.target_model_type, "LlamaForCausalLM")]},
    }


def speculators_config(head: "Eagle3Head", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json in the speculators layout: no top-level model_type (how vLLM tells the format
    apart), layer ids as inputs of layers (ours + 1), every norm flag written out (vLLM's default
    for norm_before_residual differs from this head's), the layer's own Llama config."""
    c = head.config
    return {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": str(dtype).replace("torch.", ""),
        "speculators_config": speculators_section("eagle3", c, target_name),
        "transformer_layer_config": speculators_layer_config(c, "llama", c.num_layers),
        "specheads_target": target_name,
    }


def speculators_layer_config(c: "Eagle3Config", model_type: str, num_layers: int) -> dict:
    """`transformer_layer_config` of a speculators folder: the draft's decoder layers as an HF config of
    `model_type` (no biases, untied)."""
    return {
        "model_type": model_type, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings, "rope_parameters": dict(c.rope_parameters),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }


def speculators_tensors(tensors: dict, cfg: Eagle3Config) -> dict:
    """The head's tensors under speculators' names: the first layer as `layers.0` (later ones are
    `layers.{i}` already); d2t/t2d only with a
    draft vocabulary smaller than the target's (vLLM refuses a d2t over the full vocabulary)."""
    out = {}
    for name, t in tensors.items():
        if name in ("d2t", "t2d") and cfg.draft_vocab_size == cfg.vocab_size:
            continue
        out["layers.0." + name[len("midlayer."):] if name.startswith("midlayer.") else name] = t
    return out


LAUNCH = {  # the command that serves a head folder in each engine
    "sglang": ("python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
               "--speculative-draft-model-path {folder} --speculative-num-steps 5 --speculative-eagle-topk 4 "
               "--speculative-num-draft-tokens 16"),
    "vllm": ("vllm serve {target} --speculative-config "
             "'{{\"method\": \"eagle3\", \"model\": \"{folder}\", \"num_speculative_tokens\": 5}}'"),
}


def card_head(cfg: Eagle3Config, dtype: str) -> list[str]:
    """The model card's rows about the head: shape, draft vocab, and each engine's layer ids."""
    ours = list(cfg.target_layer_ids)
    layers = "one decoder layer" if cfg.num_layers == 1 else f"{cfg.num_layers} decoder layers"
    rows = [
        f"| architecture | `{ARCHITECTURE}`: {layers}, hidden size {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} heads, dtype {dtype} |",
        f"| draft vocab | {cfg.draft_vocab_size} of the target's {cfg.vocab_size} tokens |",
        f"| captured target layers (SGLang) | outputs of layers {ours}: "
        "`eagle_config.eagle_aux_hidden_state_layer_ids` |",
        f"| captured target layers (vLLM) | inputs of layers {[i + 1 for i in ours]}: "
        "top-level `eagle_aux_hidden_state_layer_ids` (= SGLang ids + 1) |",
        "", "Both keys are in `config.json`; each engine reads its own, and they name the same hidden states.",
    ]
    if cfg.num_layers > 1:
        rows += ["", f"Several draft layers: vLLM loads this head; SGLang does not ({MULTI_LAYER_REFUSALS['sglang']})."]
    return rows


class DraftAttention(nn.Module):
    """A draft layer's attention projections (`self_attn.{q,k,v,o}_proj`, no biases) over inputs of
    width d_in; every head kind with a Llama-style draft layer (EAGLE-3, EAGLE-1, MTP) uses it."""

    def __init__(self, cfg: Eagle3Config, d_in: int):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(d_in, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_in, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_in, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        if getattr(cfg, "qk_norm", False):  # the target family's q/k norms (Qwen3; MTP modules: cfg.qk_norm)
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x, cos, sin):
        """-> q [B, heads, T, D], k and v [B, kv_heads, T, D] (rotated; each head's q and k normed first
        where the layer has q/k norms)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class Eagle3Layer(nn.Module):
    """The first draft layer: attention over [input_layernorm(embedding); hidden_norm(hidden)]."""

    def __init__(self, cfg: Eagle3Config, d_in: int | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, d_in or 2 * cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def attn_input(self, embeds, hidden):
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn_out, residual):
        """attn_out [B, heads, T, D] -> the layer's output hidden [B, T, H]."""
        b, _, t, _ = attn_out.shape
        h = residual + self.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3DecoderLayer(Eagle3Layer):
    """A draft layer after the first: a plain Llama decoder layer on the hidden state. Its
    `hidden_norm` is unused; it is there because vLLM builds one in every layer and refuses a
    checkpoint that leaves a parameter unset."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, d_in=cfg.hidden_size)

    def attn_input(self, embeds, hidden):
        return self.input_layernorm(hidden)


class Eagle3Head(DraftVocab, nn.Module):
    kind = "eagle3"

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg.validate()
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        # layers 1.. as `layers.{i}` (vLLM's names for them); empty for the one-layer head
        self.layers = nn.ModuleDict({str(i): Eagle3DecoderLayer(cfg) for i in range(1, cfg.num_layers)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self._init_draft_vocab(cfg)
        inv_freq, scaling = rope_inv_freq(cfg.rope_config())
        self.rotary = RotaryTable(inv_freq, scaling, cfg.max_position_embeddings)
        self.fused = False
        self._lm_int8 = None  # (int8 rows, scales) of the lm_head while fused with lm_head_int8

    lm_head_from_target = False  # the recipe of the current heads: a random lm_head

    def readout_heads(self) -> list[nn.Linear]:
        """The head's own vocabulary projections (head.lm_head_from_target, head.freeze_lm_head)."""
        return [self.lm_head]

    def init_readout_from_target(self, target) -> None:
        """The lm_head from the target's rows of the draft vocab and the final norm from the
        target's (training.trainer, head.lm_head_from_target=true)."""
        readout_from_target(self, target, self.readout_heads(), [self.norm])

    def fuse_for_inference(self, lm_head_int8: bool = True) -> "Eagle3Head":
        """Drafting on the fused kernels (as TargetModel.fuse_for_inference): fused q/k/v and
        gate/up weights (views, nothing added), one kernel per norm, rotary and silu*mul.
        Call after the head is on its device and dtype (again to change lm_head_int8).

        lm_head_int8 (default True): the lm_head in int8 with a float32 scale a row
        (linear.quantize_rows), the largest weight a draft depth streams, at half the bytes.
        It changes drafts only, never the output: the target's verify decides every token.
        SmolLM2's head on an H200: draft 0.271 -> 0.234 ms a step, acceptance 4.38 -> 4.40.
        False keeps the bf16 weight."""
        if not self.fused:
            for layer in self.decoder_layers():
                fuse_layer(layer)
            self.fused = True
        self.keep_target_ids()
        fuse_readout(self, self.lm_head.weight, lm_head_int8)
        return self

    def decoder_layers(self) -> list[Eagle3Layer]:
        """The draft layers in order: midlayer, then layers 1.."""
        return [self.midlayer, *self.layers.values()]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return draft_logits(hidden, self.lm_head.weight, self._lm_int8, self.norm)
        return self.lm_head(self.norm(hidden))

    def readout(self, hidden: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed hidden, lm_head weight): draft logits = normed @ weight.T, for losses that
        never build the full logit matrix (training.loss)."""
        return self.norm(hidden), self.lm_head.weight

    def input_spec(self, embed_weight, hidden):
        """What draft.topk_expand needs to make the next depth's layer input over `hidden` (its
        next_input), or None where this head drafts on the torch modules."""
        if not self.fused:
            return None
        ln, hn = self.midlayer.input_layernorm, self.midlayer.hidden_norm
        return embed_weight, hidden, ln.weight, ln.eps, hn.weight, hn.eps

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's captured features [.., 3 H_target] -> the layer's hidden input [.., H]."""
        if self.fused:
            return linear(aux, self.fc.weight, tile=draft_tile(aux))
        return self.fc(aux)

    def step(self, embeds, hidden, position_ids, k_cache=None, v_cache=None, attn_mask=None):
        """One forward over new tokens, attending to cached keys/values plus themselves
        (training and the prompt's feed; drafting runs `draft_step`).

        embeds, hidden [B, T, H]; k_cache/v_cache [B, kv_heads, S, D] from earlier tokens
        ([layers, B, kv_heads, S, D] with several layers); attn_mask bool [B, 1, T, S + T].
        Returns (new hidden, k, v) with this step's k/v (stacked over the layers where there are
        several). Without a cache or mask: causal over T."""
        caches = _per_layer(k_cache, v_cache, self.config.num_layers)
        ks, vs = [], []
        for i, layer in enumerate(self.decoder_layers()):
            kc, vc = caches[i]
            if self.fused:
                hidden, k, v = self._fused_step(layer, i, embeds, hidden, position_ids, kc, vc, attn_mask)
            else:
                cos, sin = self.rotary(position_ids, embeds.dtype)
                q, k, v = layer.self_attn.qkv(layer.attn_input(embeds, hidden), cos, sin)
                hidden = layer.finish(self._attend(q, k, v, kc, vc, attn_mask), hidden)
            ks.append(k)
            vs.append(v)
        if len(ks) == 1:
            return hidden, ks[0], vs[0]
        return hidden, torch.stack(ks), torch.stack(vs)

    def draft_step(self, tokens, embed_weight, hidden, rows, position_ids, k_cache, v_cache, slots, attn_mask,
                   inputs=None):
        """One draft depth over a KV buffer, in place: token ids [B, T] are embedded with the
        target's table; node t's hidden input is hidden[b, rows[b, t]] (rows None: hidden is
        [B, T, H] itself); its k/v are written at `slots` [B, T] of k_cache/v_cache
        [B, kv_heads, S, D] ([layers, B, kv_heads, S, D] with several layers: each layer's keys at
        the same slots of its own buffer); it attends to entries [:W] under attn_mask bool
        [B, 1, T, W]. inputs: the first layer's input and gathered hidden rows (head_input's
        result) where the caller made them already (draft.topk_expand's next_input). Returns the
        new hidden [B, T, H]."""
        layer, cfg = self.midlayer, self.config
        ln, hn = layer.input_layernorm, layer.hidden_norm
        b, t = tokens.shape
        caches = _per_layer(k_cache, v_cache, cfg.num_layers)
        if not self.fused:  # the torch modules, op by op (the reference of the fused path)
            x, hid = head_input_reference(tokens, embed_weight, hidden, rows, ln.weight, ln.eps, hn.weight, hn.eps)
        else:
            x, hid = inputs or head_input(tokens, embed_weight, hidden, rows, ln.weight, ln.eps, hn.weight, hn.eps)
        hid = self._draft_layer(layer, x, hid, position_ids, *caches[0], slots, attn_mask)
        for i, later in enumerate(self.layers.values(), start=1):
            x = later.input_layernorm(hid) if not self.fused else None  # fused: the norm runs inside the qkv kernel
            hid = self._draft_layer(later, x, hid, position_ids, *caches[i], slots, attn_mask)
        return hid

    def _draft_layer(self, layer, x, residual, position_ids, k_cache, v_cache, slots, attn_mask):
        """One layer of a draft depth over its KV buffer: x is the layer's attention input (None for a
        later layer on the fused kernels: input_layernorm(residual) inside the qkv projection)."""
        cfg = self.config
        if not self.fused:
            attn = layer.self_attn
            b, t = slots.shape
            n_kv, d = cfg.num_key_value_heads, cfg.head_dim
            span = attn_mask.shape[-1]
            cos, sin = self.rotary(position_ids, x.dtype)
            q, k, v = attn.qkv(x, cos, sin)
            idx = slots[:, None, :, None].expand(b, n_kv, t, d)
            k_cache.scatter_(2, idx, k)
            v_cache.scatter_(2, idx, v)
            return layer.finish(tree_attention(q, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask), residual)
        return layer_over_cache(layer, x, residual, self.rotary, position_ids, k_cache, v_cache, slots, attn_mask,
                                cfg.num_attention_heads, input_norm=layer.input_layernorm)

    def _attend(self, q, k, v, k_cache, v_cache, attn_mask):
        """This step's queries over the cached keys/values plus this step's; causal without either."""
        if attn_mask is None and k_cache is None:
            rep = self.config.num_attention_heads // self.config.num_key_value_heads
            return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), is_causal=True)
        keys = k if k_cache is None else torch.cat([k_cache, k], dim=2)
        values = v if v_cache is None else torch.cat([v_cache, v], dim=2)
        return tree_attention(q, keys, values, attn_mask)  # the torch reference off the GPU

    def _fused_step(self, layer, index, embeds, hidden, position_ids, k_cache, v_cache, attn_mask):
        """One layer of `step` on the fused kernels; the same numbers (each op rounds where the eager
        one does)."""
        cfg = self.config
        b, t, _ = embeds.shape
        n_kv, d = cfg.num_key_value_heads, cfg.head_dim
        if index == 0:
            x = torch.cat([rmsnorm(embeds, layer.input_layernorm.weight, layer.input_layernorm.eps)[0],
                           rmsnorm(hidden, layer.hidden_norm.weight, layer.hidden_norm.eps)[0]], dim=-1)
        else:
            x = rmsnorm(hidden, layer.input_layernorm.weight, layer.input_layernorm.eps)[0]
        k = torch.empty(b, n_kv, t, d, dtype=embeds.dtype, device=embeds.device)
        v = torch.empty_like(k)
        slots = torch.arange(t, device=embeds.device).expand(b, t)
        q = rope_cache(linear(x, layer.self_attn.qkv_weight), self.rotary.cos, self.rotary.sin, position_ids, k, v,
                       slots, cfg.num_attention_heads, n_kv, d)
        return layer_finish(layer, self._attend(q, k, v, k_cache, v_cache, attn_mask), hidden), k, v


def _per_layer(k_cache, v_cache, num_layers: int) -> list[tuple]:
    """(k, v) cache of each layer: None, one layer's [B, kv, S, D], or [layers, B, kv, S, D]."""
    if k_cache is None:
        return [(None, None)] * num_layers
    if k_cache.dim() == 4:
        if num_layers != 1:
            raise ValueError(f"a {num_layers}-layer head needs a KV cache [layers, B, kv_heads, S, D], got "
                             f"{tuple(k_cache.shape)}")
        return [(k_cache, v_cache)]
    return [(k_cache[i], v_cache[i]) for i in range(num_layers)]
