"""Drafters propose a tree per sequence; the engine verifies it on the target.

- Eagle3Drafter: the EAGLE-3 head with the EAGLE-2 dynamic tree (topk 1 = chain) or a
  static tree shape; it keeps its own KV cache of committed entries.
- NgramDrafter: prompt lookup, no model.
"""

from __future__ import annotations

import torch

from specheads.runtime.tree import Tree, chain_tree, parse_static_tree


class NgramDrafter:
    def __init__(self, num_draft_tokens: int = 8, max_ngram: int = 3):
        self.n = num_draft_tokens
        self.depth = num_draft_tokens
        self.max_ngram = max_ngram

    def reset(self, *_args, **_kwargs) -> None:
        pass

    def select(self, keep: torch.Tensor) -> None:
        pass

    def propose(self, histories: list[list[int]], roots: torch.Tensor) -> Tree:
        b = len(histories)
        drafts = torch.zeros(b, self.n, dtype=torch.long)
        valid = torch.zeros(b, self.n, dtype=torch.bool)
        for i, seq in enumerate(histories):  # host-side lookup over each row's history
            cont = self._lookup(seq)
            drafts[i, : len(cont)] = torch.as_tensor(cont, dtype=torch.long)
            valid[i, : len(cont)] = True
        dev = roots.device
        return chain_tree(roots, drafts.to(dev), valid.to(dev))

    def _lookup(self, seq: list[int]) -> list[int]:
        """The continuation of the most recent earlier match of the longest suffix (n-gram);
        a match too close to the end to fill the window loses to an older one that does."""
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            suffix = seq[-n:]
            best: list[int] = []
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    # the continuation may run into the suffix itself: copy forward, overlapping
                    cont: list[int] = []
                    for i in range(self.n):
                        j = start + n + i
                        cont.append(seq[j] if j < len(seq) else cont[j - len(seq)])
                    if len(cont) > len(best):
                        best = cont
                    if len(best) == self.n:
                        break
            if best:
                return best
        return []

    def commit(self, *_args, **_kwargs) -> None:
        pass


class Eagle3Drafter:
    def __init__(self, head, embed, num_steps: int = 5, topk: int = 4, num_draft_tokens: int = 16,
                 static_tree=None):
        self.head, self.embed = head, embed
        self.steps = num_steps
        self.topk = topk
        self.static = parse_static_tree(static_tree) if static_tree else None
        if self.static:
            self.steps = max(len(p) for p in self.static)
            self.num_draft = len(self.static)
        else:
            self.num_draft = min(num_draft_tokens, topk + (num_steps - 1) * topk * topk)
            if topk == 1:
                self.num_draft = num_steps
        cfg = head.config
        self.n_kv, self.head_dim = cfg.num_key_value_heads, cfg.head_dim
        self.depth = self.steps

    # ................................................................. state
    def reset(self, batch: int, max_len: int, device, dtype) -> None:
        shape = (batch, self.n_kv, max_len, self.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.committed = torch.zeros(batch, dtype=torch.long, device=device)  # entries in the cache
        self.committed_host = [0] * batch  # the same, on the host: cache widths need no sync
        self.pending_aux = self.pending_tok = self.pending_n = None
        self.pending_host = [0] * batch

    def select(self, keep: torch.Tensor) -> None:
        self.k, self.v, self.committed = self.k[keep], self.v[keep], self.committed[keep]
        idx = keep.tolist()
        self.committed_host = [self.committed_host[i] for i in idx]
        self.pending_host = [self.pending_host[i] for i in idx]
        self.pending_aux, self.pending_tok, self.pending_n = (
            self.pending_aux[keep], self.pending_tok[keep], self.pending_n[keep])

    def commit(self, aux: torch.Tensor, next_tokens: torch.Tensor, count: torch.Tensor, count_host: list[int]) -> None:
        """New committed target positions: their captured features [B, P, 3H], the token that
        follows each [B, P], and how many are real per row [B] (also as a host list)."""
        self.pending_aux, self.pending_tok, self.pending_n = aux, next_tokens, count
        self.pending_host = list(count_host)

    # ................................................................. drafting
    def _feed(self) -> torch.Tensor:
        """Run the pending entries through the head, store their K/V; returns the hidden of
        each row's last entry [B, 1, H] (it predicts the token after the root)."""
        head = self.head
        b, p, _ = self.pending_aux.shape
        dev = self.pending_aux.device
        dtype = self.k.dtype
        start = self.committed
        ar = torch.arange(p, device=dev)
        positions = start[:, None] + ar
        ctx_len = max(self.committed_host)
        ctx_mask = torch.arange(ctx_len, device=dev)[None, None, :] < start[:, None, None]
        own = (ar[None, :, None] >= ar[None, None, :]) & (ar[None, None, :] < self.pending_n[:, None, None])
        mask = torch.cat([ctx_mask.expand(b, p, ctx_len), own.expand(b, p, p)], 2)[:, None]
        hidden = head.fc(self.pending_aux.to(dtype))
        out, k, v = head.step(self.embed(self.pending_tok).to(dtype), hidden, positions,
                              self.k[:, :, :ctx_len], self.v[:, :, :ctx_len], attn_mask=mask)
        idx = positions[:, None, :, None].expand(b, self.n_kv, p, self.head_dim)
        self.k.scatter_(2, idx, k)
        self.v.scatter_(2, idx, v)
        self.committed = start + self.pending_n
        self.committed_host = [c + n for c, n in zip(self.committed_host, self.pending_host)]
        last = (self.pending_n - 1).clamp(min=0)
        return out.gather(1, last[:, None, None].expand(b, 1, out.shape[-1]))

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head.logits(hidden).float(), dim=-1)

    def propose(self, histories, roots: torch.Tensor) -> Tree:
        head = self.head
        h_last = self._feed()
        b = roots.shape[0]
        dev = roots.device
        dtype = self.k.dtype
        base = self.committed  # == target committed length L
        ctx_len = max(self.committed_host)
        ctx_mask = torch.arange(ctx_len, device=dev)[None, None, :] < base[:, None, None]

        # frontier state: parent hidden, token, ancestor bits over tree entries so far
        logp = self._log_probs(h_last)[:, 0]  # [B, Vd]
        k_first = self.topk if not self.static else 1 + max(p[0] for p in self.static)
        top_lp, top_id = logp.topk(k_first, dim=-1)
        pool_tok, pool_score, pool_parent, pool_depth = [], [], [], []
        if self.static:
            return self._static(h_last, top_id, ctx_mask, base, roots)
        pool_tok.append(head.draft_to_target(top_id))
        pool_score.append(top_lp)
        pool_parent.append(torch.full_like(top_id, -1))
        pool_depth.append(torch.ones_like(top_id))
        front_tok, front_score = pool_tok[0], top_lp
        front_hidden = h_last.expand(b, self.topk, -1)
        front_pool = torch.arange(self.topk, device=dev).expand(b, -1)
        front_anc = torch.zeros(b, self.topk, 0, dtype=torch.bool, device=dev)
        tree_k, tree_v = [], []
        n_pool = self.topk
        for d in range(1, self.steps):
            own = torch.eye(self.topk, dtype=torch.bool, device=dev).expand(b, -1, -1)
            mask = torch.cat([ctx_mask.expand(b, self.topk, ctx_len), front_anc, own], 2)[:, None]
            k_ctx = torch.cat([self.k[:, :, :ctx_len]] + tree_k, 2)
            v_ctx = torch.cat([self.v[:, :, :ctx_len]] + tree_v, 2)
            positions = (base - 1 + d)[:, None].expand(b, self.topk)
            tok_in = front_tok
            out, k, v = head.step(self.embed(tok_in).to(dtype), front_hidden, positions, k_ctx, v_ctx, attn_mask=mask)
            tree_k.append(k)
            tree_v.append(v)
            lp, ids = self._log_probs(out).topk(self.topk, dim=-1)  # [B, K, K]
            scores = (front_score[:, :, None] + lp).reshape(b, -1)
            child_tok = head.draft_to_target(ids).reshape(b, -1)
            parent_front = torch.arange(self.topk, device=dev).repeat_interleave(self.topk).expand(b, -1)
            pool_tok.append(child_tok)
            pool_score.append(scores)
            pool_parent.append(front_pool.gather(1, parent_front))
            pool_depth.append(torch.full_like(child_tok, d + 1))
            # next frontier: the best K children by cumulative log-probability
            best = scores.topk(self.topk, dim=-1).indices
            par = best // self.topk
            entry_bits = torch.cat([front_anc, own], 2)  # ancestors of this depth's entries + themselves
            front_anc = entry_bits.gather(1, par[:, :, None].expand(-1, -1, entry_bits.shape[2]))
            front_hidden = out.gather(1, par[:, :, None].expand(-1, -1, out.shape[-1]))
            front_tok = child_tok.gather(1, best)
            front_score = scores.gather(1, best)
            front_pool = n_pool + best
            n_pool += scores.shape[1]
        return self._select(roots, torch.cat(pool_tok, 1), torch.cat(pool_score, 1), torch.cat(pool_parent, 1),
                            torch.cat(pool_depth, 1))

    def _select(self, roots, tok, score, parent, depth) -> Tree:
        """The best num_draft nodes by cumulative log-probability; parents precede children."""
        b, n_pool = tok.shape
        n = self.num_draft
        # ties: prefer shallower, then earlier nodes, so a parent always outranks its child
        order_key = score.double() - 1e-9 * torch.arange(n_pool, device=tok.device)
        chosen = order_key.topk(n, dim=-1).indices.sort(dim=-1).values  # pool order = depth order
        pos_in_tree = torch.full((b, n_pool), -1, dtype=torch.long, device=tok.device)
        pos_in_tree.scatter_(1, chosen, torch.arange(1, n + 1, device=tok.device).expand(b, -1))
        par_pool = parent.gather(1, chosen)
        par_tree = torch.where(par_pool < 0, torch.zeros_like(par_pool),
                               pos_in_tree.gather(1, par_pool.clamp(min=0)))
        valid = par_tree >= 0
        tokens = torch.cat([roots[:, None], tok.gather(1, chosen)], 1)
        parents = torch.cat([torch.full_like(roots[:, None], -1), par_tree.clamp(min=0)], 1)
        depths = torch.cat([torch.zeros_like(roots[:, None]), depth.gather(1, chosen)], 1)
        ok = torch.cat([torch.ones_like(valid[:, :1]), valid], 1)
        return Tree(tokens, parents, depths, ok, self.steps)

    def _static(self, h_last, top_id, ctx_mask, base, roots) -> Tree:
        """Fixed tree shape: node p's token is the rank-p[-1] token of its parent's draft."""
        head, paths = self.head, self.static
        b = h_last.shape[0]
        dev = h_last.device
        dtype = self.k.dtype
        index = {p: i for i, p in enumerate(paths)}
        tokens = torch.zeros(b, len(paths), dtype=torch.long, device=dev)
        hidden_of = {}
        first = [i for i, p in enumerate(paths) if len(p) == 1]
        for i in first:
            tokens[:, i] = head.draft_to_target(top_id[:, paths[i][0]])
        tree_k, tree_v, entry_of = [], [], []
        ctx_len = ctx_mask.shape[-1]
        for d in range(1, self.steps):
            level = [i for i, p in enumerate(paths) if len(p) == d]
            kids = [i for i, p in enumerate(paths) if len(p) == d + 1]
            if not kids:
                break
            m = len(level)
            prev = len(entry_of)
            anc = torch.zeros(m, prev + m, dtype=torch.bool, device=dev)
            for r, i in enumerate(level):
                for a in range(1, d):
                    anc[r, entry_of.index(index[paths[i][:a]])] = True
                anc[r, prev + r] = True
            mask = torch.cat([ctx_mask.expand(b, m, ctx_len), anc.expand(b, m, prev + m)], 2)[:, None]
            parent_hidden = torch.stack([hidden_of.get(paths[i][:-1], h_last[:, 0]) for i in level], 1)
            positions = (base - 1 + d)[:, None].expand(b, m)
            out, k, v = head.step(self.embed(tokens[:, level]).to(dtype), parent_hidden, positions,
                                  torch.cat([self.k[:, :, :ctx_len]] + tree_k, 2),
                                  torch.cat([self.v[:, :, :ctx_len]] + tree_v, 2), attn_mask=mask)
            tree_k.append(k)
            tree_v.append(v)
            entry_of += level
            ranks = 1 + max(paths[i][-1] for i in kids)
            ids = self._log_probs(out).topk(ranks, dim=-1).indices  # [B, m, ranks]
            for r, i in enumerate(level):
                hidden_of[paths[i]] = out[:, r]
            for i in kids:
                r = level.index(index[paths[i][:-1]])
                tokens[:, i] = head.draft_to_target(ids[:, r, paths[i][-1]])
        parents = [0 if len(p) == 1 else 1 + index[p[:-1]] for p in paths]
        return Tree(
            torch.cat([roots[:, None], tokens], 1),
            torch.tensor([-1] + parents, device=dev).expand(b, -1).clone(),
            torch.tensor([0] + [len(p) for p in paths], device=dev).expand(b, -1).clone(),
            torch.ones(b, len(paths) + 1, dtype=torch.bool, device=dev),
            self.steps,
        )
