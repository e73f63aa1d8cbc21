"""EAGLE-1 heads: the EAGLE-1 feature head (drafted with the EAGLE-2 dynamic tree), as SGLang's
`LlamaForCausalLMEagle` (`--speculative-algorithm EAGLE`) and vLLM's `llama_eagle` (method
`eagle`) run it.

Entry p of the head (rotary position p) reads the embedding of token p+1 and the feature f_p,
the target's final hidden state at p after its final norm, and predicts the feature at p+1:

    x      = fc([embed(t[p+1]), f_p])               embedding first; fc has no bias
    h      = x + o_proj(attn(x))                    one Llama decoder layer whose input norm is the identity
    f'     = h + mlp(post_attention_layernorm(h))   no final norm
    logits = lm_head_target(f')                     the target's own lm_head, over its whole vocabulary

f' is also the feature of the next draft depth (the entry at p+1 reads its draft token and f').
The embedding and the lm_head are the target's (frozen, never saved): the head reaches the lm_head
through `attach_target(target)` (the trainer and the drafter call it), and `readout` returns it.

Training (`eagle_unroll`, `eagle_loss`): the head is unrolled for `ttt_steps` steps as the
drafter runs it, step k feeding on its own step-(k-1) prediction (EAGLE-1 trained on noisy
features for the same reason: at drafting time the head reads its own); the loss of step k is
SmoothL1 of its predicted feature against the target's f at p+1+k, plus 0.1 x the soft
cross-entropy of its distribution against the target's at p+1+k (EAGLE-1's weights), step k
weighted decay**k.

Tensor names are the engines' (docs/formats/medusa-eagle-sources.md, section 3): `fc.weight`
[H, 2H], `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`,
`layers.0.post_attention_layernorm.weight`; no `layers.0.input_layernorm`, no `norm`, no
`lm_head`, no draft vocabulary (d2t/t2d). vLLM's fc has no bias and ignores one; SGLang's has one
and needs the tensor: the SGLang export adds a zero `fc.bias`. The speculators export writes
speculators' `eagle` type (defined up to its v0.4.0, docs/formats/speculators-eagle.md): `fc` as
`fusion_fc`, `layers.0.` as `transformer.`; such a folder loads back here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specheads.heads.draft_vocab import one_feature_mismatches
from specheads.heads.eagle3 import VERIFIER_ARCHITECTURES, DraftAttention, Eagle3Config, speculators_section
from specheads.heads.fused_layer import cache_attend, draft_logits, draft_tile, fuse_layer, fuse_readout, layer_over_cache
from specheads.heads.kind import HeadFormatError
from specheads.kernels.draft import head_input
from specheads.kernels.linear import linear
from specheads.modules import GatedMLP, RMSNorm, RotaryTable, gqa_attention, rope_inv_freq

TITLE = "EAGLE-1"
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle"  # sglang/srt/models/llama_eagle.py (SGLang 0.5.23)
VLLM_ARCHITECTURE = "LlamaForCausalLM"  # vLLM rewrites it to EagleLlamaForCausalLM (vLLM 0.33.0, method eagle)
FEATURE_WEIGHT = 1.0  # EAGLE-1's v_w: the feature regression (SmoothL1)
TOKEN_WEIGHT = 0.1  # EAGLE-1's p_w: the cross-entropy against the target's distribution


@dataclass
class EagleConfig(Eagle3Config):
    """One Llama decoder layer at the target's width, reading the target's final hidden state
    (`target_layer_ids = [target_num_layers]`); `draft_vocab_size` is always the target's vocab."""

    SHAPE_OPTIONS = ()  # no head.* shape option (EAGLE-3's num_layers is not this head's)

    @classmethod
    def for_target(cls, target, draft_vocab_size: int | None = None, layer_ids: list[int] | None = None,
                   **overrides):
        """The head drafts over the target's whole vocabulary through the target's lm_head, so a
        draft vocabulary (`draft_vocab_size`, e.g. a prepared data folder's) does not apply."""
        last = [target.spec.num_hidden_layers]  # the final hidden state, after the target's final norm
        return super().for_target(target, target.spec.vocab_size, list(layer_ids) if layer_ids else last,
                                  **overrides)

    def validate(self) -> "EagleConfig":
        if list(self.target_layer_ids) != [self.target_num_layers]:
            raise ValueError(f"an EAGLE-1 head reads the target's final hidden state, after its final norm "
                             f"(target_layer_ids=[{self.target_num_layers}]); got "
                             f"target_layer_ids={self.target_layer_ids}")
        if self.draft_vocab_size != self.vocab_size:
            raise ValueError(f"an EAGLE-1 head drafts over the target's whole vocabulary ({self.vocab_size}) with "
                             f"the target's lm_head; got draft_vocab_size={self.draft_vocab_size}")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(f"an EAGLE-1 head works at the target's hidden size ({self.target_hidden_size}); got "
                             f"hidden_size={self.hidden_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self

    def to_hf(self, dtype: torch.dtype, target_name: str | None) -> dict:
        """config.json: a plain Llama config of one layer, as both engines read it (the vLLM
        layout: this folder's tensors are exactly vLLM's)."""
        return {
            "architectures": [VLLM_ARCHITECTURE],
            **self.llama_layer_hf(),
            "torch_dtype": str(dtype).replace("torch.", ""),
            # specheads' own keys (no "num" next to "layers" or "heads": see the Medusa key-renaming trap)
            "specheads_target_depth": self.target_num_layers,
            "specheads_feature_layer": self.target_layer_ids[0],
            "specheads_target_model_type": self.target_model_type,
            "specheads_target": target_name,
        }

    @classmethod
    def from_hf(cls, raw: dict) -> "EagleConfig":
        if raw.get("speculators_model_type") == "eagle":
            raw = speculators_layer_config(raw)
        rope = cls.rope_from_hf(raw)
        n_target = raw.get("specheads_target_depth") or 32
        return cls(
            **cls.layer_from_hf(raw),
            vocab_size=raw["vocab_size"], draft_vocab_size=raw["vocab_size"], target_hidden_size=raw["hidden_size"],
            target_num_layers=n_target, target_layer_ids=[raw.get("specheads_feature_layer", n_target)],
            rope_parameters=rope, target_model_type=raw.get("specheads_target_model_type", "llama"),
        )


head_mismatches = one_feature_mismatches


def weight_shapes(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a saved head (the names vLLM loads; SGLang's export adds `fc.bias`)."""
    c, h = cfg, cfg.hidden_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    p = "layers.0."
    return {
        "fc.weight": (h, 2 * h),
        p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
        p + "mlp.gate_proj.weight": (c.intermediate_size, h), p + "mlp.up_proj.weight": (c.intermediate_size, h),
        p + "mlp.down_proj.weight": (h, c.intermediate_size),
        p + "post_attention_layernorm.weight": (h,),
    }


def vllm_config(head: "EagleHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json for vLLM's `llama_eagle` (method `eagle`): a Llama config, `LlamaForCausalLM`."""
    return head.config.to_hf(dtype, target_name)


def sglang_config(head: "EagleHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json for SGLang's `LlamaForCausalLMEagle` (`--speculative-algorithm EAGLE`): the
    same Llama config (the export names the architecture)."""
    return head.config.to_hf(dtype, target_name)


def sglang_tensors(tensors: dict, cfg: EagleConfig) -> dict:
    """SGLang's fc is `nn.Linear(2H, H)` with a bias, and its loader leaves a bias missing from the
    file at its random init: the head trains without one, so the export writes zeros."""
    w = tensors["fc.weight"]
    return {**tensors, "fc.bias": torch.zeros(w.shape[0], dtype=w.dtype)}


# speculators' EAGLE-1 type, `speculators_model_type: "eagle"`: vllm-project/speculators at tag v0.4.0
# (d2914dce0dde75a653ba88aa7b2ef05faa757761), src/speculators/models/eagle.py; removed in 792b9e6c.
# docs/formats/speculators-eagle.md
SPECULATORS_ARCHITECTURES = ("EagleSpeculator", "LlamaDecoderLayer")  # what its save writes (eagle.py:78-86,592-600)
SPECULATORS_VERSION = "0.4.0"
# the speculators module -> this head's module (the v0.4.0 converter's map, convert/eagle/eagle_converter.py:239-243)
_SPECULATORS_PREFIXES = (("fusion_fc.", "fc."), ("transformer.", "layers.0."))


def speculators_config(head: "EagleHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json of speculators' `eagle` type (speculators@d2914dc, src/speculators/models/eagle.py:40-127,
    src/speculators/config.py:266-280): `layernorms` false (no norm on the embedding, none before the
    lm_head, the layer's input norm the identity: this head's math, eagle.py:503-529,572-590),
    `fusion_bias` as the head's fc has a bias or not, the layer as a Llama config in transformers
    4.5x keys (speculators 0.4.0 pins transformers <= 4.57.6). No top-level model_type (its to_dict
    drops it, config.py:296-322)."""
    c = head.config
    return {
        "speculators_model_type": "eagle",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_architecture": SPECULATORS_ARCHITECTURES[1],
        "transformer_layer_config": c.llama_layer_hf(),
        "layernorms": False,
        "fusion_bias": head.fc.bias is not None,
        "speculators_config": speculators_section("eagle", c, target_name),
        "dtype": str(dtype).replace("torch.", ""),  # transformers 4.56+ name (torch_dtype is deprecated there)
        # specheads' own keys: what the Llama config does not say (the folder loads back here)
        "specheads_target_depth": c.target_num_layers,
        "specheads_feature_layer": c.target_layer_ids[0],
        "specheads_target_model_type": c.target_model_type,
        "specheads_target": target_name,
    }


def speculators_tensors(tensors: dict, cfg: EagleConfig) -> dict:
    """The head's tensors under speculators' names: `fc.*` as `fusion_fc.*` (a bias only where the
    head has one), `layers.0.*` as `transformer.*`; nothing else (embed_tokens and lm_head are the
    verifier's, eagle.py:237-246)."""
    out = {}
    for name, t in tensors.items():
        for theirs, ours in _SPECULATORS_PREFIXES:
            if name.startswith(ours):
                out[theirs + name[len(ours):]] = t
                break
        else:
            raise ValueError(f"tensor {name!r} has no place in speculators' eagle layout")
    return out


def speculators_layer_config(raw: dict) -> dict:
    """A speculators `eagle` config.json as the flat Llama config `from_hf` reads; a layout that
    computes another function than this head (extra norms, a fusion bias) is refused."""
    if raw.get("layernorms") or raw.get("fusion_bias"):
        flags = [k for k in ("layernorms", "fusion_bias") if raw.get(k)]
        raise HeadFormatError(f"a speculators eagle head with {' and '.join(f'{k}=true' for k in flags)} is not an "
                              "EAGLE-1 head of specheads (no norm on the embedding or before the lm_head, an fc "
                              "without bias)")
    layer = raw.get("transformer_layer_config") or {}
    if layer.get("model_type") != "llama" or raw.get("transformer_layer_architecture", "auto") not in (
            "auto", SPECULATORS_ARCHITECTURES[1]):
        raise HeadFormatError(f"a speculators eagle head with a {layer.get('model_type')} layer "
                              f"({raw.get('transformer_layer_architecture')}) is not an EAGLE-1 head of specheads "
                              "(a Llama decoder layer)")
    ours = {k: v for k, v in raw.items() if k.startswith("specheads_")}
    if "specheads_target_model_type" not in ours:  # another tool's folder: the verifier's family
        verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("architectures") or []
        families = [t for t, arch in VERIFIER_ARCHITECTURES.items() if arch in verifier]
        if families:
            ours["specheads_target_model_type"] = families[0]
    return {**layer, **ours}


def import_tensors(raw: dict, tensors: dict) -> dict:
    """The head's own tensor names from a folder in speculators' `eagle` layout (others as they are)."""
    if raw.get("speculators_model_type") != "eagle":
        return tensors
    out = {}
    for name, t in tensors.items():
        for theirs, ours in _SPECULATORS_PREFIXES:
            if name.startswith(theirs):
                name = ours + name[len(theirs):]
                break
        out[name] = t
    return out


LAUNCH = {  # the command that serves an exported folder in each engine
    "sglang": ("python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE "
               "--speculative-draft-model-path {folder} --speculative-num-steps 5 --speculative-eagle-topk 4 "
               "--speculative-num-draft-tokens 16  # a folder of `specheads export --format sglang`"),
    "vllm": ("vllm serve {target} --speculative-config "
             "'{{\"method\": \"eagle\", \"model\": \"{folder}\", \"num_speculative_tokens\": 5}}'"),
}


def card_head(cfg: EagleConfig, dtype: str) -> list[str]:
    return [
        f"| architecture | EAGLE-1 feature head: `fc` over [token embedding; target feature], one Llama decoder "
        f"layer without an input norm, no final norm; hidden size {cfg.hidden_size}, {cfg.num_attention_heads} "
        f"heads, dtype {dtype} |",
        f"| vocabulary | the target's own lm_head over all {cfg.vocab_size} tokens (the head has no lm_head) |",
        "| target feature | the target's final hidden state, after its final norm |",
        "| layout | `fc.weight` (no bias), `layers.0.*` without `input_layernorm`; no `norm`, no `lm_head`, no "
        "`embed_tokens` |",
        "", f"This folder loads in vLLM as it is (`{VLLM_ARCHITECTURE}`, method `eagle`). For SGLang "
        f"(`{SGLANG_ARCHITECTURE}`, `--speculative-algorithm EAGLE`), write its folder with `specheads export "
        "--format sglang`: SGLang's fc has a bias, which the export writes as zeros.",
    ]


class EagleLayer(nn.Module):
    """One Llama decoder layer whose first norm is the identity (no `input_layernorm`)."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = DraftAttention(cfg, h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = GatedMLP(h, cfg.intermediate_size)

    def forward(self, x, cos, sin, attend):
        """x [B, T, H] -> [B, T, H]. attend(q [B, Hq, T, D], k, v [B, KV, T, D]) -> [B, Hq, T, D]:
        the training unroll's mask, or a cache in drafting."""
        b, t, _ = x.shape
        a = self.self_attn
        h = x + a.o_proj(attend(*a.qkv(x, cos, sin)).transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    kind = "eagle"

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.config = cfg.validate()
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([EagleLayer(cfg)])
        inv_freq, scaling = rope_inv_freq(cfg.rope_config())
        self.rotary = RotaryTable(inv_freq, scaling, cfg.max_position_embeddings)
        self.fused = False
        self._lm_int8 = None  # (int8 rows, scales) of the target's lm_head while fused with lm_head_int8

    # ............................................................ the target's lm_head
    def attach_target(self, target) -> "EagleHead":
        """Read out through `target`'s lm_head (kept by reference: not a parameter of the head,
        never saved, never trained). The trainer and the drafter call it."""
        if target.lm_head.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"the target's lm_head is {tuple(target.lm_head.weight.shape)}; this EAGLE-1 head "
                             f"needs ({self.config.vocab_size}, {self.config.hidden_size})")
        object.__setattr__(self, "_target_lm_head", target.lm_head)  # no submodule: not in state_dict()
        return self

    def lm_head_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        lm_head = self.__dict__.get("_target_lm_head")
        if lm_head is None:
            raise RuntimeError("an EAGLE-1 head reads out through the target's lm_head: call "
                               "head.attach_target(target) first")
        w = lm_head.weight.detach()
        return w if dtype is None or w.dtype == dtype else w.to(dtype)

    # ............................................................ vocabulary: the target's whole
    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """The head drafts over the target's whole vocabulary: a draft vocabulary map (a prepared
        data folder's) is checked against the target's vocab and otherwise does not apply."""
        if t2d.numel() != self.config.vocab_size:
            raise ValueError(f"vocab map covers {t2d.numel()} tokens, the head's target has {self.config.vocab_size}")

    def target_rows(self) -> torch.Tensor:
        """Target token id of each draft id: every token, itself."""
        return torch.arange(self.config.vocab_size, device=self.fc.weight.device)

    def target_ids(self) -> torch.Tensor:
        return self.target_rows()

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def fuse_for_inference(self, lm_head_int8: bool = True) -> "EagleHead":
        """Drafting on the fused kernels (heads/fused_layer.py), as the EAGLE-3 head: fused q/k/v
        and gate/up weights (views), one kernel per projection with its norm or residual inside.
        lm_head_int8 (default True): the target's lm_head read out in an int8 copy with a float32
        scale a row, half the bytes a draft depth streams; it changes drafts only, never the output.
        Call after the head and the target are on their device and dtype (`attach_target` first)."""
        fuse_layer(self.layers[0])
        self.fused = True
        fuse_readout(self, self.lm_head_weight(), lm_head_int8)
        return self

    def draft(self, tokens, embed_weight, features, positions, k_cache, v_cache, slots, attn_mask,
              rows=None) -> torch.Tensor:
        """Drafting entries [B, T] (token ids, features [B, T, H], or with rows [B, T] features
        [B, S, H] read at those rows) at `positions`: their keys and values written at `slots`
        [B, T] of k_cache / v_cache [B, kv_heads, S, D], attention over columns [:W] under
        attn_mask bool [B, 1, T, W]. Returns the predicted features [B, T, H]."""
        features = features.to(k_cache.dtype)
        if not self.fused:  # the torch modules (the reference of the fused path)
            if rows is not None:
                features = features.gather(1, rows[:, :, None].expand(-1, -1, features.shape[-1]))
            return self(F.embedding(tokens, embed_weight), features, positions,
                        cache_attend(k_cache, v_cache, slots, attn_mask))
        # [embedding; features] in one kernel (no norms), the parents' rows read in place
        x = linear(head_input(tokens, embed_weight, features, rows, None, None, None, None)[0], self.fc.weight,
                   tile=draft_tile(features))
        return layer_over_cache(self.layers[0], x, x, self.rotary, positions, k_cache, v_cache, slots, attn_mask,
                                self.config.num_attention_heads)

    # ............................................................ the head
    def forward(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor, attend) -> torch.Tensor:
        """Token embeddings and features [B, T, H] at positions [B, T] -> predicted next features [B, T, H]."""
        cos, sin = self.rotary(position_ids, features.dtype)
        x = self.fc(torch.cat([embeds.to(features.dtype), features], -1))
        return self.layers[0](x, cos, sin, attend)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's lm_head over predicted features (no norm: they are post-norm features already)."""
        if self.fused:
            return draft_logits(features, self.lm_head_weight(features.dtype), self._lm_int8)
        return F.linear(features, self.lm_head_weight(features.dtype))

    def readout(self, features: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits = features @ (the target's lm_head).T."""
        return features, self.lm_head_weight(features.dtype)


def eagle_unroll(head: EagleHead, embed, input_ids: torch.Tensor, aux_hidden: torch.Tensor, steps: int):
    """The head's predicted features [B, T, H] of each of `steps` steps, as the drafter runs it.

    Step k, row t: the embedding of token t+1+k and the target's feature f_t (k = 0) or the head's
    own step-(k-1) prediction at row t; rotary position t+k; predicts f_{t+1+k} (so token t+2+k).
    It attends to the step-0 entries of rows <= t and to row t's own entries of steps 1..k: what a
    draft node at depth k+1 sees (the cache of real entries, then its ancestors and itself)."""
    from specheads.training.ttt import shift_left, ttt_mask

    b, t = input_ids.shape
    dev = input_ids.device
    features = aux_hidden.to(head.fc.weight.dtype)
    base = torch.arange(t, device=dev)
    max_pos = head.rotary.max_positions - 1
    keys, values, outputs = [], [], []
    for k in range(steps):
        mask = ttt_mask(t, k, dev)[None, None]

        def attend(q, key, value, mask=mask):
            keys.append(key)
            values.append(value)
            return gqa_attention(q, torch.cat(keys, 2), torch.cat(values, 2), mask)

        features = head(embed(shift_left(input_ids, 1 + k)), features, (base + k).clamp(max=max_pos).expand(b, t),
                        attend)
        outputs.append(features)
    return outputs


def eagle_loss(head: EagleHead, embed, input_ids: torch.Tensor, loss_mask: torch.Tensor, aux_hidden: torch.Tensor,
               target_hidden: torch.Tensor, teacher_weight: torch.Tensor, steps: int = 7,
               decay: float | list[float] = 0.8, chunk: int = 1024, outputs: list[torch.Tensor] | None = None):
    """EAGLE-1's loss over the unroll: per step, SmoothL1 of the predicted feature against the
    target's (mean over the hidden dimension) plus 0.1 x the soft cross-entropy of the draft's
    distribution (the target's lm_head over the prediction) against the target's; summed over
    the counted rows, normalized by step 0's, step k weighted decay**k (or decay[k]).

    teacher_weight: the target's lm_head rows of `head.target_rows()` (all of them): both the
    teacher's and the draft's readout (frozen: no gradient)."""
    from specheads.training.loss import soft_cross_entropy
    from specheads.training.ttt import StepStats, depth_weight, shift_left

    if outputs is None:
        outputs = eagle_unroll(head, embed, input_ids, aux_hidden, steps)
    denom = max(int(shift_left(loss_mask, 2).bool().sum()), 1)
    total = 0.0
    step_loss, step_correct, step_rows = [], [], []
    for k, predicted in enumerate(outputs):
        rows = shift_left(loss_mask, 2 + k).bool()
        h = predicted[rows]
        target = shift_left(target_hidden, 1 + k)[rows].to(h.dtype).detach()
        weight = teacher_weight.detach().to(h.dtype)
        feature_sum = F.smooth_l1_loss(h.float(), target.float(), reduction="none").mean(-1).sum()
        token_sum, correct = soft_cross_entropy(h, weight, target, weight, chunk)
        loss_k = (FEATURE_WEIGHT * feature_sum + TOKEN_WEIGHT * token_sum) / denom
        total = total + depth_weight(decay, k) * loss_k
        step_loss.append(loss_k.detach())
        step_correct.append(correct)
        step_rows.append(int(rows.sum()))
    return StepStats(total, step_loss, step_correct, step_rows, denom)


__all__ = ["EagleConfig", "EagleHead", "EagleLayer", "FEATURE_WEIGHT", "LAUNCH", "SGLANG_ARCHITECTURE",
           "SPECULATORS_ARCHITECTURES", "SPECULATORS_VERSION", "TITLE", "TOKEN_WEIGHT", "VLLM_ARCHITECTURE",
           "card_head", "eagle_loss", "eagle_unroll", "head_mismatches", "import_tensors", "sglang_config",
           "sglang_tensors", "speculators_config", "speculators_layer_config", "speculators_tensors", "vllm_config",
           "weight_shapes"]
