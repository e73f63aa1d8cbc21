"""Sampling parameters and the one sampler every decoding path uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class InvalidRequest(ValueError):
    """A request parameter is out of range; the message names it and the valid range."""


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    max_new_tokens: int = 256

    def validate(self) -> "SamplingParams":
        if not (self.temperature >= 0):
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens <= 0:
            raise InvalidRequest(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature, top-k and top-p, as float32 probabilities."""
    logits = logits.float() / max(params.temperature, 1e-6)
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p > params.top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [..., V] -> token ids [...]."""
    if params.greedy:
        return logits.argmax(-1)
    probs = warp_probs(logits, params)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
