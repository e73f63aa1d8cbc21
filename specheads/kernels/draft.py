"""Kernels for the EAGLE draft loop, beside their torch references.

A draft depth used to cost ~40 small launches besides the head's layer: the input embedding,
two norms and a concatenation; a float log-softmax over the draft vocabulary; two top-k
calls (each several kernels); and a dozen gathers, cats and index sums for the frontier.
Now a depth is the head's layer, its lm_head and one launch of `topk_expand`:

  head_input    the head's layer input: RMSNorm(embed[token]) next to RMSNorm(hidden[row])
                ([B, T, 2H]), plus the gathered hidden rows (the layer's residual). The
                hidden row index lets a frontier node read its parent's output in place.
                (The feed's; a depth's comes from the expansion before it.)
  topk_expand   from the draft logits of N frontier nodes per row: a program per (node,
                vocabulary chunk) finds the chunk's best k and its (max, sum of exp); the
                last of a row's programs to finish (an atomic counter) takes the top-k
                children of each node (log-probabilities from the chunks' log-sum-exp, never
                materialized for the whole vocabulary), writes their cumulative scores
                straight into the candidate pool, picks the best k of all N*k children (the
                next frontier), builds their tree-attention mask rows from their parents'
                rows and, if asked, the next depth's layer input (as head_input).

  feed_inputs   a step's start: the feed's positions and causal mask, the row's committed
                count advanced past the feed, its last entry, the frontier's first mask rows
                (the context) and the depths' positions; one launch instead of seven.
  select_tree   the best n pool nodes by score as a tree in pool order (parents first):
                tokens, parents, depths and score ranks, in one launch instead of ~35.

Ties go to the lower draft id, then to the earlier child (parents precede children), and in
select_tree to the earlier pool node: a child never outscores its parent (log-probabilities
are <= 0), so with this order a chosen node's parent is always chosen. The kernels compare
(value, index) pairs packed into one int64 key (see below), so each pick is one reduction.
"""

from __future__ import annotations

import torch

from specheads.kernels.attention import split_counters
from specheads.kernels import ahead
from specheads.kernels.fused import (_kernel, gdc_launch_dependents, gdc_wait, pdl_options, skip_options, skip_state,
                                     triton, use_triton)
from specheads.kernels.tuning import active
from specheads.modules import rms_norm

if triton is not None:
    import triton.language as tl

    from specheads.kernels.fused import key_index, key_value, order_key

BLOCK_V = 2048  # vocabulary entries per first-stage program


# ---------------------------------------------------------------------------- references
def head_input_reference(tokens, embed_weight, hidden, rows, w_embed, eps_embed, w_hidden, eps_hidden):
    """tokens [B, T]; hidden [B, S, H] (any strides); rows [B, T] indices into S, or None for
    hidden [B, T, H] itself. -> (x [B, T, 2H], the gathered hidden [B, T, H]), in hidden's dtype:
    x = [norm(embedding); norm(hidden)], or with w_embed and w_hidden None the two unnormed
    (EAGLE-1's fc input)."""
    emb = embed_weight[tokens].to(hidden.dtype)
    hid = hidden if rows is None else hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1]))
    if w_embed is None:
        return torch.cat([emb, hid], dim=-1), hid
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


def stop_reference(state, front_score, log_stop, depth: int, skipping: bool) -> None:
    """What topk_expand's `stop` writes into state, on the device (no host sync): state[0] = 1 where
    no row's best new node (front_score [B, k], best first) reaches log_stop (float32 [1]), state[1] = depth;
    `skipping` (inside fused.skip_stopped): only where state[0] was 0, as a skipped launch leaves it."""
    new = torch.stack([(front_score[:, 0].max() < log_stop[0]).to(torch.int32),
                       torch.tensor(depth, dtype=torch.int32, device=state.device)])
    if skipping:
        new = torch.where(state[0] == 0, new, state[:2])
    state[:2].copy_(new)


def select_tree_reference(roots, pool_tok, pool_score, pool_parent, pool_depth, n, limit=None):
    """pool_* [B, P] (pool_parent: pool index, -1 under the root), roots [B] -> tokens,
    parents, depths, ranks [B, n + 1]: node 0 the root, then the chosen nodes in pool order.
    limit (int tensor [1], a draft stopped after that depth): only the pool's nodes at most that
    deep are chosen; where fewer than n are, the rest are padding (token 0 under the root at depth
    1, after the chosen) and a fifth result, valid [B, n + 1], tells them apart."""
    b, n_pool = pool_tok.shape
    dev = pool_tok.device
    by_score = torch.sort(pool_score, dim=-1, descending=True, stable=True).indices
    if limit is not None:  # the nodes past the limit after every other, in the same order
        past = (pool_depth.expand(b, -1) > limit).gather(1, by_score)
        by_score = by_score.gather(1, torch.sort(past.to(torch.int8), dim=-1, stable=True).indices)
        ok = ~past.sort(dim=-1, stable=True).values[:, :n]
    by_score = by_score[:, :n]
    if limit is not None:  # padding keeps its rank order after the chosen nodes
        by_score = torch.where(ok, by_score, n_pool + torch.arange(n, device=dev))
    chosen, order = by_score.sort(dim=-1)  # pool order = depth order; order: each one's score rank - 1
    real = chosen < n_pool
    chosen = chosen.clamp(max=n_pool - 1)
    steps = torch.arange(1, n + 1, device=dev).expand(b, -1)
    pos_in_tree = torch.zeros(b, n_pool, dtype=torch.long, device=dev).scatter_reduce_(
        1, chosen, torch.where(real, steps, 0), "amax")
    par_pool = torch.where(real, pool_parent.gather(1, chosen), -1)
    par_tree = torch.where(par_pool < 0, 0, pos_in_tree.gather(1, par_pool.clamp(min=0)))
    zero = torch.zeros_like(roots[:, None])
    out = (torch.cat([roots[:, None], torch.where(real, pool_tok.gather(1, chosen), 0)], 1),
           torch.cat([zero - 1, par_tree], 1),
           torch.cat([zero, torch.where(real, pool_depth.expand(b, -1).gather(1, chosen), 1)], 1),
           torch.cat([zero, order + 1], 1))
    if limit is None:
        return out
    return out + (torch.cat([torch.ones_like(real[:, :1]), real], 1),)


def feed_inputs_reference(committed, count, width: int, kv: int, masks=None, steps: int = 1):
    """committed [B] (advanced in place by count [B]); -> the feed's positions [B, width]
    (committed + j), its mask [B, width, kv] (column <= position), the last fed entry
    max(count - 1, 0) [B] and the depths' positions [B, max(steps - 1, 1)] (the new committed +
    d); masks [2, B, k, W] (the frontier's rows) are set to the context (column < new committed)."""
    cols = torch.arange(max(width, kv, steps), device=committed.device)
    positions = committed[:, None] + cols[:width]
    mask = cols[:kv][None, None, :] <= positions[:, :, None]
    committed.add_(count)
    last = (count - 1).clamp(min=0)
    if masks is not None:
        w = masks.shape[-1]
        torch.lt(torch.arange(w, device=committed.device).expand_as(masks), committed[None, :, None, None], out=masks)
    return positions, mask, last, committed[:, None] + cols[: max(steps - 1, 1)]


# ---------------------------------------------------------------------------- Triton
if triton is not None:

    def _feed_kernel(com_ptr, cnt_ptr, pos_ptr, mask_ptr, last_ptr, dpos_ptr, fm_ptr, width, kv, n_dpos, w_front, k,
                     s_m0, s_m1, s_m2, FP: tl.constexpr, DP: tl.constexpr, K2: tl.constexpr, BLOCK: tl.constexpr,
                     HAS_MASKS: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        c = tl.load(com_ptr + b)
        n = tl.load(cnt_ptr + b)
        j = tl.arange(0, FP)
        pos = c + j
        tl.store(pos_ptr + b * width + j, pos, mask=j < width)
        for start in range(0, kv, BLOCK):
            col = start + tl.arange(0, BLOCK)
            tl.store(mask_ptr + (b * width + j[:, None]) * kv + col[None, :], (col[None, :] <= pos[:, None]).to(tl.int1),
                     mask=(j[:, None] < width) & (col[None, :] < kv))
        new = c + n
        tl.store(com_ptr + b, new)
        tl.store(last_ptr + b, tl.maximum(n - 1, 0))
        d = tl.arange(0, DP)
        tl.store(dpos_ptr + b * n_dpos + d, new + d, mask=d < n_dpos)
        if HAS_MASKS:  # rows (buffer, node) of [2, B, k, W]: the context
            r = tl.arange(0, K2)
            node = r % (K2 // 2)
            row = (r // (K2 // 2)) * s_m0 + b * s_m1 + node * s_m2
            for start in range(0, w_front, BLOCK):
                col = start + tl.arange(0, BLOCK)
                tl.store(fm_ptr + row[:, None] + col[None, :], (col[None, :] < new).to(tl.int1),
                         mask=(node[:, None] < k) & (col[None, :] < w_front))

    def _head_input_kernel(tok_ptr, emb_ptr, hid_ptr, row_ptr, we_ptr, wh_ptr, x_ptr, hout_ptr, n_tok, n_cols, eps_e, eps_h,
                           s_tb, s_tt, s_hb, s_hs, s_rb, s_rt, HAS_ROWS: tl.constexpr, NORM: tl.constexpr,
                           BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        r = tl.program_id(0).to(tl.int64)  # one (batch row, token)
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
        if not NORM:  # the embedding (in hidden's dtype) and the hidden state as they are
            tl.store(x_ptr + r * 2 * n_cols + cols, e.to(dt), mask=ok)
            tl.store(x_ptr + r * 2 * n_cols + n_cols + cols, h, mask=ok)
        else:
            # as the rmsnorm kernel: normalized in float32, rounded, then scaled and rounded
            ef = e.to(dt).to(tl.float32)
            ye = (ef * (1.0 / tl.sqrt(tl.sum(ef * ef, axis=0) / n_cols + eps_e))).to(dt)
            we = tl.load(we_ptr + cols, mask=ok, other=0.0)
            tl.store(x_ptr + r * 2 * n_cols + cols, (we.to(tl.float32) * ye.to(tl.float32)).to(dt), mask=ok)
            hf = h.to(tl.float32)
            yh = (hf * (1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps_h))).to(dt)
            wh = tl.load(wh_ptr + cols, mask=ok, other=0.0)
            tl.store(x_ptr + r * 2 * n_cols + n_cols + cols, (wh.to(tl.float32) * yh.to(tl.float32)).to(dt), mask=ok)

    # A candidate's value and index in one int64 key, so that one max-reduction finds both:
    #   key = ordered(value) * 2^32 + (2^31 - 1 - index)
    # where ordered() maps a float32's bits to an int32 of the same order (-0.0 taken as +0.0).
    # The largest key is the largest value, ties to the lowest index: one reduction a pick,
    # where a max, then a min over the matching indices (and a sum to fetch a payload) took three.

    def _topk_kernel(logit_ptr, key_ptr, stat_ptr, cnt_ptr, n_vocab, n_chunks, s_row,
                     fs_ptr, fp_ptr, tid_ptr, ptok_ptr, pscore_ptr, ppar_ptr, btok_ptr, bscore_ptr, bpar_ptr, bpool_ptr,
                     msrc_ptr, mdst_ptr, n_front, pool_base, ctx, width, par_base, s_bt, s_bp,
                     s_fs, s_fp, s_pt, s_ps, s_pp, s_mb, s_mr,
                     emb_ptr, hid_ptr, we_ptr, wh_ptr, x_ptr, hout_ptr, n_cols, eps_e, eps_h, s_hb, s_hs,
                     nrow_ptr, s_lb, skip_ptr, stop_ptr, log_stop, stop_depth, n_batch,
                     K: tl.constexpr, BLOCK: tl.constexpr, NP: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr,
                     CKP: tl.constexpr, WP: tl.constexpr, HP: tl.constexpr, HAS_MASK: tl.constexpr,
                     NEXT_INPUT: tl.constexpr, NODE_ROW: tl.constexpr, SHARED: tl.constexpr, PDL: tl.constexpr,
                     SKIP: tl.constexpr, STOP: tl.constexpr, BP: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        if SKIP:  # a draft depth stopped on the device (fused.skip_stopped)
            if tl.load(skip_ptr) != 0:
                return
        # stage 1, one program per (frontier node, vocabulary chunk): the chunk's (max, sum of exp)
        # and its best K keys; SHARED: every node of a row has the same logits (one row a batch row,
        # Medusa's), so stage 1 runs once a row and stage 2 reads that row's results for every node
        n_src = 1 if SHARED else n_front  # stage-1 rows a batch row
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        src = logit_ptr + row * s_row
        if NODE_ROW:  # one node a batch row: logits row nrow[b] of the row's s_lb-apart block
            src = logit_ptr + row * s_lb + tl.load(nrow_ptr + row) * s_row
        x = tl.load(src + offs, mask=offs < n_vocab, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        s = tl.sum(tl.exp(x - m), axis=0)
        part = row * n_chunks + chunk
        tl.store(stat_ptr + part * 2, m)
        tl.store(stat_ptr + part * 2 + 1, s)
        key = order_key(x, offs)
        for j in tl.static_range(K):  # the chunk's best K keys, best first
            best = tl.max(key, axis=0)
            tl.store(key_ptr + part * K + j, best)
            key = tl.where(key == best, -9223372036854775807, key)
        # the last of a batch row's programs to finish runs stage 2 for the row (as the split-K
        # attention merges): every thread's stores are issued before the one-thread atomic,
        # whose acq_rel at gpu scope publishes them and makes the others' visible here
        b = row // n_src
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel", scope="gpu")
        if done == n_src * n_chunks - 1:
            n = tl.arange(0, NP)[:, None]
            n_ok = n < n_front
            src_n = n * 0 if SHARED else n  # the stage-1 row of each node
            # log-sum-exp of each node's logits from the chunks' (max, sum of exp)
            c = tl.arange(0, CP)[None, :]
            c_ok = n_ok & (c < n_chunks)
            part2 = (b * n_src + src_n) * n_chunks + c
            pm = tl.load(stat_ptr + part2 * 2, mask=c_ok, other=float("-inf"), cache_modifier=".cg")
            ps = tl.load(stat_ptr + part2 * 2 + 1, mask=c_ok, other=0.0, cache_modifier=".cg")
            mx = tl.max(pm, axis=1)
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            total = tl.sum(ps * tl.exp(pm - mx[:, None]), axis=1)
            lse = mx + tl.log(tl.where(tl.arange(0, NP) < n_front, total, 1.0))  # padding nodes: no log(0)
            # each node's top-k among its chunks' candidate keys (value, then the lower draft id)
            q = tl.arange(0, CKP)[None, :]
            q_ok = n_ok & (q < n_chunks * K)
            cand = tl.load(key_ptr + (b * n_src + src_n) * n_chunks * K + q, mask=q_ok, other=-9223372036854775807,
                           cache_modifier=".cg")
            kk = tl.arange(0, KP)[None, :]
            child = tl.zeros([NP, KP], tl.int64)
            for j in tl.static_range(K):
                best = tl.max(cand, axis=1)
                child = tl.where(kk == j, best[:, None], child)
                cand = tl.where(cand == best[:, None], -9223372036854775807, cand)
            value = key_value(child)
            child_id = key_index(child)
            fs = tl.load(fs_ptr + b * s_fs + n, mask=n_ok, other=0.0)
            fp = tl.load(fp_ptr + b * s_fp + n, mask=n_ok, other=0)
            ok = n_ok & (kk < K)
            score = tl.where(ok, fs + (value - lse[:, None]), float("-inf"))
            tok = tl.load(tid_ptr + child_id, mask=ok, other=0)
            flat = n * K + kk
            tl.store(ptok_ptr + b * s_pt + flat, tok, mask=ok)
            tl.store(pscore_ptr + b * s_ps + flat, score, mask=ok)
            tl.store(ppar_ptr + b * s_pp + flat, fp + kk * 0, mask=ok)  # each child's parent, broadcast
            # the next frontier: the best k of all children (ties to the earlier child)
            key2 = tl.reshape(tl.where(ok, order_key(score, flat), -9223372036854775807), [NP * KP])
            r = tl.arange(0, KP)
            pick = tl.zeros([KP], tl.int64)
            for j in tl.static_range(K):
                best = tl.max(key2, axis=0)
                pick = tl.where(r == j, best, pick)
                key2 = tl.where(key2 == best, -9223372036854775807, key2)
            r_ok = r < K
            f = key_index(pick)
            f = tl.where(r_ok, f, 0)
            par = f // K
            # the picks' tokens read back from the pool: selecting them from the registers instead
            # (a [k, n * k] match) made the launch slower, 7.8 -> 9.0 us at k = 4 and 13.1 -> 28.8 us
            # at k = 8 (H200, tree_parts.py --profile)
            tl.debug_barrier()  # the pool's tokens, stored above by other threads, are read back
            new_tok = tl.load(ptok_ptr + b * s_pt + f, mask=r_ok, other=0)
            tl.store(btok_ptr + b * s_bt + r, new_tok, mask=r_ok)
            tl.store(bscore_ptr + b * K + r, key_value(pick), mask=r_ok)
            tl.store(bpar_ptr + b * s_bp + r, par + par_base, mask=r_ok)
            tl.store(bpool_ptr + b * K + r, pool_base + f, mask=r_ok)
            if HAS_MASK:  # row j: its parent's tree columns, then its own bit
                w = tl.arange(0, WP)[None, :]
                anc = tl.load(msrc_ptr + b * s_mb + par[:, None] * s_mr + ctx + w,
                              mask=r_ok[:, None] & (w < width), other=0)
                own = tl.where(w - width == r[:, None], 1, 0).to(anc.dtype)
                tl.store(mdst_ptr + b * s_mb + r[:, None] * s_mr + ctx + w, tl.where(w < width, anc, own),
                         mask=r_ok[:, None] & (w < width + K))
            if NEXT_INPUT:  # the next depth's layer input for the new frontier, as head_input makes it
                cols = tl.arange(0, HP)[None, :]
                c_in = r_ok[:, None] & (cols < n_cols)
                e = tl.load(emb_ptr + new_tok[:, None] * n_cols + cols, mask=c_in, other=0.0)
                hrow = par
                if NODE_ROW:  # the node's hidden row is nrow[b] too
                    hrow = par + tl.load(nrow_ptr + b)
                h = tl.load(hid_ptr + b * s_hb + hrow[:, None] * s_hs + cols, mask=c_in, other=0.0)
                dst = (b * K + r)[:, None]
                tl.store(hout_ptr + dst * n_cols + cols, h, mask=c_in)
                dt = h.dtype
                ef = e.to(dt).to(tl.float32)
                ye = (ef * (1.0 / tl.sqrt(tl.sum(ef * ef, axis=1) / n_cols + eps_e))[:, None]).to(dt)
                we = tl.load(we_ptr + cols, mask=cols < n_cols, other=0.0)
                tl.store(x_ptr + dst * 2 * n_cols + cols, (we.to(tl.float32) * ye.to(tl.float32)).to(dt), mask=c_in)
                hf = h.to(tl.float32)
                yh = (hf * (1.0 / tl.sqrt(tl.sum(hf * hf, axis=1) / n_cols + eps_h))[:, None]).to(dt)
                wh = tl.load(wh_ptr + cols, mask=cols < n_cols, other=0.0)
                tl.store(x_ptr + dst * 2 * n_cols + n_cols + cols, (wh.to(tl.float32) * yh.to(tl.float32)).to(dt),
                         mask=c_in)
            tl.store(cnt_ptr + b, 0)  # ready for the next launch (or graph replay)
            if STOP:  # the last row to finish decides for the batch (topk_expand's `stop`)
                tl.debug_barrier()
                rows_done = tl.atomic_add(stop_ptr + 2, 1, sem="acq_rel", scope="gpu")
                if rows_done == n_batch - 1:
                    rb = tl.arange(0, BP)
                    top = tl.max(tl.load(bscore_ptr + rb * K, mask=rb < n_batch, other=float("-inf"),
                                         cache_modifier=".cg"), axis=0)
                    tl.store(stop_ptr, (top < tl.load(log_stop)).to(tl.int32))
                    tl.store(stop_ptr + 1, stop_depth)
                    tl.store(stop_ptr + 2, 0)

    def _select_tree_kernel(root_ptr, tok_ptr, score_ptr, par_ptr, depth_ptr,
                            out_tok_ptr, out_par_ptr, out_depth_ptr, out_rank_ptr, n_pool,
                            s_pb, s_db, s_ob, lim_ptr, valid_ptr, s_vb, PP: tl.constexpr, N: tl.constexpr,
                            NP: tl.constexpr, PDL: tl.constexpr, LIMIT: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        p = tl.arange(0, PP)
        score = tl.load(score_ptr + b * s_pb + p, mask=p < n_pool, other=float("-inf"))
        p_ok = p < n_pool
        if LIMIT:  # a draft stopped after depth lim: the deeper nodes were not drafted
            p_ok = p_ok & (tl.load(depth_ptr + b * s_db + p, mask=p_ok, other=0) <= tl.load(lim_ptr))
        key = tl.where(p_ok, order_key(score, p), -9223372036854775807)
        r = tl.arange(0, NP)
        pick = tl.zeros([NP], tl.int64)
        for j in tl.static_range(N):  # the best n, best first; ties to the earlier node
            best = tl.max(key, axis=0)
            pick = tl.where(r == j, best, pick)
            key = tl.where(key == best, -9223372036854775807, key)
        in_n = r < N
        ok = in_n & (pick != -9223372036854775807)  # (LIMIT: fewer nodes than n may be there)
        idx = tl.where(ok, key_index(pick), n_pool + r)  # rank r's pool index (padding: after every node)
        idx = tl.where(in_n, idx, -1)
        # tree index (1-based) in pool order: how many choices sit earlier in the pool
        earlier = (idx[None, :] < idx[:, None]) & in_n[None, :]
        pos = tl.sum(earlier.to(tl.int32), axis=1) + 1
        src = tl.where(ok, idx, 0)
        parent = tl.load(par_ptr + b * s_pb + src, mask=ok, other=-1)
        is_parent = (idx[None, :] == parent[:, None]) & ok[None, :]
        par_tree = tl.sum(tl.where(is_parent, pos[None, :], 0), axis=1)  # 0: the root
        dst = b * s_ob + pos
        tl.store(out_tok_ptr + dst, tl.load(tok_ptr + b * s_pb + src, mask=ok, other=0), mask=in_n)
        tl.store(out_par_ptr + dst, par_tree, mask=in_n)
        tl.store(out_depth_ptr + dst, tl.load(depth_ptr + b * s_db + src, mask=ok, other=1), mask=in_n)
        tl.store(out_rank_ptr + dst, r + 1, mask=in_n)
        if LIMIT:
            tl.store(valid_ptr + b * s_vb + pos, ok.to(tl.int8), mask=in_n)
            tl.store(valid_ptr + b * s_vb, 1)
        tl.store(out_tok_ptr + b * s_ob, tl.load(root_ptr + b))
        tl.store(out_par_ptr + b * s_ob, -1)
        tl.store(out_depth_ptr + b * s_ob, 0)
        tl.store(out_rank_ptr + b * s_ob, 0)

@ahead.op
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
        tokens, embed_weight, hidden, r, hidden if w_embed is None else w_embed,
        hidden if w_hidden is None else w_hidden, x, hid, t, n, eps_embed or 0.0, eps_hidden or 0.0,
        tokens.stride(0), tokens.stride(1), hidden.stride(0), hidden.stride(1), r.stride(0), r.stride(1),
        HAS_ROWS=rows is not None, NORM=w_embed is not None, BLOCK=triton.next_power_of_2(n), **pdl_options(hidden, "head_input"))
    return x, hid


@ahead.op
def topk_expand(logits, front_score, front_pool, k, target_ids, pool_tok, pool_score, pool_parent, pool_base,
                mask_src=None, mask_dst=None, ctx=0, width=0, next_input=None, node_rows=None, tok_out=None,
                parent_out=None, parent_base=0, shared: bool = False, stop=None):
    """See topk_expand_reference; Triton on GPU (or under TRITON_INTERPRET=1), one launch: a
    program per (node, vocabulary chunk), the last of a row's to finish expands the row.
    next_input: (embed_weight, hidden [B, N, H], w_embed, eps_embed, w_hidden, eps_hidden) to
    also make the next depth's layer input for the new frontier (head_input of its tokens over
    its parents' rows of hidden); the result then ends with (x [B, k, 2H], hidden rows [B, k, H]).
    node_rows [B]: a frontier of one node a row, row node_rows[b] of logits [B, W, V] (and of
    next_input's hidden): the feed's last entry, read in place instead of gathered first.
    tok_out, parent_out [B, k] (views with unit last stride, given together): where the new
    frontier's tokens and its parents plus parent_base go (the next call's inputs, written in
    place); they are returned as the frontier's tokens and parents.
    shared: logits [B, 1, V] are every frontier node's (front_score [B, N]: N nodes a row), as
    expanding them to [B, N, V] would give, read once a row (Medusa's heads see no draft).
    stop: (state int32 [3], log threshold float32 [1], both on the device, depth): the draft stopped
    on the device (drafters/eagle.py, draft_stop): after the expansion, state[0] = 1 where no row's
    best new node has a cumulative log-probability of at least the threshold (else 0) and state[1] = depth (the
    depth these nodes are at); state[2] is the rows' counter, 0 between launches. Inside
    fused.skip_stopped(state) a call returns at once where state[0] is set (on the Triton path; the
    reference computes and leaves the state as a skipped launch would)."""
    if stop is not None:
        state, log_stop, stop_depth = stop
        if state.dtype != torch.int32 or state.numel() < 3 or log_stop.dtype != torch.float32:
            raise ValueError("topk_expand: stop's state is an int32 tensor of 3 entries, its threshold a float32 one")
    if shared:
        if logits.shape[1] != 1 or node_rows is not None or next_input is not None:
            raise ValueError("topk_expand: shared logits are one row a batch row, without node_rows or next_input")
        if not use_triton(logits):
            logits = logits.expand(-1, front_score.shape[1], -1)
            shared = False
    if node_rows is not None:
        if not use_triton(logits):
            b, w, vocab = logits.shape
            logits = logits.gather(1, node_rows[:, None, None].expand(b, 1, vocab))
            if next_input is not None:
                hidden = next_input[1]
                hidden = hidden.gather(1, node_rows[:, None, None].expand(b, 1, hidden.shape[-1]))
                next_input = (next_input[0], hidden, *next_input[2:])
            node_rows = None
        else:
            assert node_rows.is_contiguous() and front_score.shape[1] == 1
    b, n, vocab = logits.shape
    if node_rows is not None or shared:
        n = front_score.shape[1] if shared else 1  # the frontier; logits holds W rows (or one) a batch row
    if k > vocab:
        raise ValueError(f"topk {k} exceeds the draft vocabulary ({vocab})")
    if (tok_out is None) != (parent_out is None):
        raise ValueError("topk_expand: tok_out and parent_out go together")
    if not use_triton(logits):
        out = topk_expand_reference(logits, front_score, front_pool, k, target_ids, pool_tok, pool_score,
                                    pool_parent, pool_base, mask_src, mask_dst, ctx, width)
        if stop is not None:
            stop_reference(state, out[1], log_stop, stop_depth, skip_state() is not None)
        if next_input is not None:
            emb, hidden, we, eps_e, wh, eps_h = next_input
            out = out + head_input_reference(out[0], emb, hidden, out[2], we, eps_e, wh, eps_h)
        if tok_out is None:
            return out
        tok_out.copy_(out[0])
        parent_out.copy_(out[2] + parent_base)
        return (tok_out, out[1], parent_out) + out[3:]
    dev = logits.device
    flat = logits.reshape(-1, vocab)
    assert flat.stride(-1) == 1 and target_ids.is_contiguous()
    assert front_score.stride(-1) == 1 and front_pool.stride(-1) == 1
    block = min(active().speed.draft_block or BLOCK_V, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block)
    rows1 = b if shared else b * n  # stage 1's rows: a node's logits each (one a batch row when shared)
    keys = torch.empty(rows1 * chunks * k, dtype=torch.int64, device=dev)
    stat = torch.empty(rows1 * chunks * 2, dtype=torch.float32, device=dev)
    tok = torch.empty(b, k, dtype=torch.long, device=dev) if tok_out is None else tok_out
    score = torch.empty(b, k, dtype=torch.float32, device=dev)
    parent = torch.empty(b, k, dtype=torch.long, device=dev) if parent_out is None else parent_out
    pool = torch.empty(b, k, dtype=torch.long, device=dev)
    assert tok.stride(-1) == 1 and parent.stride(-1) == 1 and tok.dtype == parent.dtype == torch.long
    for t in (pool_tok, pool_score, pool_parent):
        assert t.stride(-1) == 1
    has_mask = mask_dst is not None
    if has_mask:
        assert mask_src.stride() == mask_dst.stride() and mask_dst.stride(-1) == 1
    m_src = mask_src if has_mask else tok
    m_dst = mask_dst if has_mask else tok
    if next_input is not None:
        emb, hidden, we, eps_e, wh, eps_h = next_input
        h = hidden.shape[-1]
        assert hidden.stride(-1) == 1 and emb.is_contiguous()
        x = torch.empty(b, k, 2 * h, dtype=hidden.dtype, device=dev)
        hid = torch.empty(b, k, h, dtype=hidden.dtype, device=dev)
        hid_args = (emb, hidden, we, wh, x, hid, h, float(eps_e), float(eps_h), hidden.stride(0), hidden.stride(1))
    else:
        h = 1
        hid_args = (tok, tok, tok, tok, tok, tok, 1, 0.0, 0.0, 0, 0)
    skip = skip_options(flat)
    _kernel(_topk_kernel)[(rows1, chunks)](
        flat, keys, stat, split_counters(dev, b), vocab, chunks, flat.stride(0),
        front_score, front_pool, target_ids, pool_tok, pool_score, pool_parent,
        tok, score, parent, pool, m_src, m_dst, n, pool_base, ctx, width, parent_base, tok.stride(0), parent.stride(0),
        front_score.stride(0), front_pool.stride(0), pool_tok.stride(0), pool_score.stride(0), pool_parent.stride(0),
        m_dst.stride(0), m_dst.stride(1), *hid_args,
        node_rows if node_rows is not None else tok, logits.stride(0), skip["skip_ptr"],
        *(stop if stop is not None else (tok, score, 0)), b,
        K=k, BLOCK=block, NP=triton.next_power_of_2(n), KP=triton.next_power_of_2(k),
        CP=triton.next_power_of_2(chunks), CKP=triton.next_power_of_2(chunks * k), WP=triton.next_power_of_2(width + k),
        HP=triton.next_power_of_2(h), HAS_MASK=has_mask, NEXT_INPUT=next_input is not None,
        NODE_ROW=node_rows is not None, SHARED=shared, num_warps=active().speed.draft_warps,
        STOP=stop is not None, BP=triton.next_power_of_2(b), SKIP=skip["SKIP"], **pdl_options(flat, "topk_expand"))
    if next_input is None:
        return tok, score, parent, pool
    return tok, score, parent, pool, x, hid


# columns of the masks a program writes at a time: one size for every context bucket, so that the buckets
# share the kernel's variants (a start-up compiles each variant once; the stores are the same)
FEED_BLOCK = 256


@ahead.op
def feed_inputs(committed, count, width: int, kv: int, masks=None, steps: int = 1):
    """See feed_inputs_reference; one launch on GPU (or under TRITON_INTERPRET=1)."""
    if not use_triton(committed):
        return feed_inputs_reference(committed, count, width, kv, masks, steps)
    b = committed.shape[0]
    dev = committed.device
    assert committed.is_contiguous() and count.is_contiguous()
    n_dpos = max(steps - 1, 1)
    positions = torch.empty(b, width, dtype=torch.long, device=dev)
    mask = torch.empty(b, width, kv, dtype=torch.bool, device=dev)
    last = torch.empty(b, dtype=torch.long, device=dev)
    dpos = torch.empty(b, n_dpos, dtype=torch.long, device=dev)
    if masks is not None:
        assert masks.shape[:2] == (2, b) and masks.stride(-1) == 1
        k, w = masks.shape[2], masks.shape[3]
        fm, strides = masks, masks.stride()[:3]
    else:
        k, w, fm, strides = 1, 0, mask, (0, 0, 0)
    _kernel(_feed_kernel)[(b,)](committed, count, positions, mask, last, dpos, fm, width, kv, n_dpos, w, k, *strides,
                                FP=triton.next_power_of_2(width), DP=triton.next_power_of_2(n_dpos),
                                K2=2 * triton.next_power_of_2(k), BLOCK=FEED_BLOCK,
                                HAS_MASKS=masks is not None, **pdl_options(committed, "feed_inputs"))
    return positions, mask, last, dpos


@ahead.op
def select_tree(roots, pool_tok, pool_score, pool_parent, pool_depth, n, limit=None):
    """See select_tree_reference; Triton on GPU (or under TRITON_INTERPRET=1)."""
    if not use_triton(pool_score):
        return select_tree_reference(roots, pool_tok, pool_score, pool_parent, pool_depth, n, limit)
    b, n_pool = pool_tok.shape
    if not 1 <= n <= n_pool:
        raise ValueError(f"cannot select {n} nodes from a pool of {n_pool}")
    assert pool_tok.stride() == pool_score.stride() == pool_parent.stride() and pool_tok.stride(-1) == 1
    assert pool_depth.stride(-1) == 1
    dev = pool_tok.device
    out = [torch.empty(b, n + 1, dtype=torch.long, device=dev) for _ in range(4)]
    valid = torch.empty(b, n + 1, dtype=torch.bool, device=dev) if limit is not None else None
    _kernel(_select_tree_kernel)[(b,)](roots.contiguous(), pool_tok, pool_score, pool_parent, pool_depth, *out,
                                      n_pool, pool_tok.stride(0), pool_depth.stride(0), out[0].stride(0),
                                      limit if limit is not None else out[0],
                                      valid.view(torch.int8) if valid is not None else out[0],
                                      valid.stride(0) if valid is not None else 0,
                                      PP=triton.next_power_of_2(n_pool), N=n, NP=triton.next_power_of_2(n),
                                      LIMIT=limit is not None, num_warps=active().speed.draft_warps,
                                      **pdl_options(pool_tok, "select_tree"))
    return tuple(out) if valid is None else (*out, valid)
