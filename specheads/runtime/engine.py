"""The speculative engine: draft a tree, verify it in one target forward, accept, commit.

One step for a batch of B sequences (row b has L_b committed tokens in the target cache
and a root token, the last emitted one, not yet in it):
  draft   the drafter proposes a tree of N nodes under each root;
  verify  one target forward over [root + N nodes] at positions L_b + depth, written to
          cache slots L_b + node index, under the tree mask on top of the prefix;
  accept  at every node the target picks its token y (argmax, or a sample of its own
          warped distribution); from the root, follow the child whose token is y while one
          exists. The last node's y is the bonus token. Every emitted token is the
          target's own choice, so greedy output equals plain decoding and sampled output
          follows the target's distribution (lossless);
  commit  the accepted path's KV entries move to slots L_b.. (Triton), the drafter gets
          the path's captured features.
One host sync per step (the accept lengths).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specheads.kernels.kv_commit import commit_kv
from specheads.runtime.drafters import Eagle3Drafter, NgramDrafter
from specheads.runtime.generate import generate_batch
from specheads.runtime.graphs import GraphedForward, compact_rows
from specheads.runtime.sampling import SamplingParams, sample
from specheads.target.model import KVCache

METHODS = ("eagle3", "ngram", "ar")


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    steps: int = 0
    accepted_tokens: int = 0  # draft tokens accepted
    accept_per_position: list = field(default_factory=list)

    @property
    def mean_accept_length(self) -> float:
        return len(self.token_ids) / self.steps if self.steps else 0.0


class EngineError(ValueError):
    pass


class SpecEngine:
    def __init__(self, target, head=None, method: str = "eagle3", num_steps: int = 5, topk: int = 4,
                 num_draft_tokens: int = 16, static_tree=None, max_len: int | None = None, use_graphs: bool | None = None):
        if method not in METHODS:
            raise EngineError(f"method {method!r} is not one of {', '.join(METHODS)}")
        self.target = target
        self.method = method
        self.layer_ids = None
        if method == "eagle3":
            if head is None:
                raise EngineError("method eagle3 needs a draft head (--draft)")
            check_head_matches(head, target)
            self.layer_ids = head.config.target_layer_ids
            self.drafter = Eagle3Drafter(head, target.embed_tokens, num_steps, topk, num_draft_tokens, static_tree)
        elif method == "ngram":
            self.drafter = NgramDrafter(num_draft_tokens)
        # a tree verified at the cache's end reaches `depth` positions past it
        drafter = getattr(self, "drafter", None)
        depth = drafter.depth if drafter is not None else 0
        limit = target.rotary.max_positions - (depth + 1 if drafter is not None else 0)
        if max_len is not None and max_len > limit:
            raise EngineError(
                f"max_len {max_len} is too long: the target has {target.rotary.max_positions} positions and a draft "
                f"tree reaches {depth + 1} past the last token, so at most {limit}"
            )
        # default: the target's context, capped so a batch's cache stays modest
        self.max_len = max_len or min(limit, 4096)
        self.device = target.model.embed_tokens.weight.device
        self.dtype = target.model.embed_tokens.weight.dtype
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs

    # ------------------------------------------------------------------ public
    def generate(self, prompts: list[list[int]], params: SamplingParams, stop_ids=()) -> list[GenerationResult]:
        params.validate()
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise EngineError(f"prompt {i} is empty")
            if len(p) >= self.max_len:
                raise EngineError(f"prompt {i} has {len(p)} tokens; the cache holds {self.max_len} (prompt + output)")
        budgets = [min(params.max_new_tokens, self.max_len - len(p)) for p in prompts]
        if self.method == "ar":
            return self._ar(prompts, params, stop_ids, budgets)
        return self._speculate(prompts, params, set(stop_ids), budgets)

    # ------------------------------------------------------------------ ar
    def _ar(self, prompts, params, stop_ids, budgets):
        out = []
        for budget in sorted(set(budgets)):  # rows with the same budget decode together
            rows = [i for i, b in enumerate(budgets) if b == budget]
            p = SamplingParams(**{**params.__dict__, "max_new_tokens": budget})
            toks = generate_batch(self.target, [prompts[i] for i in rows], p, stop_ids, use_graphs=self.use_graphs)
            out += list(zip(rows, toks))
        res = [None] * len(prompts)
        for i, toks in out:
            reason = "length" if len(toks) >= budgets[i] else "stop"
            res[i] = GenerationResult(toks, reason, steps=len(toks) + (reason == "stop"))
        return res

    # ------------------------------------------------------------------ speculative
    @torch.no_grad()
    def _speculate(self, prompts, params, stops, budgets):
        dev = self.device
        b = len(prompts)
        tree_nodes = 1 + getattr(self.drafter, "num_draft", getattr(self.drafter, "n", 0))
        cap = self.max_len + tree_nodes + 2  # room to verify a full tree at the end, + a spare slot
        cache = KVCache(self.target.spec, b, cap, self.dtype, dev)
        self.verify_graph = (GraphedForward(self.target, cache, tree_nodes, self.layer_ids or (), tree=True)
                             if self.use_graphs else None)
        generator = torch.Generator(device=dev).manual_seed(params.seed) if params.seed is not None else None
        if isinstance(self.drafter, Eagle3Drafter):
            self.drafter.reset(b, cap, dev, self.dtype)

        # prefill: the prompt, its first token, the drafter's first entries
        lengths = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lengths.max())
        ids = torch.zeros(b, width, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.as_tensor(p, device=dev)
        pos = torch.arange(width, device=dev).expand(b, width)
        out = self.target(ids, pos, cache=cache, kv_len=width, prefill=True, capture_layers=self.layer_ids or (),
                          logits_positions=(lengths - 1)[:, None])
        root = sample(out.logits[:, 0], params, generator)
        if isinstance(self.drafter, Eagle3Drafter):
            nxt = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
            nxt.scatter_(1, (lengths - 1)[:, None], root[:, None])
            self.drafter.commit(out.aux_hidden, nxt, lengths, [len(p) for p in prompts])

        rows = list(range(b))  # original index of each live row
        emitted = [[] for _ in range(b)]
        histories = [list(p) for p in prompts]
        steps = [0] * b
        accepted = [0] * b
        per_pos = [[0] * tree_nodes for _ in range(b)]
        reasons = [None] * b
        committed = lengths.clone()
        committed_host = [len(p) for p in prompts]
        root_cpu = root.tolist()
        for r in range(b):
            self._emit(r, [root_cpu[r]], emitted, histories, budgets, stops, reasons)
        while True:
            live = [i for i, r in enumerate(rows) if reasons[r] is None]
            if not live:
                break
            if len(live) < len(rows):  # finished sequences leave the batch (in place: graphs keep their cache)
                keep = torch.tensor(live, device=dev)
                compact_rows([cache.k, cache.v], keep, dim=1)
                committed, root = committed[keep], root[keep]
                committed_host = [committed_host[i] for i in live]
                self.drafter.select(keep)
                rows = [rows[i] for i in live]
            tree = self.drafter.propose([histories[r] for r in rows], root)
            path, n_acc, bonus, aux = self._verify(tree, cache, committed, max(committed_host), params, generator)
            for tensor in (cache.k, cache.v):  # rows past the live batch are stale after compaction
                commit_kv(tensor[:, : len(rows)], committed, path, n_acc)
            path_tokens = tree.tokens.gather(1, path.clamp(min=0))
            if isinstance(self.drafter, Eagle3Drafter):
                path_aux = aux.gather(1, path.clamp(min=0)[:, :, None].expand(-1, -1, aux.shape[-1]))
                nxt = torch.cat([path_tokens[:, 1:], torch.zeros_like(path_tokens[:, :1])], 1)
                nxt.scatter_(1, (n_acc - 1)[:, None], bonus[:, None])
            committed = committed + n_acc
            root = bonus
            # the one host sync of the step
            n_cpu, toks_cpu, bonus_cpu = n_acc.tolist(), path_tokens.tolist(), bonus.tolist()
            committed_host = [c + n for c, n in zip(committed_host, n_cpu)]
            if isinstance(self.drafter, Eagle3Drafter):
                self.drafter.commit(path_aux, nxt, n_acc, n_cpu)
            for i, r in enumerate(rows):
                n = n_cpu[i]
                steps[r] += 1
                accepted[r] += n - 1
                for k in range(1, n):
                    per_pos[r][k] += 1
                self._emit(r, toks_cpu[i][1:n] + [bonus_cpu[i]], emitted, histories, budgets, stops, reasons)
        return [GenerationResult(emitted[r], reasons[r], steps[r], accepted[r], per_pos[r]) for r in range(b)]

    def _emit(self, r, new, emitted, histories, budgets, stops, reasons):
        for t in new:
            if t in stops:
                reasons[r] = "stop"
                return
            emitted[r].append(t)
            histories[r].append(t)
            if len(emitted[r]) >= budgets[r]:
                reasons[r] = "length"
                return

    def _verify(self, tree, cache, committed, committed_max: int, params, generator):
        b, n = tree.tokens.shape
        dev = self.device
        positions = committed[:, None] + tree.depth
        slots = committed[:, None] + torch.arange(n, device=dev)
        kv_len = cache.max_len if self.verify_graph is not None else committed_max + n
        mask = torch.arange(kv_len, device=dev)[None, None, :] < committed[:, None, None]
        mask = mask.expand(b, n, kv_len).clone()
        mask.scatter_(2, slots[:, None, :].expand(b, n, n), tree.ancestors())
        if self.verify_graph is not None:
            out = self.verify_graph(tree.tokens, positions, slots, mask[:, None])
        else:
            out = self.target(tree.tokens, positions, cache=cache, kv_len=kv_len, attn_mask=mask[:, None],
                              cache_slots=slots, capture_layers=self.layer_ids or ())
        y = sample(out.logits, params, generator)  # the target's own token at every node
        cur = torch.zeros(b, dtype=torch.long, device=dev)
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        path = [cur]
        for _ in range(tree.max_depth):
            want = y.gather(1, cur[:, None])
            match = (tree.parents == cur[:, None]) & (tree.tokens == want) & tree.valid
            found = match.any(1) & alive
            nxt = match.float().argmax(1)
            cur = torch.where(found, nxt, cur)
            alive = found
            path.append(torch.where(found, nxt, torch.full_like(nxt, -1)))
        path = torch.stack(path, 1)  # [B, depth+1], -1 after the end
        n_acc = (path >= 0).sum(1)
        bonus = y.gather(1, cur[:, None])[:, 0]
        return path, n_acc, bonus, out.aux_hidden


def check_head_matches(head, target) -> None:
    cfg, spec = head.config, target.spec
    problems = []
    if cfg.hidden_size != spec.hidden_size:
        problems.append(f"head hidden size {cfg.hidden_size} differs from the target's embedding width {spec.hidden_size}")
    if cfg.target_hidden_size != spec.hidden_size:
        problems.append(f"head expects target hidden size {cfg.target_hidden_size}, target has {spec.hidden_size}")
    if cfg.vocab_size != spec.vocab_size:
        problems.append(f"head expects vocab {cfg.vocab_size}, target has {spec.vocab_size}")
    if max(cfg.target_layer_ids) >= spec.num_hidden_layers:
        problems.append(f"head reads target layers {cfg.target_layer_ids}, target has {spec.num_hidden_layers}")
    if problems:
        raise EngineError("draft head does not match the target: " + "; ".join(problems))
