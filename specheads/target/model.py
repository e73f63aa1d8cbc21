"""One forward for the Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3).

The same module serves hidden-state capture in training, regeneration and speculative
verification, so all three see the same numerics. Parameter names follow transformers'
`*ForCausalLM` so that HF checkpoints load with `load_state_dict` unchanged.

Layer-capture convention: `capture_layers=[i, ...]` returns the OUTPUT of decoder layer i
(0-based), i.e. transformers' `output_hidden_states[i + 1]`. SGLang's config ids use the
same convention; vLLM's are one higher (the input of layer i). One past the last layer
(i = num_hidden_layers) is the final hidden state after the target's final norm (what MTP
heads read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from specheads.kernels import ahead
from specheads.kernels.attention import TreePlan, causal_attention, tree_attention, tree_plan
from specheads.kernels.fused import embedding, rmsnorm, rope_cache
from specheads.kernels.linear import linear
from specheads.modules import GatedMLP, RMSNorm, RotaryTable, fuse_linears, rope_inv_freq

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedTargetError(ValueError):
    pass


@dataclass
class TargetSpec:
    """What our forward needs from a transformers config, validated once."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_windows: list = field(default_factory=list)  # per layer: None or window size

    @classmethod
    def from_hf(cls, cfg) -> "TargetSpec":
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            arch = (getattr(cfg, "architectures", None) or ["?"])[0]
            raise UnsupportedTargetError(
                f"target architecture {arch!r} (model_type {model_type!r}) is not supported; "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedTargetError(f"target hidden_act {cfg.hidden_act!r} is not supported; expected 'silu'")
        n_layers = cfg.num_hidden_layers
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        windows = [None] * n_layers
        window = getattr(cfg, "sliding_window", None)
        if window:
            if model_type == "mistral":
                windows = [window] * n_layers
            elif getattr(cfg, "use_sliding_window", False):
                layer_types = getattr(cfg, "layer_types", None) or ["sliding_attention"] * n_layers
                windows = [window if t == "sliding_attention" else None for t in layer_types]
        return cls(
            model_type=model_type,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=n_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.rms_norm_eps,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            # Qwen2 has q/k/v biases without saying so in its config
            attention_bias=bool(getattr(cfg, "attention_bias", model_type == "qwen2")),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_windows=windows,
        )


class KVCache:
    """Preallocated keys/values: [layers, batch, kv_heads, max_len, head_dim].

    Row b's token at position p lives in slot p, so a query at position p sees slots <= p.
    """

    def __init__(self, spec: TargetSpec, batch_size: int, max_len: int, dtype, device):
        shape = (spec.num_hidden_layers, batch_size, spec.num_key_value_heads, max_len, spec.head_dim)
        # keys and values in one buffer: a commit moves both in one launch (`layers`)
        self.kv = torch.zeros((2,) + shape, dtype=dtype, device=device)
        self.k, self.v = self.kv[0], self.kv[1]

    def layers(self, rows: slice | None = None) -> torch.Tensor:
        """Keys and values as one [2 * layers, batch, kv_heads, max_len, head_dim] view (keys
        first), of some rows: what kernels.kv_commit moves."""
        both = self.kv.flatten(0, 1)
        return both if rows is None else both[:, rows]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def rows(self, rows: slice) -> "KVCache":
        """A view of some rows (same storage): a prefill writes new requests into their rows."""
        view = KVCache.__new__(KVCache)
        view.kv = self.kv[:, :, rows]
        view.k, view.v = view.kv[0], view.kv[1]
        return view

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class Attention(nn.Module):
    def __init__(self, spec: TargetSpec, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = spec.num_attention_heads
        self.n_kv = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.window = spec.sliding_windows[layer_idx]
        h, d = spec.hidden_size, spec.head_dim
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=spec.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=spec.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=spec.attention_bias)
        # Llama and Qwen3 put a bias on o_proj too when attention_bias is set; Qwen2 never does
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=spec.attention_bias and spec.model_type in ("llama", "qwen3"))
        if spec.qk_norm:
            self.q_norm = RMSNorm(d, spec.rms_norm_eps)
            self.k_norm = RMSNorm(d, spec.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None


class DecoderLayer(nn.Module):
    def __init__(self, spec: TargetSpec, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(spec, layer_idx)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


@dataclass
class TargetOutput:
    hidden: torch.Tensor  # final normed hidden [B, T, H]
    aux_hidden: torch.Tensor | None  # captured layer outputs concatenated [B, T, n * H]
    logits: torch.Tensor | None  # [B, T, V] when asked for


class TargetModel(nn.Module):
    def __init__(self, hf_config, max_positions: int | None = None):
        super().__init__()
        self.spec = spec = TargetSpec.from_hf(hf_config)
        self.hf_config = hf_config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_hidden_layers))
        self.model.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq, scaling = rope_inv_freq(hf_config)
        self.rotary = RotaryTable(inv_freq, scaling, max_positions or spec.max_position_embeddings)
        self.fused = False

    @torch.no_grad()
    def fuse_for_inference(self) -> "TargetModel":
        """Concatenate each layer's q/k/v and gate/up weights (one matmul each); the separate
        weights become views of the fused ones, so no memory is added and state_dict is
        unchanged; the forward concatenates them itself before (for training's hidden-state
        capture). Call after the model is on its device and dtype."""
        if self.fused:
            return self
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.qkv_weight, a.qkv_bias = fuse_linears([a.q_proj, a.k_proj, a.v_proj])
            m.gate_up_weight, m.gate_up_bias = fuse_linears([m.gate_proj, m.up_proj])
        self.fused = True
        return self

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    def default_capture_layers(self) -> list[int]:
        """EAGLE-3's low/mid/high choice, as outputs of layers (1, L//2 - 1, L - 4)."""
        n = self.spec.num_hidden_layers
        return [min(1, n - 1), max(n // 2 - 1, 0), max(n - 4, 0)]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        *,
        capture_layers: list[int] | tuple[int, ...] = (),
        return_logits: bool = True,
        cache: KVCache | None = None,
        kv_len: int | None = None,
        tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
        logits_positions: torch.Tensor | None = None,
        cache_slots: torch.Tensor | None = None,
    ) -> TargetOutput:
        """input_ids [B, T] at position_ids [B, T] (default 0..T-1).

        Without a cache the tokens attend causally to each other (a training batch: right padding
        is harmless). With a cache each token's keys and values are written at its slot
        (cache_slots, default its position) and it attends to slots < kv_len:
          tree       (base [B], anc [B, T, T], depth [B, T]): token n of a draft tree sits at slot
                     base + n and sees the committed slots below base and its ancestors;
          neither    causal by position, position p at slot p (a prefill, plain decode);
          attn_mask  bool [B, 1, T, kv_len], any pattern (not bit-exact with a decode).
        Every call runs the same ops, whatever the number of rows (kernels/linear.py,
        kernels/attention.py causal_attention): a token's outputs are the same bits in a prefill
        group, a decode and a tree verify at any batch size."""
        spec = self.spec
        b, t = input_ids.shape
        dev = input_ids.device
        if position_ids is None:
            position_ids = torch.arange(t, device=dev).expand(b, t)
        if cache is None:  # the step's keys in a scratch cache of T slots, position p at slot p
            if cache_slots is not None or tree is not None or attn_mask is not None:
                raise ValueError("cache_slots, tree and attn_mask need a cache")
            cache_slots = torch.arange(t, device=dev).expand(b, t)
            kv_len = t
        elif kv_len is None:
            kv_len = cache.max_len
        slots = position_ids if cache_slots is None else cache_slots
        h_q, h_kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        x = embedding(input_ids, self.model.embed_tokens.weight)
        # a captured layer's down_proj writes its slice of the features in place (no concatenation
        # after the last layer); the next layer reads its input from there (rows n * H apart)
        width = spec.hidden_size
        aux = torch.empty(b, t, len(capture_layers) * width, dtype=x.dtype, device=dev) if capture_layers else None
        first = {}  # a layer listed twice (tiny models) writes its first slice, copied to the others after
        for j, layer in enumerate(capture_layers):
            first.setdefault(layer, j)
        where = {layer: aux[..., j * width: (j + 1) * width] for layer, j in first.items()}
        if tree is not None and not isinstance(tree, TreePlan):
            tree = tree_plan(*tree)  # how every layer's attention deals the tree's tokens
        # a start-up's dry run (kernels/ahead.py) runs a layer only where its kernels' variants may be
        # new: the first layer of each structure meeting its input in each layout; a layer skipped
        # leaves its output in the layout the layer gives it (a captured one's: its features' slice)
        met = set() if ahead.mode() == ahead.DISCOVER else None
        for i, layer in enumerate(self.model.layers):
            a, m = layer.self_attn, layer.mlp
            if met is not None:
                shape = (i in where, a.window, a.q_norm is not None, x.stride(), x.data_ptr() % 16)
                if shape in met:
                    x = where[i].copy_(x) if i in where else x.contiguous()
                    continue
                met.add(shape)
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            qkv = linear(x, *self._fused(i, "qkv"), norm_weight=n1.weight, eps=n1.eps)
            if a.q_norm is not None:  # Qwen3: each head's q and k normed before rotary
                heads = qkv.view(b, t, h_q + 2 * h_kv, d)
                qn = rmsnorm(heads[:, :, :h_q], a.q_norm.weight, a.q_norm.eps)[0]
                kn = rmsnorm(heads[:, :, h_q: h_q + h_kv], a.k_norm.weight, a.k_norm.eps)[0]
                qkv = torch.cat([qn, kn, heads[:, :, h_q + h_kv:]], 2).view(b, t, -1)
            if cache is not None:
                k_cache, v_cache = cache.k[i], cache.v[i]
            else:
                k_cache, v_cache = torch.empty(2, b, h_kv, t, d, dtype=x.dtype, device=dev)
            q = rope_cache(qkv, self.rotary.cos, self.rotary.sin, position_ids, k_cache, v_cache, slots, h_q, h_kv, d)
            keys, values = k_cache[:b, :, :kv_len], v_cache[:b, :, :kv_len]
            if attn_mask is not None and tree is None:
                mask = attn_mask
                if a.window is not None:  # the caller's mask decides causality; the window cuts old slots
                    pos = position_ids[:, None, :, None]
                    mask = mask & (torch.arange(kv_len, device=dev) > pos - a.window)
                o = tree_attention(q, keys, values, mask)
            else:
                o = causal_attention(q, keys, values, position_ids, a.window, tree)
            x = linear(o.transpose(1, 2).reshape(b, t, h_q * d), a.o_proj.weight, a.o_proj.bias, residual=x)
            act = linear(x, *self._fused(i, "gate_up"), norm_weight=n2.weight, eps=n2.eps, silu=True)
            x = linear(act, m.down_proj.weight, m.down_proj.bias, residual=x, out=where.get(i))
        hidden, _ = rmsnorm(x, self.model.norm.weight, self.model.norm.eps)
        if len(self.model.layers) in where:  # the final hidden state, after the norm
            where[len(self.model.layers)].copy_(hidden)
        for j, layer in enumerate(capture_layers):
            if first[layer] != j:
                aux[..., j * width: (j + 1) * width] = where[layer]
        logits = None
        if return_logits:
            h = hidden if logits_positions is None else hidden.gather(
                1, logits_positions[..., None].expand(-1, -1, hidden.shape[-1]))
            logits = linear(h, self.lm_head.weight)
        return TargetOutput(hidden=hidden, aux_hidden=aux, logits=logits)

    def _fused(self, i: int, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer i's qkv or gate_up weight and bias: the fused tensors, or (before
        fuse_for_inference) their parts concatenated."""
        layer = self.model.layers[i]
        if self.fused:
            owner = layer.self_attn if name == "qkv" else layer.mlp
            return getattr(owner, f"{name}_weight"), getattr(owner, f"{name}_bias")
        a, m = layer.self_attn, layer.mlp
        parts = [a.q_proj, a.k_proj, a.v_proj] if name == "qkv" else [m.gate_proj, m.up_proj]
        bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
        return torch.cat([p.weight for p in parts]), bias
