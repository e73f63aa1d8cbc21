"""A standalone draft model: a small LM of the target's family drafts for it, with its own KV cache.

    specheads generate --target Qwen2.5-Coder-1.5B-Instruct --draft Qwen2.5-Coder-0.5B-Instruct ...
    SpecEngine(target, DraftLM(small_model), num_steps=4, topk=1)      # a chain of 4
    SpecEngine(target, DraftLM(small_model), num_steps=4, topk=4, num_draft_tokens=12)  # a tree

The draft model is a `TargetModel` (any supported family). Its tokenizer must be the target's
(`check_same_tokenizer`: compared as tokenizers, not by embedding rows, since models of one
family pad their vocabularies differently).

Row state, with L the row's committed length (the root, the last emitted token, at position L):
the draft's cache holds positions < L at their slots, and a ring holds the last positions'
tokens. A step's `propose` feeds the window of the last W positions (L-W+1..L: the tokens
accepted last step, whose entries the draft has not computed, and the root) at their slots;
its logits at L give the depth-1 candidates. Each deeper depth feeds the frontier (its k best
candidates, at positions L+d) into scratch slots past the row's capacity, attending to the
positions up to L, its ancestors' scratch slots and itself. The tree keeps the best
`num_draft` candidates by summed log-probability (an EAGLE-2-style dynamic tree; topk 1: a
chain). `commit` writes the accepted tokens and the bonus into the ring. All at fixed shapes,
without host syncs: the engine captures draft, verify and commit as one CUDA graph. Drafts
never change the output: verification is the engine's, lossless.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specheads.drafters import DrafterError, DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, PrefillBatch, StepResult, tier_copy
from specheads.drafters.common import CandidatePool
from specheads.kernels.draft import topk_expand
from specheads.runtime.tree import Tree
from specheads.target.model import SUPPORTED_MODEL_TYPES, KVCache

METHOD = "draft_model"


class DraftLM:
    """A small LM drafting for a target: the `head` an engine gets for the draft_model method."""

    kind = METHOD

    def __init__(self, model, name: str = "draft model"):
        self.model, self.name = model, name

    @property
    def spec(self):
        return self.model.spec


def check_same_tokenizer(target_tok, draft_tok, draft_name: str = "the draft model") -> None:
    """Refuse a draft whose tokenizer differs from the target's: its token ids would mean other text."""
    a, b = target_tok.get_vocab(), draft_tok.get_vocab()
    if a != b:
        only_t = sorted(set(a) - set(b))[:3]
        only_d = sorted(set(b) - set(a))[:3]
        moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])[:3]
        raise DrafterError(
            f"{draft_name}'s tokenizer differs from the target's ({len(b)} vs {len(a)} tokens; only the target has "
            f"{only_t}, only the draft {only_d}, other ids for {moved}): a standalone draft model must share the "
            f"target's tokenizer (a smaller model of the same family)")
    specials = ("bos_token_id", "eos_token_id")
    diff = [s for s in specials if getattr(target_tok, s, None) != getattr(draft_tok, s, None)]
    if diff:
        raise DrafterError(f"{draft_name}'s tokenizer has other special tokens than the target's ({', '.join(diff)})")


def is_language_model(path: str | Path) -> bool:
    """Whether `--draft` names a language model (a .gguf file, or a folder whose config.json is a
    supported model type and that is no specheads head) rather than a head folder."""
    p = Path(path)
    if p.suffix == ".gguf":
        return True
    config = p / "config.json"
    if not p.is_dir() or not config.is_file() or (p / "specheads.json").is_file():
        return False
    import json

    try:
        cfg = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    # an exported head (SGLang/vLLM layout) is a Llama config too: it names its kind
    return cfg.get("model_type") in SUPPORTED_MODEL_TYPES and not {"speculators_config", "specheads_kind"} & set(cfg)


def load_draft(path: str, target_tokenizer, device="cpu", dtype=None):
    """`--draft`: a head folder or hub id (its kind's module), or a language model (a DraftLM,
    its tokenizer checked against the target's)."""
    if is_language_model(path):
        from specheads.target.loader import load_target

        model, tok, _ = load_target(path, dtype=dtype or torch.float32, device=device)
        check_same_tokenizer(target_tokenizer, tok, f"draft model {path!r}")
        return DraftLM(model, str(path))
    from specheads.heads.format import load_head

    return load_head(path, device=device, dtype=dtype)


class DraftModelDrafter(Drafter):
    abilities = Abilities(on_device=True, trees=True, tiers=True)

    def __init__(self, draft: DraftLM, target_vocab: int, num_steps: int = 4, topk: int = 1,
                 num_draft_tokens: int | None = None):
        if num_steps < 1 or topk < 1:
            raise DrafterError(f"a draft model drafts num_steps >= 1 deep with topk >= 1 (got {num_steps}, {topk})")
        self.lm = draft.model
        self.depth = self.steps = num_steps
        self.topk = topk
        self.pool = CandidatePool(num_steps, topk, num_draft_tokens)
        self.num_draft = self.pool.num_draft
        self.window = num_steps + 2  # a step accepts at most depth + 1 tokens; then the new root
        self.ring = self.window + 2
        # ids both vocabularies hold (same tokenizer; the two may pad differently)
        self.vocab = min(target_vocab, self.lm.spec.vocab_size)

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "DraftModelDrafter":
        if not isinstance(setup.head, DraftLM):
            raise DrafterError(f"method {METHOD} needs a draft language model (--draft), got {type(setup.head).__name__}")
        if setup.static_tree:
            raise DrafterError("a draft model drafts dynamic trees or chains (topk 1); static trees are not supported")
        if setup.options:
            raise DrafterError(f"unknown {METHOD} drafter options {sorted(setup.options)}")
        return cls(setup.head, setup.target.spec.vocab_size, setup.num_steps, setup.topk, setup.num_draft_tokens)

    def prepare(self, device) -> None:
        self.lm.fuse_for_inference()

    # ................................................................. state
    def _room(self) -> int:
        return (self.steps - 1) * self.topk + 1  # the frontier's scratch slots, then a discard slot

    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        s = self.lm.spec
        return 2 * s.num_hidden_layers * rows * s.num_key_value_heads * (cap + self._room()) * s.head_dim * elem

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        # the engine's cache holds max_len + 1 + num_draft + 2 slots; a root sits below max_len and
        # its drafts reach `steps` positions past it
        need = cap - (self.num_draft + 3) + self.steps
        if need > self.lm.rotary.max_positions:
            raise DrafterError(f"the draft model has {self.lm.rotary.max_positions} positions; the engine needs {need} "
                               f"(lower max_len)")
        self.cap = cap
        self.cache = KVCache(self.lm.spec, rows, cap + self._room(), dtype, device)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, self.ring + 1, dtype=torch.long, device=device)  # last index: discard
        self.offsets = torch.arange(self.window, device=device) - (self.window - 1)  # window positions - L
        self.target_ids = torch.arange(self.vocab, device=device)
        self.pool.allocate(rows, device)

    def tier(self, shape) -> "DraftModelDrafter":
        """A shallower or narrower tree over the same cache and token ring (the window stays the
        full tree's: a step may follow one that accepted more); its own pool and scratch slots."""
        tier = tier_copy(self, shape)
        tier.pool = self.pool.tier(shape, self.length.shape[0], self.length.device)
        return tier

    def state(self) -> list[torch.Tensor]:
        return [self.length, self.tokens]

    def move_row(self, src: int, dst: int, length: int) -> None:
        kv = self.cache.layers()
        kv[:, dst, :, :length] = kv[:, src, :, :length]
        for t in self.state():
            t[dst] = t[src]

    def clear_row(self, row: int) -> None:
        self.length[row].fill_(0)  # (fill_: `= 0` would wait for the step in flight)
        self.tokens[row].fill_(0)

    def park_rows(self, start: int, stop: int) -> None:
        self.length[start:stop] = 0

    # ................................................................. the step
    def _ring_write(self, rows: slice, positions, valid, tokens) -> None:
        at = torch.where(valid, positions % self.ring, torch.full_like(positions, self.ring))
        self.tokens[rows].scatter_(1, at, tokens)

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens.clamp(max=self.lm.spec.vocab_size - 1)  # a target-only id (padding) stays in range

    def prefill(self, batch: PrefillBatch) -> None:
        """The draft's own prompt forward (its cache), and the ring's last positions."""
        k_rows, w = batch.ids.shape
        rows = slice(batch.start, batch.start + k_rows)
        dev = batch.ids.device
        self.lm(self._ids(batch.ids), cache=self.cache.rows(rows), kv_len=w, return_logits=False)
        self.length[rows] = batch.lens
        # tokens at positions len-ring+1 .. len (the first generated token at len)
        pos = batch.lens[:, None] - self.ring + 1 + torch.arange(self.ring, device=dev)
        full = torch.cat([batch.ids, batch.ids[:, :1]], 1).scatter(1, batch.lens[:, None], batch.first[:, None])
        self._ring_write(rows, pos, pos >= 0, full.gather(1, pos.clamp(min=0)))

    def commit(self, step: StepResult) -> None:
        """The accepted drafts and the bonus (the target's token after each path node) at L+1..L+a."""
        b = step.rows
        at = step.path.clamp(min=0)
        n = at.shape[1]
        base = self.length[:b]
        positions = base[:, None] + 1 + torch.arange(n, device=at.device)
        valid = torch.arange(n, device=at.device)[None] < step.accepted[:, None]
        self._ring_write(slice(0, b), positions, valid, step.target_tokens.gather(1, at))
        self.length[:b] += step.accepted

    def _window(self, b: int, kv: int, logits: bool = True):
        """The draft's forward over the window L-W+1..L at its slots (positions before 0 write to
        the discard slot): its cache catches up with the committed tokens; the root's logits."""
        length = self.length[:b]
        width = kv + self._room()
        pos = length[:, None] + self.offsets
        ok = pos >= 0
        tok = self.tokens[:b].gather(1, pos.clamp(min=0) % self.ring)
        last = torch.full_like(length, self.window - 1)[:, None] if logits else None
        return self.lm(self._ids(tok), pos.clamp(min=0), cache=self.cache, kv_len=width,
                       cache_slots=torch.where(ok, pos, width - 1), return_logits=logits, logits_positions=last)

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        """A plain step: the window's forward (the draft's cache), without logits or drafts."""
        self._window(ctx.rows, ctx.kv, logits=False)

    def propose(self, ctx: DraftContext) -> Tree:
        b, kv, roots = ctx.rows, ctx.kv, ctx.roots
        k, lm, dev = self.topk, self.lm, roots.device
        length = self.length[:b]
        width = kv + self._room()
        out = self._window(b, kv)
        pool = pool_tok, pool_score, pool_parent = self.pool.buffers(b, dev)
        front_tok, front_score, parent, front_pool = topk_expand(
            out.logits[..., : self.vocab].float(), self.pool.zero_score[:b], self.pool.no_parent[:b], k, self.target_ids,
            pool_tok[:, :k], pool_score[:, :k], pool_parent[:, :k], 0)[:4]
        cols = torch.arange(width, device=dev)
        seen = (cols[None, None, :] <= length[:, None, None]).expand(b, k, width)  # up to the root
        off = k
        for d in range(1, self.steps):
            slots = kv + (d - 1) * k + torch.arange(k, device=dev).expand(b, k)
            anc = seen.gather(1, parent[:, :, None].expand(b, k, width)) if d > 1 else seen
            seen = anc | (cols[None, None, :] == slots[:, :, None])
            out = lm(self._ids(front_tok), (length + d)[:, None].expand(b, k), cache=self.cache, kv_len=width,
                     cache_slots=slots, attn_mask=seen[:, None])
            n = k * k
            front_tok, front_score, parent, front_pool = topk_expand(
                out.logits[..., : self.vocab].float(), front_score, front_pool, k, self.target_ids,
                pool_tok[:, off: off + n], pool_score[:, off: off + n], pool_parent[:, off: off + n], off)[:4]
            off += n
        return self.pool.tree(roots, pool)
