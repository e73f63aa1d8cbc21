"""A CUDA graph of one target forward at fixed shapes (the benchmark times verification
cost with it; the engine captures its whole step itself).

A graph is captured per batch size for a fixed number of tokens per row, attending over
the whole cache (kv_len = cache length) under a mask, so one capture serves every call.
Warm-up runs before capture write into the cache's last slot, which callers keep spare.
"""

from __future__ import annotations

import torch

from specheads.target.model import KVCache


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def capture_graph(fn, pool=None, after_warmup=None, warmups: int = 1):
    """Run `fn` `warmups` times (at least once) on a side stream (kernel selection, Triton
    compilation; `after_warmup` runs after each, e.g. to undo state the warm-up changed), then
    capture it in a CUDA graph that shares memory `pool`. Returns (graph, fn's output inside the
    graph)."""
    if warmups < 1:
        raise ValueError(f"warmups={warmups}: a capture needs at least one warm-up run before it")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmups):
            fn()
            if after_warmup is not None:
                after_warmup()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.no_grad():
        out = fn()
    return graph, out


class GraphedForward:
    def __init__(self, model, cache: KVCache, n_tokens: int, capture_layers=(), tree: bool = False):
        """tree: the caller passes cache slots and an explicit mask (tree verification);
        otherwise slots = positions and the mask is causal by position (plain decode)."""
        self.model, self.cache = model, cache
        self.n_tokens = n_tokens
        self.capture_layers = tuple(capture_layers)
        self.tree = tree
        self.graphs: dict[int, tuple] = {}
        self.pool = None

    def __call__(self, ids, positions, slots=None, mask=None):
        b = ids.shape[0]
        if b not in self.graphs:
            self.graphs[b] = self._capture(b)
        graph, inputs, out = self.graphs[b]
        inputs["ids"].copy_(ids)
        inputs["pos"].copy_(positions)
        if self.tree:
            inputs["slots"].copy_(slots)
            inputs["mask"].copy_(mask)
        graph.replay()
        return out

    def _forward(self, inputs):
        kv_len = self.cache.max_len
        return self.model(
            inputs["ids"], inputs["pos"], cache=self.cache, kv_len=kv_len,
            attn_mask=inputs.get("mask"), cache_slots=inputs.get("slots"), capture_layers=self.capture_layers,
        )

    def _capture(self, b: int):
        dev = self.cache.k.device
        t, spare = self.n_tokens, self.cache.max_len - 1
        inputs = {
            "ids": torch.zeros(b, t, dtype=torch.long, device=dev),
            "pos": torch.full((b, t), spare, dtype=torch.long, device=dev),
        }
        if self.tree:
            inputs["slots"] = torch.full((b, t), spare, dtype=torch.long, device=dev)
            inputs["mask"] = torch.ones(b, 1, t, self.cache.max_len, dtype=torch.bool, device=dev)
        graph, out = capture_graph(lambda: self._forward(inputs), self.pool)
        self.pool = graph.pool()
        return graph, inputs, out

