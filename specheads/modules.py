"""Building blocks shared by the target forward and the draft heads.

One RMSNorm, one rotary table and one gated MLP, so the target and the head see the
same numerics in training and serving.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32, rounded to x's dtype, then scaled (the fused kernel rounds the same way)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(hf_config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for any rope type transformers knows.

    transformers owns the rope variants (llama3, yarn, linear, ...); we only take its
    frequencies so that our forward matches HF's exactly.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    with torch.device("cpu"):  # real numbers even when the model is built on the meta device
        return _rope_inv_freq(hf_config, ROPE_INIT_FUNCTIONS)


def _rope_inv_freq(hf_config, ROPE_INIT_FUNCTIONS) -> tuple[torch.Tensor, float]:
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    return inv_freq.float(), float(scaling)


class RotaryTable(nn.Module):
    """cos/sin for positions 0..max_positions-1, computed once in float32."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, max_positions: int):
        super().__init__()
        self._inv_freq = inv_freq.detach().float().cpu()
        self._scaling = scaling
        self._max_positions = max_positions
        cos, sin = self._tables(torch.empty(0).device)  # the default device (honours `with torch.device(...)`)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device):
        with torch.device("cpu"):
            pos = torch.arange(self._max_positions, dtype=torch.float32)
            freqs = torch.outer(pos, self._inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self._scaling).to(device), (emb.sin() * self._scaling).to(device)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) must not round the tables and to_empty() must not leave them
        # uninitialized: always rebuild them in float32 on the new device
        super()._apply(fn, recurse)
        if self.cos.device.type != "meta":
            self.cos, self.sin = self._tables(self.cos.device)
        return self

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # [B, T] -> [B, 1, T, D], broadcast over heads
        return self.cos[position_ids].unsqueeze(1).to(dtype), self.sin[position_ids].unsqueeze(1).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, n_kv, T, D] -> [B, n_kv * n_rep, T, D] for grouped-query attention."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention without copying keys/values per query head.

    q [B, H, T, D]; k, v [B, KV, S, D]; mask bool [B or 1, 1, T, S] (True = attend).
    The `H // KV` query heads of a group are folded into the query length, so one SDPA
    call over the KV heads serves them all.
    """
    b, h, t, d = q.shape
    kv = k.shape[1]
    rep = h // kv
    if rep == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q = q.reshape(b, kv, rep * t, d)
    if mask is not None:
        mask = mask.repeat(1, 1, rep, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.reshape(b, h, t, d)


@torch.no_grad()
def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linears over the same input, for one matmul at
    inference; each linear's parameters become views of it (no memory added, same state_dict)."""
    weight = torch.cat([lin.weight for lin in linears])
    bias = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start: start + n], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start: start + n], requires_grad=False)
        start += n
    return weight, bias


def configure_torch_backends() -> None:
    """cuDNN's SDPA re-plans for every new sequence length (17 ms of CPU per call measured on
    an H200 with torch 2.11), and our lengths change every batch: use flash / mem-efficient."""
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.matmul.allow_tf32 = True
