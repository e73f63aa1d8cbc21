"""MTP heads: D sequential multi-token-prediction modules, in the DeepSeek-V3 manner.

Module d (0-based) at sequence position i takes the embedding of token i+1+d and the previous
module's output there (module 0: the target's hidden state h_i), and predicts token i+2+d:

    x   = eh_proj([enorm(embed(t[i+1+d])), hnorm(h_prev[i])])     (embedding first)
    h_d = shared_head.norm_d(block_d(x))   one pre-norm decoder layer, causal over the positions
    logits_d = lm_head(h_d)                h_d is also the next module's h_prev

Every module runs at position i (its rotary position), attends to its own keys at positions
<= i, and has its own block and final norm; the embedding is the target's (frozen) and the
output head is one draft-vocabulary `lm_head` shared by the modules (d2t/t2d as for EAGLE-3).
Tensor names follow DeepSeek-V3's MTP layers (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm`
under `layers.{d}`), which vLLM's and SGLang's DeepSeek MTP loaders read from
`model.layers.{num_hidden_layers + d}`.

h_i is the target's final hidden state after its final norm (`target_layer_ids = [L]`, one past
the last decoder layer), and each module hands on its output after `shared_head.norm`, as
vLLM's and SGLang's DeepSeek MTP drafting do (docs/formats/mtp-sources.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specheads.heads.draft_vocab import DraftVocab, one_feature_mismatches, readout_from_target

from specheads.heads.eagle3 import DraftAttention, Eagle3Config
from specheads.heads.fused_layer import cache_attend, draft_logits, draft_tile, fuse_layer, fuse_readout, layer_over_cache
from specheads.kernels.draft import head_input
from specheads.kernels.fused import rmsnorm
from specheads.kernels.linear import linear
from specheads.modules import GatedMLP, RMSNorm, RotaryTable, gqa_attention, rope_inv_freq

TITLE = "MTP"


@dataclass
class MTPConfig(Eagle3Config):
    num_modules: int = 3
    # each attention head's q and k RMS-normed before rotary, as the target's own layers do (Qwen3): a module
    # is then the target family's decoder layer, as speculators' `mtp` layer is (docs/formats/mtp-sources.md)
    qk_norm: bool = False
    SHAPE_OPTIONS = ("num_modules",)

    @classmethod
    def for_target(cls, target, draft_vocab_size: int, layer_ids: list[int] | None = None, **overrides):
        last = [target.spec.num_hidden_layers]  # the final hidden state, after the target's final norm
        overrides.setdefault("qk_norm", bool(getattr(target.spec, "qk_norm", False)))
        return super().for_target(target, draft_vocab_size, list(layer_ids) if layer_ids else last, **overrides)

    def validate(self) -> "MTPConfig":
        if len(self.target_layer_ids) != 1 or not 0 <= self.target_layer_ids[0] <= self.target_num_layers:
            raise ValueError(f"an MTP head reads one target hidden state (default {self.target_num_layers}: the "
                             f"final one, after the target's norm); got target_layer_ids={self.target_layer_ids}")
        if not 1 <= self.num_modules <= 16:
            raise ValueError(f"num_modules must be in 1..16, got {self.num_modules}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self

    def fixed_depth(self) -> int:
        """Draft depths the head has (the trainer unrolls every one)."""
        return self.num_modules

    def refused_exports(self) -> dict[str, str]:
        """speculators' `mtp` type where this head fails one of its conditions, with which (export raises it)."""
        why = speculators_refusal(self)
        return {"speculators": why} if why else {}

    def to_hf(self, dtype: torch.dtype, target_name: str | None) -> dict:
        return {
            "architectures": [ARCHITECTURE],
            "model_type": self.target_model_type,
            "num_nextn_predict_layers": self.num_modules,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            **self.hf_rope(),
            "target_hidden_size": self.target_hidden_size,
            "target_num_hidden_layers": self.target_num_layers,
            "specheads_feature_layer": self.target_layer_ids[0],
            "tie_word_embeddings": False,
            "specheads_qk_norm": self.qk_norm,
            "torch_dtype": str(dtype).replace("torch.", ""),
            "specheads_target": target_name,
        }

    @classmethod
    def from_hf(cls, raw: dict) -> "MTPConfig":
        rope = cls.rope_from_hf(raw)
        n_target = raw.get("target_num_hidden_layers") or 32
        return cls(
            **cls.layer_from_hf(raw),
            vocab_size=raw["vocab_size"], draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"], target_num_layers=n_target,
            target_layer_ids=[raw.get("specheads_feature_layer", n_target)], rope_parameters=rope,
            target_model_type=raw.get("model_type", "llama"), num_modules=raw.get("num_nextn_predict_layers", 1),
            qk_norm=bool(raw.get("specheads_qk_norm", False)),
        )


ARCHITECTURE = "SpecheadsMTPForCausalLM"  # our folders only: no public loader runs MTP layers for these targets

# what speculators 0.9.0's `mtp` type loads (docs/formats/mtp-sources.md section 3): models/mtp/config.py:80-84
# (num_nextn_predict_layers == 1), models/mtp/core.py:119-122 (vocab reduction: NotImplementedError),
# models/mtp/model_definitions.py:25-27,152-204 (the verifier families it has an MTP layer for)
SPECULATORS_MTP_FAMILIES = ("qwen3", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def speculators_refusal(cfg: MTPConfig) -> str | None:
    """Why an MTP head does not export to speculators (None: it does): the conditions of its `mtp`
    type, and the ones this head fails."""
    fails = []
    if cfg.num_modules != 1:
        fails.append(f"(1): it has {cfg.num_modules} modules (head.num_modules={cfg.num_modules})")
    if cfg.draft_vocab_size != cfg.vocab_size:
        fails.append(f"(2): it drafts over {cfg.draft_vocab_size} of the target's {cfg.vocab_size} tokens")
    if cfg.target_model_type not in SPECULATORS_MTP_FAMILIES:
        fails.append(f"(3): its target is {cfg.target_model_type}")
    elif not cfg.qk_norm:
        fails.append("(3): its decoder layer has no q_norm/k_norm, which speculators' Qwen3 MTP layer applies "
                     "(a head made before specheads gave Qwen3 targets' MTP modules the target's q/k norms)")
    if not fails:
        return None
    return ("MTP heads do not export to speculators: speculators 0.9.0's mtp type loads (1) one module "
            "(num_nextn_predict_layers == 1), (2) the full vocabulary (no draft vocabulary), (3) a Qwen3-family "
            f"verifier ({', '.join(SPECULATORS_MTP_FAMILIES)}); this head fails "
            + "; ".join(fails) + " (docs/formats/mtp-sources.md, section 3). "
            "vLLM 0.33.0 loads no speculators mtp folder either; the head folder itself runs with `specheads serve`")


SPECULATORS_ARCHITECTURE = "MTPDraftModel"


def speculators_config(head: "MTPHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json of speculators' `mtp` type (0.9.0, models/mtp/config.py): the module's decoder layer
    as the verifier family's config (`transformer_layer_config`, its model_type first), one module, the
    verifier by hub id; no top-level model_type."""
    from specheads.heads.eagle3 import SPECULATORS_VERSION, speculators_layer_config, speculators_section

    c = head.config
    section = speculators_section("mtp", c, target_name)
    section["proposal_methods"][0]["speculative_tokens"] = 3  # speculators' MTP default
    return {
        "speculators_model_type": "mtp",
        "speculators_version": SPECULATORS_VERSION,
        "num_nextn_predict_layers": 1,
        "dtype": str(dtype).replace("torch.", ""),
        "speculators_config": section,
        "transformer_layer_config": speculators_layer_config(c, c.target_model_type, 1),
        "specheads_target": target_name,
    }


def speculators_check(meta: dict) -> str | None:
    """speculators' MTP model reads out through the verifier's own lm_head: a head whose run trained its
    lm_head (head.freeze_lm_head=false, or head.lm_head_from_target=false) would compute another function."""
    opts = (meta.get("run_config") or {}).get("head") or {}
    if opts.get("freeze_lm_head") is False or opts.get("lm_head_from_target") is False:
        return ("this MTP head does not export to speculators: its run trained its own lm_head "
                f"(head.freeze_lm_head={opts.get('freeze_lm_head')}, head.lm_head_from_target="
                f"{opts.get('lm_head_from_target')}), and speculators' mtp model reads out through the verifier's "
                "lm_head; train with the defaults (the target's lm_head, frozen) to export it")
    return None


# our module's names -> speculators' (models/mtp/model_definitions.py: the MTP mixin's norms and projection
# around the family's decoder layer, whose own names stay)
_SPECULATORS_NAMES = {"enorm.": "token_layernorm.", "hnorm.": "hidden_layernorm.", "eh_proj.": "input_proj.",
                      "shared_head.norm.": "final_layernorm."}


def speculators_tensors(tensors: dict, cfg: MTPConfig) -> dict:
    """The one module's tensors under speculators' names (`mtp_layers.0.*`); the lm_head (the target's
    own over the full vocabulary, frozen) and the vocabulary maps stay out: the library attaches the
    verifier's embedding and lm_head."""
    out = {}
    for name, t in tensors.items():
        if not name.startswith("layers.0."):
            continue
        rest = name[len("layers.0."):]
        for ours, theirs in _SPECULATORS_NAMES.items():
            if rest.startswith(ours):
                rest = theirs + rest[len(ours):]
                break
        out["mtp_layers.0." + rest] = t
    return out


head_mismatches = one_feature_mismatches


def weight_shapes(cfg: MTPConfig) -> dict[str, tuple[int, ...]]:
    c, h = cfg, cfg.hidden_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {}
    for d in range(c.num_modules):
        p = f"layers.{d}."
        out.update({
            p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, h), p + "mlp.up_proj.weight": (c.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, c.intermediate_size), p + "shared_head.norm.weight": (h,),
        })
        if c.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)})
    out.update({"lm_head.weight": (c.draft_vocab_size, h), "d2t": (c.draft_vocab_size,), "t2d": (c.vocab_size,)})
    return out


def native_config(head: "MTPHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json of specheads' own MTP folder (the only layout that runs an MTP head on a
    target that does not ship MTP layers)."""
    return head.config.to_hf(dtype, target_name)


def card_head(cfg: MTPConfig, dtype: str) -> list[str]:
    return [
        f"| architecture | {cfg.num_modules} MTP modules (DeepSeek-V3 layout: enorm, hnorm, eh_proj, one decoder "
        f"layer{' with q/k norms' if cfg.qk_norm else ''}, shared_head.norm), hidden size {cfg.hidden_size}, "
        f"dtype {dtype} |",
        f"| draft vocab | {cfg.draft_vocab_size} of the target's {cfg.vocab_size} tokens |",
        f"| target feature | {_feature(cfg)} |",
        "| layout | per module `layers.{d}.enorm`, `hnorm`, `eh_proj` (input [enorm(embedding), hnorm(hidden)], "
        "embedding first), one decoder layer, `shared_head.norm`; one draft-vocabulary `lm_head` and d2t/t2d |",
        "", "This head runs with `specheads generate` / `specheads serve` only. vLLM (`method: mtp`) and SGLang "
        "(NextN) run MTP layers only for targets that ship them (DeepSeek-V3/R1, Qwen3-Next, MiMo, GLM-4.5 and "
        "the like) and do not load MTP layers for this target; for those engines, train and export an EAGLE-3 "
        "head. Sources and names: docs/formats/mtp-sources.md in the specheads repository.",
    ] + ([] if speculators_refusal(cfg) else [
        "", "It also exports to speculators' `mtp` layout (`specheads export HEAD --format speculators`), which "
        "speculators' scripts stitch into the verifier's checkpoint."])


def _feature(cfg: MTPConfig) -> str:
    i = cfg.target_layer_ids[0]
    if i == cfg.target_num_layers:
        return "the target's final hidden state, after its final norm"
    return f"output of target decoder layer {i}"


class _SharedHead(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTPModule(nn.Module):
    """One MTP module: the input projection, one pre-norm decoder layer, its final norm."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        h = cfg.hidden_size
        self.enorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = GatedMLP(h, cfg.intermediate_size)
        self.shared_head = _SharedHead(cfg)

    def forward(self, embeds, hidden, cos, sin, attend):
        """embeds, hidden [B, T, H] -> the module's output [B, T, H], after shared_head.norm.
        attend(q [B, Hq, T, D], k, v [B, KV, T, D]) -> [B, Hq, T, D]: causal in training, over
        a cache in drafting."""
        b, t, _ = embeds.shape
        x = self.eh_proj(torch.cat([self.enorm(embeds.to(hidden.dtype)), self.hnorm(hidden)], -1))
        a = self.self_attn
        o = attend(*a.qkv(self.input_layernorm(x), cos, sin))
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        return self.shared_head.norm(x + self.mlp(self.post_attention_layernorm(x)))


class MTPHead(DraftVocab, nn.Module):
    kind = "mtp"

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.config = cfg.validate()
        self.layers = nn.ModuleList(MTPModule(cfg) for _ in range(cfg.num_modules))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self._init_draft_vocab(cfg)
        inv_freq, scaling = rope_inv_freq(cfg.rope_config())
        self.rotary = RotaryTable(inv_freq, scaling, cfg.max_position_embeddings)
        self.fused = False
        self._lm_int8 = None  # (int8 rows, scales) of the lm_head while fused with lm_head_int8

    lm_head_from_target = True  # DeepSeek-V3's MTP modules share the model's output head
    # ... and over the whole vocabulary that head is the target's own, frozen (head.freeze_lm_head)
    freezes_full_vocab_lm_head = True

    def readout_heads(self) -> list[nn.Linear]:
        """The head's own vocabulary projection, shared by every module (head.lm_head_from_target,
        head.freeze_lm_head)."""
        return [self.lm_head]

    def init_readout_from_target(self, target) -> None:
        """The lm_head from the target's rows of the draft vocab and every module's
        shared_head.norm from the target's final norm (training.trainer, head.lm_head_from_target)."""
        readout_from_target(self, target, self.readout_heads(), [m.shared_head.norm for m in self.layers])

    def fuse_for_inference(self, lm_head_int8: bool = True) -> "MTPHead":
        """Drafting on the fused kernels (heads/fused_layer.py), as the EAGLE-3 head: fused q/k/v
        and gate/up weights (views), the input norms and projection in two kernels, one kernel per
        projection with its norm or residual inside. lm_head_int8 (default True): the draft lm_head
        in an int8 copy with a float32 scale a row (drafts only: the target verifies every token).
        Call after the head is on its device and dtype. A head with q/k norms (cfg.qk_norm) drafts on its
        torch modules: the fused layer has no q/k norm."""
        if self.config.qk_norm:
            self.fused, self._lm_int8 = False, None
            return self
        for module in self.layers:
            fuse_layer(module)
        self.fused = True
        self.keep_target_ids()
        fuse_readout(self, self.lm_head.weight, lm_head_int8)
        return self

    def draft(self, d: int, tokens, embed_weight, hidden, positions, k_cache, v_cache, slots, attn_mask, rows=None):
        """Module d over drafting entries [B, T]: token ids, the previous depth's output (or the
        target's feature) hidden [B, T, H] (or, with rows [B, T], hidden [B, S, H] read at those
        rows), at `positions`; their keys and values written at `slots` [B, T] of the module's
        k_cache / v_cache [B, kv_heads, S, D], attention over columns [:W] under attn_mask bool
        [B, 1, T, W]. Returns the module's normed output [B, T, H]."""
        m = self.layers[d]
        hidden = hidden.to(k_cache.dtype)
        if not self.fused:  # the torch modules (the reference of the fused path)
            if rows is not None:
                hidden = hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1]))
            cos, sin = self.rotary(positions, hidden.dtype)
            return m(F.embedding(tokens, embed_weight), hidden, cos, sin, cache_attend(k_cache, v_cache, slots, attn_mask))
        x = head_input(tokens, embed_weight, hidden, rows, m.enorm.weight, m.enorm.eps, m.hnorm.weight,
                       m.hnorm.eps)[0]
        x = linear(x, m.eh_proj.weight, tile=draft_tile(x))
        out = layer_over_cache(m, None, x, self.rotary, positions, k_cache, v_cache, slots, attn_mask,
                               self.config.num_attention_heads, input_norm=m.input_layernorm)
        norm = m.shared_head.norm
        return rmsnorm(out, norm.weight, norm.eps)[0]

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Draft logits of a module's normed output (`normed`)."""
        if self.fused:
            return draft_logits(normed, self.lm_head.weight, self._lm_int8)
        return self.lm_head(normed)

    def readout(self, normed: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The unroll returns normed outputs: draft logits = normed @ lm_head.T."""
        return normed, self.lm_head.weight


def causal_attend(q, k, v):
    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()[None, None]
    return gqa_attention(q, k, v, mask)


def mtp_unroll(head: MTPHead, embed, input_ids: torch.Tensor, aux_hidden: torch.Tensor, steps: int):
    """Teacher-forced, as drafting runs: module d at position t reads token t+1+d and module
    d-1's output at t (module 0: the target's feature); returns each module's normed output
    [B, T, H] (output d at t predicts token t+2+d), for min(steps, num_modules) modules."""
    from specheads.training.ttt import shift_left

    b, t = input_ids.shape
    dtype = head.lm_head.weight.dtype
    hidden = aux_hidden.to(dtype)
    cos, sin = head.rotary(torch.arange(t, device=input_ids.device).clamp(max=head.rotary.max_positions - 1)
                           .expand(b, t), dtype)
    outputs = []
    for d in range(min(steps, head.config.num_modules)):
        hidden = head.layers[d](embed(shift_left(input_ids, 1 + d)), hidden, cos, sin, causal_attend)
        outputs.append(hidden)
    return outputs


__all__ = ["ARCHITECTURE", "MTPConfig", "MTPHead", "MTPModule", "SPECULATORS_ARCHITECTURE", "TITLE", "card_head",
           "head_mismatches", "mtp_unroll", "native_config", "speculators_check", "speculators_config",
           "speculators_tensors", "weight_shapes"]
