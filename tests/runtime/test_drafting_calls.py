"""Fewer launches a draft step, the same drafts.

The MTP drafter runs each module once a step (its window's entries and the frontier in one
call, the masks of every module built together): it drafts the same trees as running the window
and then the frontier module by module, each call building its own mask (the reference below),
so the same tokens are accepted at every step. EAGLE-1 and MTP read a depth's inputs at its
parents' rows inside the input kernel instead of gathering them first: the same outputs."""

from __future__ import annotations

import pytest
import torch

from specheads.drafters.mtp import MTPDrafter
from specheads.kernels.draft import topk_expand
from specheads.runtime.engine import SpecEngine
from specheads.runtime.sampling import SamplingParams
from tests.kernels.interpret import interpret_triton, needs_triton
from tests.runtime.spec_helpers import make_target, random_prompts, train_head

VOCAB = 64
TRAIN = random_prompts(16, VOCAB, [3, 7, 1, 12, 5, 9, 2, 6, 4, 10, 8, 3, 5, 11, 7, 2], seed=11)


class ModuleByModule(MTPDrafter):
    """The window's entries of every module first, then the frontier module by module: two calls
    per module past the first, each with a mask of its own."""

    def _feed(self, b, kv):
        length = self.length[:b]
        pos = length[:, None] + torch.arange(self.window) - self.window
        ok = pos >= 0
        pos0 = pos.clamp(min=0)
        hidden = self.feats[:b].gather(1, (pos % self.ring)[:, :, None].expand(-1, -1, self.feats.shape[-1]))
        width = kv + self._room()
        cols = torch.arange(width)
        out0 = None
        for d in range(self.modules):
            tok = self.tokens[:b].gather(1, (pos + 1 + d) % self.ring)
            known = ok & (pos + 1 + d <= length[:, None])
            slots = torch.where(known, pos0, width - 1)
            mask = (cols[None, None, :] < pos0[:, :, None]) & known[:, :, None]
            mask = (mask | (cols[None, None, :] == slots[:, :, None]))[:, None]
            hidden = self._run(d, tok, hidden, pos0, self.k[d, :b], self.v[d, :b], slots, mask)
            if d == 0:
                out0 = hidden[:, -1:]
        return out0

    def propose(self, ctx):
        b, kv, roots, k, head = ctx.rows, ctx.kv, ctx.roots, self.topk, self.head
        parent_out = self._feed(b, kv)
        length = self.length[:b]
        cols = torch.arange(kv + self._room())
        target_ids = head.target_ids()
        pool = pool_tok, pool_score, pool_parent = self.pool.buffers(b, roots.device)
        front_tok, front_score, parent, front_pool = topk_expand(
            head.logits(parent_out), self.pool.zero_score[:b], self.pool.no_parent[:b], k, target_ids,
            pool_tok[:, :k], pool_score[:, :k], pool_parent[:, :k], 0, None, None, kv, 0)[:4]
        hidden = parent_out.expand(b, k, -1)
        pos = (length - 1).clamp(min=0)[:, None].expand(b, k)
        slots = kv + torch.arange(k).expand(b, k)
        off = k
        for d in range(1, self.steps):
            known = cols[None, None, :] <= (length - 1 - d)[:, None, None]
            mask = (known | (cols[None, None, :] == slots[:, :, None]))[:, None]
            out = self._run(d, front_tok, hidden, pos, self.k[d, :b], self.v[d, :b], slots, mask)
            n = k * k
            front_tok, front_score, parent, front_pool = topk_expand(
                head.logits(out), front_score, front_pool, k, target_ids, pool_tok[:, off: off + n],
                pool_score[:, off: off + n], pool_parent[:, off: off + n], off, None, None, kv, 0)[:4]
            hidden = out.gather(1, parent[:, :, None].expand(-1, -1, out.shape[-1]))
            off += n
        return self.pool.tree(roots, pool)


@pytest.fixture(scope="module")
def target():
    return make_target(seed=0, vocab=VOCAB, max_positions=128)


@pytest.fixture(scope="module")
def head(target):
    return train_head(target, TRAIN, kind="mtp", num_modules=4)


def per_step(target, head, drafter_class, prompts, new_tokens, fused=False, **engine_args):
    engine = SpecEngine(target, head, max_len=64, **engine_args)
    engine.drafter.__class__ = drafter_class
    if fused:  # the fused kernels, as on CUDA (the engine fuses on CUDA only)
        engine.drafter.prepare(torch.device("cpu"))
    results = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    return [(r.token_ids, r.steps, r.accepted_tokens) for r in results]


SHAPES = {"chain": dict(num_steps=3, topk=1), "tree": dict(num_steps=3, topk=3, num_draft_tokens=8),
          "every module": dict(num_steps=4, topk=2, num_draft_tokens=6)}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("max_batch", [1, 4])
def test_one_call_per_module_drafts_as_module_by_module(target, head, shape, max_batch):
    ours = per_step(target, head, MTPDrafter, TRAIN[:8], 30, max_batch=max_batch, **SHAPES[shape])
    reference = per_step(target, head, ModuleByModule, TRAIN[:8], 30, max_batch=max_batch, **SHAPES[shape])
    assert ours == reference
    assert sum(r[2] for r in ours) > 0  # drafts were accepted: the comparison sees the drafts


@needs_triton
def test_one_call_per_module_on_the_triton_kernels(target, monkeypatch):
    head = train_head(target, TRAIN, kind="mtp", num_modules=3)  # its own: fusing changes the head
    interpret_triton(monkeypatch)
    args = dict(max_batch=2, fused=True, **SHAPES["tree"])
    ours = per_step(target, head, MTPDrafter, TRAIN[:2], 8, **args)
    assert head.fused
    assert ours == per_step(target, head, ModuleByModule, TRAIN[:2], 8, **args)
    assert sum(r[2] for r in ours) > 0


@needs_triton
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_parent_rows_read_in_place_equal_gathered_inputs(kind, monkeypatch):
    """A depth's input read at its parents' rows inside the input kernel (EAGLE-1: the plain
    [embedding; feature], MTP: the normed pair) equals the input gathered first."""
    target = make_target(seed=1, vocab=VOCAB, max_positions=128)  # its own: fusing changes it
    head = train_head(target, TRAIN[:4], steps=5, kind=kind, **({"num_modules": 2} if kind == "mtp" else {}))
    interpret_triton(monkeypatch)
    from specheads.kernels import fused

    target.fuse_for_inference()
    if kind == "eagle":
        head.attach_target(target)
    head.fuse_for_inference()
    g = torch.Generator().manual_seed(0)
    b, t, n_out, width = 2, 3, 5, 12
    cfg = head.config
    hidden = torch.randn(b, n_out, cfg.hidden_size, generator=g)
    rows = torch.tensor([[4, 0, 4], [1, 3, 2]])
    tokens = torch.randint(0, VOCAB, (b, t), generator=g)
    positions = torch.tensor([[7, 7, 7], [9, 9, 9]])
    slots = torch.tensor([[9, 10, 11], [9, 10, 11]])
    mask = (torch.arange(width)[None, None, :] < 8) | (torch.arange(width)[None, None, :] == slots[:, :, None])
    gathered = hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1]))
    outs = []
    for inputs, r in ((hidden, rows), (gathered, None)):
        k_cache = torch.zeros(b, cfg.num_key_value_heads, width, cfg.head_dim)
        v_cache = torch.zeros_like(k_cache)
        args = (tokens, target.model.embed_tokens.weight, inputs, positions, k_cache, v_cache, slots, mask[:, None])
        outs.append(head.draft(*args, rows=r) if kind == "eagle" else head.draft(0, *args, rows=r))
    assert fused.use_triton(hidden)
    assert torch.equal(outs[0], outs[1])
