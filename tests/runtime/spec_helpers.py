"""Builders for the speculative-runtime tests: tiny random targets held in memory, EAGLE-3
heads (random or trained a few dozen steps), and duck-typed drafters that know the answer.

Everything is float32 on CPU and small (hidden 32, 4 layers, vocab 16..64).
"""

from __future__ import annotations

import random

import torch

from specheads.drafters import DraftContext, Drafter, Needs
from specheads.runtime.tree import Tree

HIDDEN = 32
LAYERS = 4


def make_target(seed: int = 0, vocab: int = 64, layers: int = LAYERS, max_positions: int = 128,
                std: float = 0.5, hidden: int = HIDDEN):
    """A Llama TargetModel with every matrix re-drawn from normal(0, std): a large std gives
    confident, non-degenerate greedy continuations (no single token repeated forever)."""
    from transformers import LlamaConfig

    from specheads.target.model import TargetModel

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=max_positions,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = TargetModel(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval().requires_grad_(False)


def random_head(target, seed: int = 0, draft_vocab: int | None = None, kind: str = "eagle3", **overrides):
    """A head of any registered kind with its initial (random) weights."""
    from specheads.heads.registry import head_kind

    torch.manual_seed(seed)
    entry = head_kind(kind)
    cfg = entry.config.for_target(target, draft_vocab_size=draft_vocab or target.spec.vocab_size, **overrides)
    return entry.module(cfg).eval().requires_grad_(False)


def random_prompts(n: int, vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(length),), generator=g).tolist() for length in lengths][:n]


def train_head(target, prompts: list[list[int]], new_tokens: int = 40, steps: int = 60, lr: float = 1e-2,
               draft_vocab: int = 48, seed: int = 0, kind: str = "eagle3", **overrides):
    """An EAGLE-3 head trained with the library's TTT loss on the target's own greedy
    continuations of `prompts` (so it has seen what it will be asked to draft). The draft
    vocab is a subset of the target's (the tokens those continuations use first), so the
    d2t map is exercised too."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.heads.registry import head_kind

    outs = SpecEngine(target, method="ar", max_len=max(len(p) for p in prompts) + new_tokens).generate(
        prompts, SamplingParams(max_new_tokens=new_tokens))
    seqs = [p + r.token_ids for p, r in zip(prompts, outs)]
    counts: dict[int, int] = {}
    for s in seqs:
        for t in s:
            counts[t] = counts.get(t, 0) + 1
    vocab = target.spec.vocab_size
    draft_vocab = min(draft_vocab, vocab)
    ranked = sorted(counts, key=lambda t: -counts[t]) + [t for t in range(vocab) if t not in counts]
    keep = torch.tensor(sorted(ranked[:draft_vocab]))
    head = random_head(target, seed, draft_vocab=draft_vocab, kind=kind, **overrides).train().requires_grad_(True)
    entry = head_kind(kind)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    head.set_vocab_map(keep - torch.arange(draft_vocab), t2d)
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p): len(s)] = 1
    with torch.no_grad():
        out = target(ids, capture_layers=head.config.target_layer_ids, return_logits=False)
    teacher = target.lm_head.weight[head.target_rows()]
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        outputs = entry.unroll(head, target.embed_tokens, ids, out.aux_hidden, 3)
        stats = entry.loss(head, target.embed_tokens, ids, mask, out.aux_hidden, out.hidden, teacher, steps=3,
                           outputs=outputs)
        opt.zero_grad()
        stats.loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


# ------------------------------------------------------------------ duck-typed drafters
class _DrafterBase(Drafter):
    """A host drafter for tests: proposes from the token histories before each step."""

    needs = Needs(history=True)


def ar_tokens(target, prompts: list[list[int]], new_tokens: int, max_len: int = 64) -> list[list[int]]:
    """Each prompt's greedy tokens from plain decoding (`ar`): what every drafting method must emit."""
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams

    return [r.token_ids for r in SpecEngine(target, method="ar", max_len=max_len).generate(
        prompts, SamplingParams(max_new_tokens=new_tokens))]


def assert_targets_logprobs(target, prompt: list[int], tokens: list[int], logprobs: list, top: int) -> None:
    """Each emitted token's log-probability and its `top` alternatives (as the engine reports them:
    (logprob, [(token, logprob), ...]) a token) are the target's own raw distribution at that position,
    as a plain forward over the prompt and the tokens computes it."""
    import pytest

    with torch.no_grad():
        ref = torch.log_softmax(target(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    for j, (tok, (lp, alts)) in enumerate(zip(tokens, logprobs)):
        pos = len(prompt) - 1 + j  # the position whose logits drew token j
        assert lp == pytest.approx(ref[pos, tok].item(), abs=1e-4)
        want = ref[pos].topk(top)
        assert [t for t, _ in alts] == want.indices.tolist()
        assert [v for _, v in alts] == pytest.approx(want.values.tolist(), abs=1e-4)


def run_joining(engine, prompts: list[list[int]], budgets: list[int]) -> list[list[int]]:
    """Greedy requests added while rows are free and stepped until all finish (rows leave at
    different steps and the last row moves into the freed one); each request's tokens, in order."""
    from specheads.runtime.engine import Request
    from specheads.runtime.sampling import SamplingParams

    todo, got, order = list(zip(prompts, budgets)), {}, []
    while engine.has_work or todo:
        while todo and engine.free_slots:
            p, n = todo.pop(0)
            h = engine.add(Request(p, SamplingParams(max_new_tokens=n)))
            got[h] = []
            order.append(h)
        for out in engine.step():
            got[out.handle] += out.new_tokens
    return [got[h] for h in order]


def tree_from_nodes(rows: list[list[tuple[int, int]]], roots: torch.Tensor) -> Tree:
    """rows[b] = [(parent index, token), ...] for nodes 1..N (node 0 is the root)."""
    tokens, parents, depth = [], [], []
    for nodes, root in zip(rows, roots.tolist()):
        assert len(nodes) == len(rows[0])
        tok, par, dep = [root], [-1], [0]
        for j, (p, t) in enumerate(nodes, start=1):
            assert 0 <= p < j, "parents come before their children"
            tok.append(t)
            par.append(p)
            dep.append(dep[p] + 1)
        tokens.append(tok)
        parents.append(par)
        depth.append(dep)
    dev = roots.device
    t = torch.tensor(tokens, device=dev)
    d = torch.tensor(depth, device=dev)
    return Tree(t, torch.tensor(parents, device=dev), d, torch.ones(t.shape, dtype=torch.bool, device=dev),
                int(d.max()))


class OracleDrafter(_DrafterBase):
    """Knows each prompt's greedy output; proposes a 3-level tree with 3 siblings per level
    on the correct path (the correct child at a random sibling rank), plus one wrong child
    under every wrong level-1 node, in a random parents-first order. Every step can accept
    3 drafts + the bonus token.

    race=True: a fixed order where the accepted path is nodes [0, 2, 3, 4]: the root's
    correct child comes after a wrong sibling, so src[j] > j and src[1], src[2] are the
    destinations of path entries 2 and 3 (a kernel that stores before every load has
    finished would copy the wrong entries)."""

    LEVELS = 3
    SIBLINGS = 3

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], vocab: int, seed: int = 0,
                 race: bool = False):
        self.full = [list(p) + list(o) for p, o in zip(prompts, outputs)]
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.race = race
        self.num_draft = self.LEVELS * self.SIBLINGS + (self.SIBLINGS - 1)
        self.depth = self.LEVELS
        self.paths: list[list[int]] = []  # the node indices of the correct path, per proposed row

    def _truth(self, history: list[int]) -> list[int]:
        for seq in self.full:
            if seq[: len(history)] == history:
                nxt = seq[len(history): len(history) + self.LEVELS]
                return nxt + [self.rng.randrange(self.vocab) for _ in range(self.LEVELS - len(nxt))]
        raise AssertionError(f"history {history} is no prefix of a known output")

    def _wrong(self, right: int, n: int) -> list[int]:
        return self.rng.sample([t for t in range(self.vocab) if t != right], n)

    def propose(self, ctx: DraftContext) -> Tree:
        histories, roots = ctx.histories, ctx.roots
        rows = []
        self.paths = []
        for hist in histories:
            truth = self._truth(list(hist))
            nodes, path = (self._race_nodes if self.race else self._random_nodes)(truth)
            rows.append(nodes)
            self.paths.append(path)
        return tree_from_nodes(rows, roots)

    def _race_nodes(self, truth):
        c1, c2, c3 = truth
        w1a, w1b = self._wrong(c1, 2)
        w2 = self._wrong(c2, 2)
        w3 = self._wrong(c3, 2)
        nodes = [(0, w1a), (0, c1), (2, c2), (3, c3), (0, w1b), (1, self.rng.randrange(self.vocab)),
                 (5, self.rng.randrange(self.vocab)), (2, w2[0]), (2, w2[1]), (3, w3[0]), (3, w3[1])]
        return nodes, [0, 2, 3, 4]

    def _random_nodes(self, truth):
        # abstract nodes 1..: (abstract parent, token); abstract 0 is the root
        spec: list[tuple[int, int]] = []
        path_abstract = [0]
        parent = 0
        for level, right in enumerate(truth):
            rank = self.rng.randrange(self.SIBLINGS)
            toks = self._wrong(right, self.SIBLINGS - 1)
            toks.insert(rank, right)
            ids = []
            for t in toks:
                spec.append((parent, t))
                ids.append(len(spec))
            if level == 0:  # one wrong grandchild under each wrong first-level node
                for k in range(self.SIBLINGS):
                    if k != rank:
                        spec.append((ids[k], self.rng.randrange(self.vocab)))
            parent = ids[rank]
            path_abstract.append(parent)
        # a random parents-first order of the abstract nodes
        placed = {0: 0}
        order = []
        pending = list(range(1, len(spec) + 1))
        while pending:
            ready = [a for a in pending if spec[a - 1][0] in placed]
            a = self.rng.choice(ready)
            pending.remove(a)
            placed[a] = len(order) + 1
            order.append(a)
        nodes = [(placed[spec[a - 1][0]], spec[a - 1][1]) for a in order]
        return nodes, [placed[a] for a in path_abstract]


class TopDrafter(_DrafterBase):
    """Proposes the target's own most likely tokens: `widths[0]` children of the root, then
    `widths[1]` under each of those, ... (a strong drafter, so sampled runs accept often).
    Computed with plain full forwards of the target over each history."""

    def __init__(self, target, widths=(4, 2)):
        self.target = target
        self.widths = widths
        n, level = 0, 1
        for w in widths:
            level *= w
            n += level
        self.num_draft = n
        self.depth = len(widths)
        self._cache: dict[tuple, list[int]] = {}

    def _top(self, seqs: list[tuple], k: int) -> list[list[int]]:
        todo = sorted({s for s in seqs if (s, k) not in self._cache})
        if todo:
            width = max(len(s) for s in todo)
            ids = torch.zeros(len(todo), width, dtype=torch.long)
            for i, s in enumerate(todo):
                ids[i, : len(s)] = torch.tensor(s)
            with torch.no_grad():
                logits = self.target(ids).logits
            last = torch.tensor([len(s) - 1 for s in todo])
            top = logits[torch.arange(len(todo)), last].topk(k, dim=-1).indices.tolist()
            for s, t in zip(todo, top):
                self._cache[(s, k)] = t
        return [self._cache[(s, k)] for s in seqs]

    def propose(self, ctx: DraftContext) -> Tree:
        histories, roots = ctx.histories, ctx.roots
        rows = []
        for hist in histories:
            nodes = []
            frontier = [(0, tuple(hist))]  # (node index, sequence up to and including it)
            for w in self.widths:
                tops = self._top([s for _, s in frontier], w)
                nxt = []
                for (idx, seq), toks in zip(frontier, tops):
                    for t in toks:
                        nodes.append((idx, t))
                        nxt.append((len(nodes), seq + (t,)))
                frontier = nxt
            rows.append(nodes)
        return tree_from_nodes(rows, roots)
