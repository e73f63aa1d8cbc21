"""Batched autoregressive decoding on the target's own forward and KV cache.

This is the plain (`ar`) path: regeneration of training data runs on it, and it is the
baseline speculative decoding must equal token for token.
"""

from __future__ import annotations

import torch

from specheads.runtime.graphs import GraphedForward, compact_rows, next_pow2
from specheads.runtime.sampling import SamplingParams, sample
from specheads.target.model import KVCache, TargetModel


@torch.no_grad()
def generate_batch(
    model: TargetModel,
    prompts: list[list[int]],
    params: SamplingParams,
    stop_ids: set[int] | list[int] = (),
    compact_every: int = 32,
    use_graphs: bool | None = None,
) -> list[list[int]]:
    """Decode each prompt; returns new tokens per prompt, the stop token excluded.

    On CUDA the decode step replays a CUDA graph per power-of-two batch bucket, attending
    over the whole cache; elsewhere it runs eagerly over the filled prefix."""
    params.validate()
    device = model.model.embed_tokens.weight.device
    dtype = model.model.embed_tokens.weight.dtype
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ValueError("every prompt needs at least one token")
    max_len = max(lengths) + params.max_new_tokens
    if max_len > model.rotary.max_positions:
        raise ValueError(
            f"prompt of {max(lengths)} tokens + max_new_tokens {params.max_new_tokens} exceeds "
            f"the target's {model.rotary.max_positions} positions"
        )
    b = len(prompts)
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    if use_graphs is None:
        use_graphs = device.type == "cuda"
    cache = KVCache(model.spec, b, max_len + 1, dtype, device)  # + a spare slot for graph warm-up
    if use_graphs:
        model.fuse_for_inference()
    graphed = GraphedForward(model, cache, 1) if use_graphs else None
    width = max(lengths)
    ids = torch.zeros(b, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.as_tensor(p)
    ids = ids.to(device)
    pos = torch.arange(width, device=device).expand(b, width)
    last = torch.as_tensor(lengths, device=device) - 1
    out = model(ids, pos, cache=cache, kv_len=width, logits_positions=last[:, None], prefill=True)
    token = sample(out.logits[:, 0], params, generator)

    stops = torch.as_tensor(sorted(stop_ids) or [-1], device=device)
    rows = torch.arange(b, device=device)  # original row of each live cache row
    position = last + 1
    done = torch.zeros(b, dtype=torch.bool, device=device)
    produced = torch.zeros(b, max_len, dtype=torch.long, device=device)
    count = torch.zeros(b, dtype=torch.long, device=device)
    kv_len = width
    for step in range(params.max_new_tokens):
        hit = torch.isin(token, stops)
        produced[rows, count[rows]] = torch.where(done[rows] | hit, produced[rows, count[rows]], token)
        count[rows] += (~done[rows] & ~hit).long()
        done[rows] |= hit
        if step + 1 == params.max_new_tokens:
            break
        if (step + 1) % compact_every == 0:
            live = ~done[rows]
            n_live = int(live.sum())
            if n_live == 0:
                break
            size = next_pow2(n_live) if graphed else n_live
            if size < rows.numel():  # finished rows leave: live rows move to the front, in place
                keep = torch.argsort((~live).int(), stable=True)[:size]
                compact_rows([cache.k, cache.v], keep, dim=1)
                rows, token, position = rows[keep], token[keep], position[keep]
        kv_len = kv_len + 1
        if graphed is not None:
            out = graphed(token[:, None], position[:, None])
        else:
            out = model(token[:, None], position[:, None], cache=cache, kv_len=int(kv_len))
        token = sample(out.logits[:, 0], params, generator)
        position = position + 1
    produced, count = produced.cpu(), count.cpu()
    return [produced[i, : count[i]].tolist() for i in range(b)]
