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
import torch.nn.functional as F
from torch import nn

from specheads.kernels.attention import tree_attention
from specheads.kernels.fused import embedding, rmsnorm, rope_cache, silu_mul
from specheads.kernels.linear import fits, layer_shapes, linear, serves
from specheads.modules import (GatedMLP, RMSNorm, RotaryTable, apply_rotary, fuse_linears, gqa_attention, repeat_kv,
                               rope_inv_freq)

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


def causal_cache_mask(position_ids: torch.Tensor, kv_len: int, window: int | None = None) -> torch.Tensor:
    """Bool [B, 1, T, kv_len]: query at position p sees cache slots j <= p (and j > p - window)."""
    slots = torch.arange(kv_len, device=position_ids.device)
    pos = position_ids[:, None, :, None]
    mask = slots <= pos
    if window:
        mask = mask & (slots > pos - window)
    return mask


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

    def forward(self, x, cos, sin, attn_mask=None, cache: KVCache | None = None, position_ids=None, kv_len=None,
                fresh: bool = False, cache_slots=None):
        """fresh: the tokens start at position 0 in every row (a prefill), so causal attention
        over the new keys alone is exact and the flash kernel can run."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        if cache is not None:
            # write this step's keys at their slots (tree tokens share positions, not slots)
            slots = position_ids if cache_slots is None else cache_slots
            idx = slots[:, None, :, None].expand(b, self.n_kv, t, self.head_dim)
            cache.k[self.layer_idx].scatter_(2, idx, k)
            cache.v[self.layer_idx].scatter_(2, idx, v)
        if (cache is None or fresh) and attn_mask is None and self.window is None:
            rep = self.n_heads // self.n_kv
            out = F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), is_causal=True)
        else:
            if cache is not None and not fresh:
                k = cache.k[self.layer_idx, :b, :, :kv_len]
                v = cache.v[self.layer_idx, :b, :, :kv_len]
            if attn_mask is None:
                attn_mask = causal_cache_mask(position_ids, k.shape[2], self.window)
            elif self.window is not None:
                # a caller's mask (e.g. a tree) decides causality; the window only cuts old slots
                slots = torch.arange(k.shape[2], device=x.device)
                attn_mask = attn_mask & (slots > position_ids[:, None, :, None] - self.window)
            out = gqa_attention(q, k, v, attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, spec: TargetSpec, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(spec, layer_idx)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x, cos, sin, **attn_kwargs):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, **attn_kwargs)
        return x + self.mlp(self.post_attention_layernorm(x))


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
        self._own_gemm = False  # set by fuse_for_inference: our GEMM kernel serves this layer's shapes

    @torch.no_grad()
    def fuse_for_inference(self) -> "TargetModel":
        """Concatenate each layer's q/k/v and gate/up weights (one matmul each); the separate
        weights become views of the fused ones, so no memory is added and state_dict is
        unchanged. Decode and verify forwards (with a cache) then run the fused kernels.
        Call after the model is on its device and dtype."""
        if self.fused:
            return self
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.qkv_weight, a.qkv_bias = fuse_linears([a.q_proj, a.k_proj, a.v_proj])
            m.gate_up_weight, m.gate_up_bias = fuse_linears([m.gate_proj, m.up_proj])
        self.fused = True
        spec = self.spec
        self._shapes = layer_shapes(spec.hidden_size, spec.num_attention_heads * spec.head_dim, spec.intermediate_size)
        self._own_gemm = all(serves(n, k) for n, k in self._shapes)
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
        attn_mask: torch.Tensor | None = None,
        logits_positions: torch.Tensor | None = None,
        prefill: bool = False,
        cache_slots: torch.Tensor | None = None,
    ) -> TargetOutput:
        """input_ids [B, T]. Without a cache: causal attention over the batch (right padding is
        harmless). With a cache: tokens are written at `position_ids` and attend to slots
        < kv_len under `attn_mask` (default: causal by position)."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if cache is not None and kv_len is None:
            kv_len = cache.max_len
        # the fused kernels serve prefills too: ~10 launches a layer instead of ~40 eager ops,
        # whose host-side dispatch cost a 30-layer prompt forward ~25 ms
        if self.fused and cache is not None and not self.spec.qk_norm and not any(self.spec.sliding_windows):
            return self._fused_forward(input_ids, position_ids, cache, kv_len, attn_mask, cache_slots, capture_layers,
                                       return_logits, logits_positions)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(position_ids, x.dtype)
        captured = {}
        capture = set(capture_layers)
        # a prefill (every row at positions 0..T-1) attends to its own keys only: flash-eligible
        fresh = prefill and cache is not None and attn_mask is None
        if cache is not None and attn_mask is None and not fresh and not any(self.spec.sliding_windows):
            attn_mask = causal_cache_mask(position_ids, kv_len)  # built once, shared by all layers
        attn_kwargs = dict(attn_mask=attn_mask, cache=cache, position_ids=position_ids, kv_len=kv_len, fresh=fresh,
                           cache_slots=cache_slots)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, **attn_kwargs)
            if i in capture:
                captured[i] = x
        hidden = self.model.norm(x)
        if len(self.model.layers) in capture:
            captured[len(self.model.layers)] = hidden
        return self._output(hidden, captured, capture_layers, return_logits, logits_positions)

    def _cublas_layers(self, x, position_ids, slots, cache, kv_len, attn_mask, capture_layers, return_logits,
                       logits_positions) -> TargetOutput:
        """`_fused_forward`'s layers where our GEMM does not run (wide layers without a
        measured tile, calls of more than Numerics.linear_max_rows rows: batched trees, prefills):
        cuBLAS projections, the residual add in the next RMSNorm."""
        spec = self.spec
        b, t = position_ids.shape
        h_q, h_kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        capture, captured, delta = set(capture_layers), {}, None
        for i, layer in enumerate(self.model.layers):
            a, m = layer.self_attn, layer.mlp
            h, x = rmsnorm(x, layer.input_layernorm.weight, layer.input_layernorm.eps, delta)
            q = rope_cache(F.linear(h, a.qkv_weight, a.qkv_bias), self.rotary.cos, self.rotary.sin, position_ids,
                           cache.k[i], cache.v[i], slots, h_q, h_kv, d)
            o = tree_attention(q, cache.k[i, :b, :, :kv_len], cache.v[i, :b, :, :kv_len], attn_mask)
            o = a.o_proj(o.transpose(1, 2).reshape(b, t, h_q * d))
            h, x = rmsnorm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps, o)
            delta = m.down_proj(silu_mul(F.linear(h, m.gate_up_weight, m.gate_up_bias)))
            if i in capture:
                captured[i] = x + delta
        hidden, _ = rmsnorm(x, self.model.norm.weight, self.model.norm.eps, delta)
        if len(self.model.layers) in capture:
            captured[len(self.model.layers)] = hidden
        return self._output(hidden, captured, capture_layers, return_logits, logits_positions)

    def _output(self, hidden, captured, capture_layers, return_logits, logits_positions) -> TargetOutput:
        logits = None
        if return_logits:
            h = hidden if logits_positions is None else hidden.gather(
                1, logits_positions[..., None].expand(-1, -1, hidden.shape[-1])
            )
            # fused: the same row-independent GEMM as the layers (a token's logits equal in a
            # decode and in a tree verify); `linear` keeps cuBLAS where that is faster
            logits = linear(h, self.lm_head.weight) if self.fused else self.lm_head(h)
        if isinstance(captured, dict):  # layer -> output, or the features made in place (a tensor)
            captured = torch.cat([captured[i] for i in capture_layers], dim=-1) if captured else None
        return TargetOutput(hidden=hidden, aux_hidden=captured, logits=logits)

    def _fused_forward(self, input_ids, position_ids, cache, kv_len, attn_mask, cache_slots, capture_layers,
                       return_logits, logits_positions) -> TargetOutput:
        """The same layers as `forward` with a cache, on the fused kernels: each projection
        carries its norm, activation or residual add (kernels/linear.py), rotary and the cache
        write are one kernel."""
        spec = self.spec
        b, t = input_ids.shape
        h_q, h_kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        slots = position_ids if cache_slots is None else cache_slots
        if attn_mask is None:
            attn_mask = causal_cache_mask(position_ids, kv_len)
        x = embedding(input_ids, self.model.embed_tokens.weight)
        # wide layers without measured tiles, or many rows: cuBLAS, the residual add in the next norm
        if not fits(b * t, *self._shapes):
            return self._cublas_layers(x, position_ids, slots, cache, kv_len, attn_mask, capture_layers, return_logits,
                                       logits_positions)
        # a captured layer's down_proj writes its slice of the features in place (no concatenation
        # after the last layer); the next layer reads its input from there (rows 3H apart)
        aux = torch.empty(b, t, len(capture_layers) * spec.hidden_size, dtype=x.dtype, device=x.device) \
            if capture_layers else None
        h = spec.hidden_size
        first = {}  # a layer listed twice (tiny models) writes its first slice, copied to the others after
        for j, layer in enumerate(capture_layers):
            first.setdefault(layer, j)
        where = {layer: aux[..., j * h: (j + 1) * h] for layer, j in first.items()}
        for i, layer in enumerate(self.model.layers):
            a, m = layer.self_attn, layer.mlp
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            qkv = linear(x, a.qkv_weight, a.qkv_bias, norm_weight=n1.weight, eps=n1.eps)
            q = rope_cache(qkv, self.rotary.cos, self.rotary.sin, position_ids, cache.k[i], cache.v[i], slots,
                           h_q, h_kv, d)
            o = tree_attention(q, cache.k[i, :b, :, :kv_len], cache.v[i, :b, :, :kv_len], attn_mask)
            x = linear(o.transpose(1, 2).reshape(b, t, h_q * d), a.o_proj.weight, a.o_proj.bias, residual=x)
            act = linear(x, m.gate_up_weight, m.gate_up_bias, norm_weight=n2.weight, eps=n2.eps, silu=True)
            x = linear(act, m.down_proj.weight, m.down_proj.bias, residual=x, out=where.get(i))
        hidden, _ = rmsnorm(x, self.model.norm.weight, self.model.norm.eps)
        if len(self.model.layers) in where:  # the final hidden state, after the norm
            where[len(self.model.layers)].copy_(hidden)
        for j, layer in enumerate(capture_layers):
            if first[layer] != j:
                aux[..., j * h: (j + 1) * h] = where[layer]
        return self._output(hidden, aux, capture_layers, return_logits, logits_positions)
