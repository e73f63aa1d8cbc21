"""A draft head's decoder layer on the fused kernels, over a KV buffer written in place.

Every head kind whose layers are Llama decoder layers (EAGLE-3's stack, EAGLE-1's layer, the
MTP modules' blocks) drafts through `layer_over_cache`: one qkv projection (with the layer's
input norm inside it, where the layer has one), rotary and the K/V write at the nodes' slots in
one kernel, tree attention over the buffer's first columns, then o_proj onto the residual, norm +
gate_up + silu, down_proj onto the residual (kernels/linear.py). On CPU the same calls run their
torch references. `fuse_layer` makes the fused weights (views of the layer's own: nothing added,
the state_dict unchanged).
"""

from __future__ import annotations

import torch

from specheads.kernels.attention import tree_attention
from specheads.kernels.fused import rope_cache
from specheads.kernels.linear import linear, quantize_rows
from specheads.modules import fuse_linears, gqa_attention

# Drafting's own launch settings (the head's weights meet these kernels only while drafting, at
# a few rows, so they need not match the target's; H200, gpu_runs/verify_kernels.py):
# the lm_head at 8 rows over a 32k x 576 weight takes 7.6 us in 256-column tiles against 9.5 us
# with the rule's 128; the attention takes 64 keys a program (4.4 vs 5.5 us at 8 query rows).
DRAFT_LM_TILE = (256, 64, 8, 3)
DRAFT_ATTN_CHUNK = 64
# qkv, o_proj and fc at a draft depth's few rows (<= 16): 128-key steps and 2 warps, 4 rows, PDL on:
# qkv 3.43 -> 3.22 us, o_proj 2.50 -> 2.32, fc (7 rows) 4.73 -> 4.35; gate_up and down keep the
# rule's (verify_kernels.py --head-tiles, H200). Prefills (many rows) keep the rule's tiles.
DRAFT_TILE = (16, 128, 2, 3)


def draft_tile(x: torch.Tensor):
    """DRAFT_TILE for a draft depth's few rows, the weight shape's rule otherwise."""
    return DRAFT_TILE if x.numel() <= 16 * x.shape[-1] else None


def fuse_layer(layer) -> None:
    """layer.self_attn.qkv_weight and layer.mlp.gate_up_weight, once (views of the projections)."""
    attn, mlp = layer.self_attn, layer.mlp
    if getattr(attn, "qkv_weight", None) is None:
        attn.qkv_weight, _ = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.gate_up_weight, _ = fuse_linears([mlp.gate_proj, mlp.up_proj])


def keep_in_place(head, name: str, value) -> None:
    """Set head.<name> to the tensor (or tuple of tensors) `value` for drafting, keeping the one
    already there when it holds the same values: CUDA graphs captured with it read it at its
    address, so a second fuse_for_inference (a second drafter on the same head, such as the
    evaluation's served-acceptance estimate beside an engine) must not free it. An old value that
    is replaced stays referenced (head._superseded), never freed under a graph that read it."""
    old = getattr(head, name, None)
    flat_old = old if isinstance(old, tuple) else (old,)
    flat_new = value if isinstance(value, tuple) else (value,)
    same = old is not None and value is not None and len(flat_old) == len(flat_new) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
        for a, b in zip(flat_old, flat_new))
    if same:
        return
    if old is not None:
        head.__dict__.setdefault("_superseded", []).append(old)
    setattr(head, name, value)


def fuse_readout(head, weight: torch.Tensor, lm_head_int8: bool) -> None:
    """head._lm_int8: the readout weight in int8 rows with a float32 scale a row (quantize_rows),
    or None; kept in place across calls (keep_in_place)."""
    keep_in_place(head, "_lm_int8", quantize_rows(weight) if lm_head_int8 else None)


def cache_attend(k_cache, v_cache, slots, attn_mask):
    """The torch modules' attention over a KV buffer (the reference of `layer_over_cache`): an
    attend(q, k, v) that writes the nodes' k, v [B, kv_heads, T, D] at `slots` [B, T] of k_cache /
    v_cache [B, kv_heads, S, D] and attends over columns [:W] under attn_mask bool [B, 1, T, W]."""
    span = attn_mask.shape[-1]

    def attend(q, k, v):
        idx = slots[:, None, :, None].expand(*slots.shape[:1], k.shape[1], slots.shape[1], k.shape[-1])
        k_cache.scatter_(2, idx, k.to(k_cache.dtype))
        v_cache.scatter_(2, idx, v.to(v_cache.dtype))
        return gqa_attention(q, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask)

    return attend


def layer_over_cache(layer, x, residual, rotary, positions, k_cache, v_cache, slots, attn_mask, n_heads: int,
                     input_norm=None) -> torch.Tensor:
    """One fused decoder layer over nodes [B, T]: x is its attention input [B, T, H], or None with
    `input_norm` (an RMSNorm): input_norm(residual) inside the qkv projection. The nodes' rotated
    keys and values land at `slots` [B, T] of k_cache / v_cache [B, kv_heads, S, D]; they attend
    to columns [:W] under attn_mask bool [B, 1, T, W]. Returns the layer's output [B, T, H]."""
    attn = layer.self_attn
    n_kv, head_dim = k_cache.shape[1], k_cache.shape[-1]
    if x is None:
        qkv = linear(residual, attn.qkv_weight, norm_weight=input_norm.weight, eps=input_norm.eps,
                     tile=draft_tile(residual))
    else:
        qkv = linear(x, attn.qkv_weight, tile=draft_tile(x))
    q = rope_cache(qkv, rotary.cos, rotary.sin, positions, k_cache, v_cache, slots, n_heads, n_kv, head_dim)
    span = attn_mask.shape[-1]
    out = tree_attention(q, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask, chunk=DRAFT_ATTN_CHUNK)
    return layer_finish(layer, out, residual)


def layer_finish(layer, attn_out, residual) -> torch.Tensor:
    """attn_out [B, heads, T, D] -> the layer's output [B, T, H] on the fused kernels: o_proj onto
    the residual, post-attention norm + gate_up + silu, down_proj onto that."""
    b, _, t, _ = attn_out.shape
    ln = layer.post_attention_layernorm
    o_in = attn_out.transpose(1, 2).reshape(b, t, -1)
    h = linear(o_in, layer.self_attn.o_proj.weight, residual=residual, tile=draft_tile(o_in))
    act = linear(h, layer.mlp.gate_up_weight, norm_weight=ln.weight, eps=ln.eps, silu=True)
    return linear(act, layer.mlp.down_proj.weight, residual=h)


def draft_logits(hidden, weight, lm_int8=None, norm=None) -> torch.Tensor:
    """A draft depth's logits on the fused projection: norm (an RMSNorm, or None) inside it, the
    weight in int8 with its row scales where `lm_int8` (quantize_rows) is given."""
    kw = dict(norm_weight=norm.weight, eps=norm.eps) if norm is not None else {}
    if lm_int8 is not None:
        q, scale = lm_int8
        return linear(hidden, q, tile=DRAFT_LM_TILE, weight_scale=scale, **kw)
    return linear(hidden, weight, tile=DRAFT_LM_TILE, **kw)
