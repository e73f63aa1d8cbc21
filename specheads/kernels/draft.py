"""Kernels for the EAGLE draft loop, beside their torch references.

A draft depth used to cost ~40 small launches besides the head's layer: the input embedding,
two norms and a concatenation; a float log-softmax over the draft vocabulary; two top-k
calls (each several kernels); and a dozen gathers, cats and index sums for the frontier.
Two kernels replace them:

  head_input    the head's layer input: RMSNorm(embed[token]) next to RMSNorm(hidden[row])
                ([B, T, 2H]), plus the gathered hidden rows (the layer's residual). The
                hidden row index lets a frontier node read its parent's output in place.
  topk_expand   from the draft logits of N frontier nodes per row: the top-k children of
                each (log-probabilities from a chunked log-sum-exp, never materialized for
                the whole vocabulary), their cumulative scores written straight into the
                candidate pool, and the best k of all N*k children (the next frontier),
                whose tree-attention mask rows are built in place from their parents' rows.

  select_tree   the best n pool nodes by score as a tree in pool order (parents first):
                tokens, parents, depths and score ranks, in one launch instead of ~35.

Ties go to the lower draft id, then to the earlier child (parents precede children), and in
select_tree to the earlier pool node: a child never outscores its parent (log-probabilities
are <= 0), so with this order a chosen node's parent is always chosen.
"""

from __future__ import annotations

import torch

from specheads.kernels.fused import _kernel, gdc_launch_dependents, gdc_wait, pdl_options, triton, use_triton
from specheads.modules import rms_norm

if triton is not None:
    import triton.language as tl

BLOCK_V = 2048  # vocabulary entries per first-stage program


# ---------------------------------------------------------------------------- references
def head_input_reference(tokens, embed_weight, hidden, rows, w_embed, eps_embed, w_hidden, eps_hidden):
    """tokens [B, T]; hidden [B, S, H] (any strides); rows [B, T] indices into S, or None for
    hidden [B, T, H] itself. -> (x [B, T, 2H], the gathered hidden [B, T, H]), in hidden's dtype."""
    emb = embed_weight[tokens].to(hidden.dtype)
    hid = hidden if rows is None else hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return torch.cat([rms_norm(emb, w_embed, eps_embed), rms_norm(hid, w_hidden, eps_hidden)], dim=-1), hid


def topk_expand_reference(logits, front_score, front_pool, k, target_ids, pool_tok, pool_score, pool_parent,
                          pool_base, mask_src=None, mask_dst=None, ctx=0, width=0):
    """logits [B, N, V] of N frontier nodes per row; front_score [B, N] (their cumulative
    log-probabilities), front_pool [B, N] (their pool indices). Writes the N*k children (node n's
    j-th best at n*k + j) into pool_tok (target ids), pool_score, pool_parent ([B, N*k] views).
    Returns the next frontier: (tokens, scores, parent node in 0..N-1, pool index) [B, k] each,
    best first. With mask buffers [B, k, S]: row i of mask_dst gets its parent's
    [ctx, ctx + width) from mask_src and its own bit at ctx + width + i."""
    b, n, _ = logits.shape
    lp, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    scores = (front_score[:, :, None] + lp).reshape(b, n * k)
    tok = target_ids[ids].reshape(b, n * k)
    pool_tok.copy_(tok)
    pool_score.copy_(scores)
    pool_parent.copy_(front_pool[:, :, None].expand(b, n, k).reshape(b, n * k))
    # stable: equal scores keep child order
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    parent = order // k
    if mask_dst is not None:
        if width:
            mask_dst[:, :, ctx: ctx + width] = mask_src[:, :, ctx: ctx + width].gather(
                1, parent[:, :, None].expand(b, k, width))
        own = torch.eye(k, dtype=torch.bool, device=logits.device)
        mask_dst[:, :, ctx + width: ctx + width + k] = own
    return tok.gather(1, order), scores.gather(1, order), parent, pool_base + order


def select_tree_reference(roots, pool_tok, pool_score, pool_parent, pool_depth, n):
    """pool_* [B, P] (pool_parent: pool index, -1 under the root), roots [B] -> tokens,
    parents, depths, ranks [B, n + 1]: node 0 the root, then the chosen nodes in pool order."""
    b, n_pool = pool_tok.shape
    dev = pool_tok.device
    by_score = torch.sort(pool_score, dim=-1, descending=True, stable=True).indices[:, :n]
    chosen, order = by_score.sort(dim=-1)  # pool order = depth order; order: each one's score rank - 1
    steps = torch.arange(1, n + 1, device=dev).expand(b, -1)
    pos_in_tree = torch.zeros(b, n_pool, dtype=torch.long, device=dev).scatter_(1, chosen, steps)
    par_pool = pool_parent.gather(1, chosen)
    par_tree = torch.where(par_pool < 0, 0, pos_in_tree.gather(1, par_pool.clamp(min=0)))
    zero = torch.zeros_like(roots[:, None])
    return (torch.cat([roots[:, None], pool_tok.gather(1, chosen)], 1), torch.cat([zero - 1, par_tree], 1),
            torch.cat([zero, pool_depth.gather(1, chosen)], 1), torch.cat([zero, order + 1], 1))


# ---------------------------------------------------------------------------- Triton
if triton is not None:

    def _head_input_kernel(tok_ptr, emb_ptr, hid_ptr, row_ptr, we_ptr, wh_ptr, x_ptr, hout_ptr, n_tok, n_cols, eps_e, eps_h,
                           s_tb, s_tt, s_hb, s_hs, s_rb, s_rt, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            gdc_launch_dependents()
        r = tl.program_id(0)  # one (batch row, token)
        b = r // n_tok
        t = r % n_tok
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        token = tl.load(tok_ptr + b * s_tb + t * s_tt)
        src = t
        if HAS_ROWS:
            src = tl.load(row_ptr + b * s_rb + t * s_rt)
        e = tl.load(emb_ptr + token * n_cols + cols, mask=ok, other=0.0)
        h = tl.load(hid_ptr + b * s_hb + src * s_hs + cols, mask=ok, other=0.0)
        tl.store(hout_ptr + r * n_cols + cols, h, mask=ok)
        dt = h.dtype
        # as the rmsnorm kernel: normalized in float32, rounded, then scaled and rounded
        ef = e.to(dt).to(tl.float32)
        ye = (ef * (1.0 / tl.sqrt(tl.sum(ef * ef, axis=0) / n_cols + eps_e))).to(dt)
        we = tl.load(we_ptr + cols, mask=ok, other=0.0)
        tl.store(x_ptr + r * 2 * n_cols + cols, (we.to(tl.float32) * ye.to(tl.float32)).to(dt), mask=ok)
        hf = h.to(tl.float32)
        yh = (hf * (1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps_h))).to(dt)
        wh = tl.load(wh_ptr + cols, mask=ok, other=0.0)
        tl.store(x_ptr + r * 2 * n_cols + n_cols + cols, (wh.to(tl.float32) * yh.to(tl.float32)).to(dt), mask=ok)

    def _topk_chunk_kernel(logit_ptr, val_ptr, idx_ptr, stat_ptr, n_vocab, n_chunks, s_row,
                           K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            gdc_launch_dependents()
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logit_ptr + row * s_row + offs, mask=offs < n_vocab, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        s = tl.sum(tl.exp(x - m), axis=0)
        part = row * n_chunks + chunk
        tl.store(stat_ptr + part * 2, m)
        tl.store(stat_ptr + part * 2 + 1, s)
        for j in tl.static_range(K):
            v = tl.max(x, axis=0)
            i = tl.min(tl.where(x == v, offs, 2147483647), axis=0)
            tl.store(val_ptr + part * K + j, v)
            tl.store(idx_ptr + part * K + j, i)
            x = tl.where(offs == i, float("-inf"), x)

    def _topk_expand_kernel(val_ptr, idx_ptr, stat_ptr, fs_ptr, fp_ptr, tid_ptr,
                            ptok_ptr, pscore_ptr, ppar_ptr, btok_ptr, bscore_ptr, bpar_ptr, bpool_ptr,
                            msrc_ptr, mdst_ptr,
                            n_front, n_chunks, pool_base, ctx, width,
                            s_fs, s_fp, s_pt, s_ps, s_pp, s_mb, s_mr,
                            K: tl.constexpr, NP: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr,
                            CKP: tl.constexpr, WP: tl.constexpr, HAS_MASK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            gdc_launch_dependents()
        b = tl.program_id(0)  # one batch row: all its frontier nodes
        n = tl.arange(0, NP)[:, None]
        n_ok = n < n_front
        # log-sum-exp of each node's logits from the chunks' (max, sum of exp)
        c = tl.arange(0, CP)[None, :]
        c_ok = n_ok & (c < n_chunks)
        part = (b * n_front + n) * n_chunks + c
        pm = tl.load(stat_ptr + part * 2, mask=c_ok, other=float("-inf"))
        ps = tl.load(stat_ptr + part * 2 + 1, mask=c_ok, other=0.0)
        mx = tl.max(pm, axis=1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        total = tl.sum(ps * tl.exp(pm - mx[:, None]), axis=1)
        lse = mx + tl.log(tl.where(tl.arange(0, NP) < n_front, total, 1.0))  # padding nodes: no log(0)
        # each node's top-k among its chunks' candidates (ordered: chunk, then rank)
        q = tl.arange(0, CKP)[None, :]
        q_ok = n_ok & (q < n_chunks * K)
        cand = tl.load(val_ptr + (b * n_front + n) * n_chunks * K + q, mask=q_ok, other=float("-inf"))
        cand_id = tl.load(idx_ptr + (b * n_front + n) * n_chunks * K + q, mask=q_ok, other=0)
        kk = tl.arange(0, KP)[None, :]
        child = tl.full([NP, KP], float("-inf"), tl.float32)
        child_id = tl.zeros([NP, KP], tl.int32)
        for j in tl.static_range(K):
            v = tl.max(cand, axis=1)
            at = tl.min(tl.where(cand == v[:, None], q, 2147483647), axis=1)
            hit = q == at[:, None]
            got = tl.sum(tl.where(hit, cand_id, 0), axis=1)
            child = tl.where(kk == j, v[:, None], child)
            child_id = tl.where(kk == j, got[:, None], child_id)
            cand = tl.where(hit, float("-inf"), cand)
        fs = tl.load(fs_ptr + b * s_fs + n, mask=n_ok, other=0.0)
        fp = tl.load(fp_ptr + b * s_fp + n, mask=n_ok, other=0)
        ok = n_ok & (kk < K)
        score = tl.where(ok, fs + (child - lse[:, None]), float("-inf"))
        tok = tl.load(tid_ptr + child_id, mask=ok, other=0)
        flat = n * K + kk
        tl.store(ptok_ptr + b * s_pt + flat, tok, mask=ok)
        tl.store(pscore_ptr + b * s_ps + flat, score, mask=ok)
        tl.store(ppar_ptr + b * s_pp + flat, fp + kk * 0, mask=ok)  # each child's parent, broadcast
        # the next frontier: the best k of all children, and their mask rows
        w = tl.arange(0, WP)
        for j in tl.static_range(K):
            v = tl.max(tl.max(score, axis=1), axis=0)
            f = tl.min(tl.min(tl.where(score == v, flat, 2147483647), axis=1), axis=0)
            hit = flat == f
            t = tl.sum(tl.sum(tl.where(hit, tok, 0), axis=1), axis=0)
            par = f // K
            tl.store(btok_ptr + b * K + j, t)
            tl.store(bscore_ptr + b * K + j, v)
            tl.store(bpar_ptr + b * K + j, par)
            tl.store(bpool_ptr + b * K + j, pool_base + f)
            score = tl.where(hit, float("-inf"), score)
            if HAS_MASK:
                anc = tl.load(msrc_ptr + b * s_mb + par * s_mr + ctx + w, mask=w < width, other=0)
                own = tl.where(w - width == j, 1, 0).to(anc.dtype)
                bits = tl.where(w < width, anc, own)
                tl.store(mdst_ptr + b * s_mb + j * s_mr + ctx + w, bits, mask=w < width + K)

    def _select_tree_kernel(root_ptr, tok_ptr, score_ptr, par_ptr, depth_ptr,
                            out_tok_ptr, out_par_ptr, out_depth_ptr, out_rank_ptr, n_pool,
                            s_pb, s_db, s_ob, PP: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            gdc_launch_dependents()
        b = tl.program_id(0)
        p = tl.arange(0, PP)
        score = tl.load(score_ptr + b * s_pb + p, mask=p < n_pool, other=float("-inf"))
        r = tl.arange(0, NP)
        idx = tl.full([NP], -1, tl.int32)  # pool index of the rank-r choice
        for j in tl.static_range(N):  # the best n, best first; ties to the earlier node
            v = tl.max(score, axis=0)
            at = tl.min(tl.where(score == v, p, 2147483647), axis=0)
            idx = tl.where(r == j, at, idx)
            score = tl.where(p == at, float("-inf"), score)
        ok = r < N
        # tree index (1-based) in pool order: how many choices sit earlier in the pool
        earlier = (idx[None, :] < idx[:, None]) & ok[None, :]
        pos = tl.sum(earlier.to(tl.int32), axis=1) + 1
        src = tl.maximum(idx, 0)
        parent = tl.load(par_ptr + b * s_pb + src, mask=ok, other=-1)
        is_parent = (idx[None, :] == parent[:, None]) & ok[None, :]
        par_tree = tl.sum(tl.where(is_parent, pos[None, :], 0), axis=1)  # 0: the root
        dst = b * s_ob + pos
        tl.store(out_tok_ptr + dst, tl.load(tok_ptr + b * s_pb + src, mask=ok, other=0), mask=ok)
        tl.store(out_par_ptr + dst, par_tree, mask=ok)
        tl.store(out_depth_ptr + dst, tl.load(depth_ptr + b * s_db + src, mask=ok, other=0), mask=ok)
        tl.store(out_rank_ptr + dst, r + 1, mask=ok)
        tl.store(out_tok_ptr + b * s_ob, tl.load(root_ptr + b))
        tl.store(out_par_ptr + b * s_ob, -1)
        tl.store(out_depth_ptr + b * s_ob, 0)
        tl.store(out_rank_ptr + b * s_ob, 0)

def head_input(tokens, embed_weight, hidden, rows, w_embed, eps_embed, w_hidden, eps_hidden):
    if not use_triton(hidden):
        return head_input_reference(tokens, embed_weight, hidden, rows, w_embed, eps_embed, w_hidden, eps_hidden)
    b, t = tokens.shape
    n = hidden.shape[-1]
    assert hidden.stride(-1) == 1 and embed_weight.is_contiguous()
    x = torch.empty(b, t, 2 * n, dtype=hidden.dtype, device=hidden.device)
    hid = torch.empty(b, t, n, dtype=hidden.dtype, device=hidden.device)
    r = rows if rows is not None else tokens  # unused without rows
    _kernel(_head_input_kernel)[(b * t,)](
        tokens, embed_weight, hidden, r, w_embed, w_hidden, x, hid, t, n, eps_embed, eps_hidden,
        tokens.stride(0), tokens.stride(1), hidden.stride(0), hidden.stride(1), r.stride(0), r.stride(1),
        HAS_ROWS=rows is not None, BLOCK=triton.next_power_of_2(n), **pdl_options(hidden, "head_input"))
    return x, hid


def topk_expand(logits, front_score, front_pool, k, target_ids, pool_tok, pool_score, pool_parent, pool_base,
                mask_src=None, mask_dst=None, ctx=0, width=0):
    """See topk_expand_reference; Triton on GPU (or under TRITON_INTERPRET=1)."""
    b, n, vocab = logits.shape
    if k > vocab:
        raise ValueError(f"topk {k} exceeds the draft vocabulary ({vocab})")
    if not use_triton(logits):
        return topk_expand_reference(logits, front_score, front_pool, k, target_ids, pool_tok, pool_score,
                                     pool_parent, pool_base, mask_src, mask_dst, ctx, width)
    dev = logits.device
    flat = logits.reshape(b * n, vocab)
    assert flat.stride(-1) == 1 and target_ids.is_contiguous()
    assert front_score.stride(-1) == 1 and front_pool.stride(-1) == 1
    block = min(BLOCK_V, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block)
    vals = torch.empty(b * n * chunks * k, dtype=torch.float32, device=dev)
    idx = torch.empty(b * n * chunks * k, dtype=torch.int32, device=dev)
    stat = torch.empty(b * n * chunks * 2, dtype=torch.float32, device=dev)
    _kernel(_topk_chunk_kernel)[(b * n, chunks)](flat, vals, idx, stat, vocab, chunks, flat.stride(0), K=k, BLOCK=block,
                                                 **pdl_options(flat, "topk_chunk"))
    tok = torch.empty(b, k, dtype=torch.long, device=dev)
    score = torch.empty(b, k, dtype=torch.float32, device=dev)
    parent = torch.empty(b, k, dtype=torch.long, device=dev)
    pool = torch.empty(b, k, dtype=torch.long, device=dev)
    for t in (pool_tok, pool_score, pool_parent):
        assert t.stride(-1) == 1
    has_mask = mask_dst is not None
    if has_mask:
        assert mask_src.stride() == mask_dst.stride() and mask_dst.stride(-1) == 1
    m_src = mask_src if has_mask else tok
    m_dst = mask_dst if has_mask else tok
    _kernel(_topk_expand_kernel)[(b,)](
        vals, idx, stat, front_score, front_pool, target_ids, pool_tok, pool_score, pool_parent,
        tok, score, parent, pool, m_src, m_dst, n, chunks, pool_base, ctx, width,
        front_score.stride(0), front_pool.stride(0), pool_tok.stride(0), pool_score.stride(0), pool_parent.stride(0),
        m_dst.stride(0), m_dst.stride(1),
        K=k, NP=triton.next_power_of_2(n), KP=triton.next_power_of_2(k), CP=triton.next_power_of_2(chunks),
        CKP=triton.next_power_of_2(chunks * k), WP=triton.next_power_of_2(width + k), HAS_MASK=has_mask,
        **pdl_options(vals, "topk_expand"))
    return tok, score, parent, pool


def select_tree(roots, pool_tok, pool_score, pool_parent, pool_depth, n):
    """See select_tree_reference; Triton on GPU (or under TRITON_INTERPRET=1)."""
    if not use_triton(pool_score):
        return select_tree_reference(roots, pool_tok, pool_score, pool_parent, pool_depth, n)
    b, n_pool = pool_tok.shape
    if not 1 <= n <= n_pool:
        raise ValueError(f"cannot select {n} nodes from a pool of {n_pool}")
    assert pool_tok.stride() == pool_score.stride() == pool_parent.stride() and pool_tok.stride(-1) == 1
    assert pool_depth.stride(-1) == 1
    dev = pool_tok.device
    out = [torch.empty(b, n + 1, dtype=torch.long, device=dev) for _ in range(4)]
    _kernel(_select_tree_kernel)[(b,)](roots.contiguous(), pool_tok, pool_score, pool_parent, pool_depth, *out,
                                      n_pool, pool_tok.stride(0), pool_depth.stride(0), out[0].stride(0),
                                      PP=triton.next_power_of_2(n_pool), N=n, NP=triton.next_power_of_2(n),
                                      **pdl_options(pool_tok, "select_tree"))
    return tuple(out)
