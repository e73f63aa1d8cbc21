"""Sampling parameters and the one sampler every decoding path uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specheads.kernels.argmax import argmax_last


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
        # the per-row state holds these in int64 tensors: a larger value failed inside a step,
        # and with it every request of the batch
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise InvalidRequest(f"seed must be a 64-bit integer (-2**63 <= seed < 2**63), got {self.seed}")
        if self.top_k >= 2**63:
            raise InvalidRequest(f"top_k must be below 2**63 (and at most the vocabulary), got {self.top_k}")
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


# ---------------------------------------------------------------------------- per-row sampling
# The engine samples every row of a batch with its own parameters, inside CUDA graphs, and
# reproducibly per request: the noise for the token at sequence position t of a request
# with seed s is a hash of (s, t, token id), so a seeded request gives the same output in
# any batch, and speculative decoding with a seed gives exactly what plain decoding gives.
_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """seeds [B], positions [B, N] -> Gumbel(0, 1) noise [B, N, V] (float32)."""
    s = _mix32(seeds.long() & _M32)[:, None]
    key_a = _mix32(s ^ (positions.long() & _M32))
    key_b = _mix32(key_a ^ 0x5BD1E995)
    v = torch.arange(vocab, device=seeds.device)
    x = _mix32(_mix32(key_a[..., None] ^ v) ^ key_b[..., None])
    u = ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))  # 24 bits: exact in float32, inside (0, 1)
    return -torch.log(-torch.log(u))


@dataclass
class RowParams:
    """Sampling parameters per batch row, as device tensors [B]."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor
    floats: torch.Tensor | None = field(default=None, repr=False, compare=False)  # [temperature, top_p]

    @classmethod
    def allocate(cls, rows: int, device, longs: torch.Tensor | None = None) -> "RowParams":
        """Rows of two blocks: `floats` [2, rows] (temperature 0, top_p 1) and `longs` [2, rows] (top_k,
        seed: a caller's zeroed rows, e.g. of its own block, else new), so a row moves in one copy a block."""
        floats = torch.stack([torch.zeros(rows, device=device), torch.ones(rows, device=device)])
        longs = torch.zeros(2, rows, dtype=torch.long, device=device) if longs is None else longs
        return cls(floats[0], floats[1], longs[0], longs[1], floats)

    def set_row(self, row: int, params: SamplingParams, seed: int) -> None:
        # (fill_: `t[row] = number` copies a host scalar to the card and waits for the step in flight)
        for t, v in zip(self.tensors(), (params.temperature, params.top_p, params.top_k, seed)):
            t[row].fill_(v)

    def tensors(self) -> list[torch.Tensor]:
        return [self.temperature, self.top_p, self.top_k, self.seed]

    def rows(self, rows: slice) -> "RowParams":
        return RowParams(*(t[rows] for t in self.tensors()))


def sample_rows(logits: torch.Tensor, rows: RowParams, positions: torch.Tensor, any_sampled: bool) -> torch.Tensor:
    """logits [B, N, V]; positions [B, N] (sequence position of the token drawn; None where
    any_sampled is False) -> ids [B, N].

    Rows at temperature 0 take the argmax; the others the Gumbel-max of their warped
    distribution (temperature, then top-k, then top-p, as `warp_probs`). any_sampled=False
    (known on the host) skips the sampling work for all-greedy batches."""
    greedy = argmax_last(logits)  # (the Triton kernel on GPU: torch's took 13 us a step)
    if not any_sampled:
        return greedy
    b, n, v = logits.shape
    temp = rows.temperature[:, None, None]
    scaled = logits.float() / temp.clamp(min=1e-6)
    vals, idx = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(v, device=logits.device)
    top_k = rows.top_k[:, None, None]
    vals = vals.masked_fill((top_k > 0) & (rank >= top_k), float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    top_p = rows.top_p[:, None, None]
    drop = probs.cumsum(-1) - probs > top_p
    vals = vals.masked_fill(drop & (top_p < 1.0), float("-inf"))
    noise = gumbel_noise(rows.seed, positions, v).gather(-1, idx)
    choice = (vals + noise).argmax(-1, keepdim=True)
    sampled = idx.gather(-1, choice)[..., 0]
    return torch.where(rows.temperature[:, None] > 0, sampled, greedy)
