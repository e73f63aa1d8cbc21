"""Medusa heads: K heads on the target's final hidden state, each predicting one token further.

Head k (0-based) at position i reads the target's final hidden state h_i (after its final
norm) and predicts token i+2+k:

    x_k = h_i;  x_k = x_k + SiLU(W_{k,j} x_k + b_{k,j})  for j = 1..n     (n residual blocks)
    logits_k = lm_heads[k](x_k)                                          (draft vocabulary)

With `shared_lm_head` every head reads out through one projection, `lm_heads.0` (vLLM's
`original_lm_head`): a step then reads one vocabulary matrix where K heads read K of them (the
drafter projects every head's features in one product), and vLLM loads it with a draft vocabulary
(`token_map`), which it refuses for K separate heads.

The heads never read each other or earlier drafts, so a step's drafts come from one hidden
state: the drafter builds a tree of each head's top-k tokens by joint probability (the best
`num_draft_tokens` of the candidate paths), verified losslessly like every drafter. Tensor
names follow vLLM's Medusa model (`blocks.{k}.layers.{j}`, `lm_heads.{k}`); the draft
vocabulary map is `d2t`/`t2d` as for EAGLE-3.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specheads.heads.draft_vocab import DraftVocab, one_feature_mismatches, readout_from_target
from specheads.heads.fused_layer import draft_logits as fused_logits
from specheads.heads.fused_layer import fuse_readout, keep_in_place

TITLE = "Medusa"
ARCHITECTURE = "MedusaModel"
# docs/formats/medusa-eagle-sources.md, section 4 (the speculators 0.9.0 wheel's registered types)
SPECULATORS_REFUSAL = ("Medusa heads do not export to speculators: speculators defines no Medusa model at 0.9.0 (its "
                       "types: eagle3, peagle, mtp, dflash, dflash2, dspark, xpress; a Medusa model was proposed in "
                       "its PR #742, closed; no tag up to v0.7.0.1 has one either); medusa heads export to vllm "
                       "(vLLM 0.11 to 0.32)")


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    num_heads: int = 4
    num_layers: int = 1  # residual blocks per head
    target_layer_ids: list | None = None  # [num_layers of the target]: the final hidden state, after its norm
    target_model_type: str = "llama"
    shared_lm_head: bool = False  # one vocabulary projection for every head

    def __post_init__(self):
        if self.target_layer_ids is None:
            self.target_layer_ids = [self.target_num_layers]

    @property
    def num_readouts(self) -> int:
        """Vocabulary projections the head holds."""
        return 1 if self.shared_lm_head else self.num_heads

    @classmethod
    def for_target(cls, target, draft_vocab_size: int, layer_ids=None, **overrides):
        spec = target.spec
        cfg = cls(hidden_size=spec.hidden_size, vocab_size=spec.vocab_size, draft_vocab_size=draft_vocab_size,
                  target_hidden_size=spec.hidden_size, target_num_layers=spec.num_hidden_layers,
                  target_layer_ids=list(layer_ids) if layer_ids else [spec.num_hidden_layers],
                  target_model_type=spec.model_type)
        for k, v in overrides.items():
            if v is not None and k in cfg.__dataclass_fields__:
                setattr(cfg, k, v)
        return cfg.validate()

    def validate(self) -> "MedusaConfig":
        if not 1 <= self.num_heads <= 16:
            raise ValueError(f"num_heads must be in 1..16, got {self.num_heads}")
        if not 1 <= self.num_layers <= 8:
            raise ValueError(f"num_layers (residual blocks per head) must be in 1..8, got {self.num_layers}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{self.vocab_size}")
        if len(self.target_layer_ids) != 1 or not 0 <= self.target_layer_ids[0] <= self.target_num_layers:
            raise ValueError(f"a Medusa head reads one target hidden state (default {self.target_num_layers}: the "
                             f"final one); got target_layer_ids={self.target_layer_ids}")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError("a Medusa head works at the target's hidden size")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MedusaConfig":
        return cls(**d)

    def fixed_depth(self) -> int:
        """Draft depths the head has (the trainer unrolls every one)."""
        return self.num_heads

    def refused_exports(self) -> dict[str, str]:
        """Formats no Medusa head exports to, with why (export raises it)."""
        return {"speculators": SPECULATORS_REFUSAL}

    def to_hf(self, dtype: torch.dtype, target_name: str | None) -> dict:
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "medusa",
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "truncated_vocab_size": self.draft_vocab_size,
            "medusa_fc_bias": True,
            "original_lm_head": self.shared_lm_head,
            # vLLM renames every key holding both "num" and "layers" to num_hidden_layers: none here
            "specheads_target_depth": self.target_num_layers,
            "specheads_feature_layer": self.target_layer_ids[0],
            "torch_dtype": str(dtype).replace("torch.", ""),
            "specheads_target": target_name,
        }

    @classmethod
    def from_hf(cls, raw: dict) -> "MedusaConfig":
        n = raw.get("specheads_target_depth") or 32
        return cls(hidden_size=raw["hidden_size"], vocab_size=raw["vocab_size"],
                   draft_vocab_size=raw.get("truncated_vocab_size") or raw["vocab_size"],
                   target_hidden_size=raw["hidden_size"], target_num_layers=n,
                   num_heads=raw.get("num_heads") or raw.get("medusa_num_heads", 4),
                   num_layers=raw.get("num_hidden_layers") or raw.get("medusa_num_layers", 1),
                   target_layer_ids=[raw.get("specheads_feature_layer", n)],
                   shared_lm_head=bool(raw.get("original_lm_head", False)))


head_mismatches = one_feature_mismatches


def weight_shapes(cfg: MedusaConfig) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size
    out = {}
    for k in range(cfg.num_heads):
        for j in range(cfg.num_layers):
            out[f"blocks.{k}.layers.{j}.weight"] = (h, h)
            out[f"blocks.{k}.layers.{j}.bias"] = (h,)
    for k in range(cfg.num_readouts):
        out[f"lm_heads.{k}.weight"] = (cfg.draft_vocab_size, h)
    out.update({"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)})
    return out


def vllm_config(head: "MedusaHead", dtype: torch.dtype, target_name: str | None) -> dict:
    """config.json for vLLM's Medusa model (vLLM 0.11 to 0.32; 0.33 dropped Medusa): biases on
    (`medusa_fc_bias`); one full-vocabulary lm_head a head, or one shared projection
    (`original_lm_head`), which may hold a draft vocabulary (`truncated_vocab_size` and the
    `token_map` of vllm_tensors) (docs/formats/medusa-eagle-sources.md)."""
    cfg = head.config
    if cfg.draft_vocab_size != cfg.vocab_size and not cfg.shared_lm_head:
        raise ValueError(f"vLLM's Medusa model loads a draft vocabulary only through one shared projection "
                         f"(original_lm_head); this head has {cfg.num_heads} projections over {cfg.draft_vocab_size} "
                         f"of {cfg.vocab_size} tokens (train it with the full vocabulary, or with "
                         f"head.shared_lm_head=true, to export it for vLLM)")
    return cfg.to_hf(dtype, target_name)


def vllm_tensors(tensors: dict[str, torch.Tensor], cfg: MedusaConfig) -> dict[str, torch.Tensor]:
    """The head's tensors as vLLM's Medusa loader reads them: with a draft vocabulary, `token_map`
    (each draft index's target token id: the index plus its d2t offset, int64) beside the shared
    projection; d2t and t2d stay (vLLM skips names it does not know)."""
    out = dict(tensors)
    if cfg.draft_vocab_size != cfg.vocab_size:
        out["token_map"] = (torch.arange(cfg.draft_vocab_size) + tensors["d2t"].long()).to(torch.int64)
    return out


LAUNCH = {"vllm": ("vllm serve {target} --speculative-config "
                   "'{{\"method\": \"medusa\", \"model\": \"{folder}\", \"num_speculative_tokens\": "
                   "<the head count>}}'  # vLLM <= 0.32")}


def card_head(cfg: MedusaConfig, dtype: str) -> list[str]:
    return [
        f"| architecture | {cfg.num_heads} Medusa heads of {cfg.num_layers} residual SiLU block(s) each, hidden size "
        f"{cfg.hidden_size}, dtype {dtype} |",
        f"| draft vocab | {cfg.draft_vocab_size} of the target's {cfg.vocab_size} tokens"
        f"{', one projection shared by every head' if cfg.shared_lm_head else ', a projection a head'} |",
        "| target feature | the target's final hidden state, after its final norm |",
    ]


class _Block(nn.Module):
    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.num_layers))
        for layer in self.layers:  # each head starts as the identity on the hidden state (as Medusa does)
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHead(DraftVocab, nn.Module):
    kind = "medusa"

    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.config = cfg.validate()
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
                                      for _ in range(cfg.num_readouts))
        self._init_draft_vocab(cfg)
        self.fused = False

    lm_head_from_target = True  # Medusa initializes each head's projection from the LM head

    def fuse_for_inference(self, lm_head_int8: bool = True) -> "MedusaHead":
        """Drafting as one batched product a block depth for every head (the heads' j-th blocks
        stacked: they all read the same hidden state, so three launches a depth serve K heads where
        each head took three), and the readouts on the fused projection kernel
        (heads/fused_layer.draft_logits), every vocabulary projection (lm_head_int8, default True)
        in an int8 copy with a float32 scale a row: half the bytes a drafted depth streams, where a
        head's step is mostly its projection. Drafts only: the target verifies every token. Call
        after the head is on its device and dtype (again to change lm_head_int8)."""
        stacked = []
        for j in range(self.config.num_layers):
            layers = [block.layers[j] for block in self.blocks]
            stacked.append(torch.stack([layer.weight.t() for layer in layers]).contiguous())  # [K, H, H]: x @ W.T
            stacked.append(torch.stack([layer.bias for layer in layers])[:, None, :].contiguous())  # [K, 1, H]
        keep_in_place(self, "_stacked_blocks", tuple(stacked))
        for proj in self.lm_heads:
            fuse_readout(proj, proj.weight, lm_head_int8)
        self.fused = True
        self.keep_target_ids()
        return self

    def readout_heads(self) -> list[nn.Linear]:
        """Every head's own vocabulary projection (head.lm_head_from_target, head.freeze_lm_head)."""
        return list(self.lm_heads)

    def init_readout_from_target(self, target) -> None:
        """Every head's lm_head from the target's rows: with the blocks the identity, each head
        starts predicting the target's next token (training.trainer, head.lm_head_from_target)."""
        readout_from_target(self, target, self.readout_heads())

    def features(self, hidden: torch.Tensor, heads: int | None = None) -> list[torch.Tensor]:
        """The first `heads` heads' features of the target's hidden state (None: every head)."""
        return [block(hidden) for block in self.blocks[:heads]]

    def projection(self, step: int) -> nn.Linear:
        """Head `step`'s vocabulary projection (the shared one with shared_lm_head)."""
        return self.lm_heads[0 if self.config.shared_lm_head else step]

    def logits(self, features: torch.Tensor, step: int) -> torch.Tensor:
        """Head `step`'s logits (fused: on the projection kernel, in int8 where fuse_for_inference
        said so)."""
        proj = self.projection(step)
        return fused_logits(features, proj.weight, proj._lm_int8) if self.fused else proj(features)

    def draft_logits(self, hidden: torch.Tensor, heads: int) -> list[torch.Tensor]:
        """The first `heads` heads' logits [b, 1, Vd] from the target's hidden state [b, 1, H]: one
        product for every head through a shared projection, one a head otherwise (fused: the
        blocks stacked as well)."""
        feats = self._stacked_features(hidden, heads) if self.fused else torch.stack(self.features(hidden, heads))
        if self.config.shared_lm_head:  # every head's rows in one product, head-major
            return list(self.logits(feats, 0).unbind(0))
        return [self.logits(f, d) for d, f in enumerate(feats.unbind(0))]

    def _stacked_features(self, hidden: torch.Tensor, heads: int) -> torch.Tensor:
        """features() of the first `heads` heads through the stacked blocks: [heads, *hidden.shape]."""
        x = hidden.reshape(1, -1, hidden.shape[-1]).expand(heads, -1, -1)
        blocks = self._stacked_blocks
        for j in range(0, len(blocks), 2):
            x = x + nn.functional.silu(torch.baddbmm(blocks[j + 1][:heads], x, blocks[j][:heads]))
        return x.reshape(heads, *hidden.shape)

    def readout(self, features: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return features, self.projection(step).weight


def medusa_unroll(head: MedusaHead, embed, input_ids: torch.Tensor, aux_hidden: torch.Tensor, steps: int):
    """Head k's features at every position (output k at t predicts token t+2+k)."""
    hidden = aux_hidden.to(head.lm_heads[0].weight.dtype)
    return [head.blocks[k](hidden) for k in range(min(steps, head.config.num_heads))]
