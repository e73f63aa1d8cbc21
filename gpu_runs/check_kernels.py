"""On the GPU: every Triton kernel against its torch reference at the engine's shapes (bf16
and float32), and the fused engine's tokens against the unfused one's. Prints max errors.
    python3 gpu_runs/check_kernels.py"""
import torch

from specheads.kernels import attention


def _mask(b, t, s, seed):
    """A prefix of random length per row, then a random tree (each node sees itself)."""
    g = torch.Generator().manual_seed(seed)
    committed = torch.randint(1, s - t + 1, (b,), generator=g)
    mask = (torch.arange(s)[None, None, :] < committed[:, None, None]).expand(b, t, s).clone()
    tree = (torch.rand(b, t, t, generator=g) < 0.5) | torch.eye(t, dtype=torch.bool)
    mask.scatter_(2, (committed[:, None] + torch.arange(t))[:, None, :].expand(b, t, t), tree)
    return mask[:, None]

torch.manual_seed(0)
dev = "cuda"
worst = 0.0
for dtype in (torch.float32, torch.bfloat16):
    for b, h, kv, t, s, d in [(1, 9, 3, 1, 128, 64), (1, 9, 3, 17, 256, 64), (1, 9, 3, 33, 512, 64),
                              (1, 9, 3, 65, 512, 64), (8, 9, 3, 17, 1024, 64), (1, 9, 3, 8, 300, 64),
                              (1, 32, 8, 64, 512, 128)]:
        q = torch.randn(b, t, h, d, device=dev, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, kv, s, d, device=dev, dtype=dtype)
        v = torch.randn(b, kv, s, d, device=dev, dtype=dtype)
        mask = _mask(b, t, s, seed=t).to(dev)
        out = attention.tree_attention(q, k, v, mask).float()
        ref = attention.attention_reference(q.float(), k.float(), v.float(), mask)
        err = (out - ref).abs().max().item()
        worst = max(worst, err) if dtype == torch.float32 else worst
        print(f"tree_attention {str(dtype):>15} b={b} h={h} kv={kv} t={t} s={s} d={d}: max abs err {err:.2e}", flush=True)
print("worst float32 error", worst)

# KV commit: paths that skip nodes (a source slot is another entry's destination), many trials
from specheads.kernels.kv_commit import commit_kv_reference, commit_kv_triton  # noqa: E402

bad = 0
for trial in range(200):
    g = torch.Generator().manual_seed(trial)
    b, n_nodes, depth = 4, 33, 7
    cache = torch.randn(30, b, 3, 600, 64, generator=g).to(dev, torch.bfloat16)
    base = torch.randint(0, 500, (b,), generator=g)
    src = torch.zeros(b, depth, dtype=torch.long)
    n_acc = torch.randint(1, depth + 1, (b,), generator=g)
    for r in range(b):
        picks = sorted(torch.randperm(n_nodes - 1, generator=g)[: depth - 1].add(1).tolist())
        src[r, 1:] = torch.tensor(picks)
    ref = cache.clone()
    commit_kv_reference(ref, base.to(dev), src.to(dev), n_acc.to(dev))
    commit_kv_triton(cache, base.to(dev), src.to(dev), n_acc.to(dev))
    bad += int(not torch.equal(cache, ref))
print(f"kv commit: {bad} of 200 trials differ from the reference")

# The draft loop's kernels at the default tree's shapes (draft vocab 32000, k = 8)
from specheads.kernels import draft  # noqa: E402

for b, n in [(1, 1), (1, 8), (8, 8)]:
    k, vocab, ctx, width = 8, 32000, 300, 16 if n > 1 else 0
    logits = (torch.randn(b, n, vocab, device=dev) * 4).to(torch.bfloat16)
    score, pool_in = -torch.rand(b, n, device=dev) * 5, torch.randint(0, 100, (b, n), device=dev)
    tid = torch.randperm(49152, device=dev)[:vocab].contiguous()
    src = torch.rand(b, k, ctx + width + k, device=dev) < 0.5
    results = []
    for fn in (draft.topk_expand, draft.topk_expand_reference):
        pools = [torch.zeros(b, n * k, dtype=dt, device=dev) for dt in (torch.long, torch.float32, torch.long)]
        dst = torch.zeros_like(src)
        out = fn(logits, score, pool_in, k, tid, *pools, 9, src, dst, ctx, width)
        results.append((out, pools, dst))
    (o1, p1, m1), (o2, p2, m2) = results
    same = all(torch.equal(x, y) for x, y in zip(o1, o2) if x.dtype != torch.float32)
    same &= torch.equal(p1[0], p2[0]) and torch.equal(p1[2], p2[2]) and torch.equal(m1, m2)
    err = max((o1[1] - o2[1]).abs().max().item(), (p1[1] - p2[1]).abs().max().item())
    print(f"topk_expand b={b} n={n}: ids/parents/mask equal {same}, max score error {err:.2e}", flush=True)
    # Medusa's shared logits (one row a batch row for every node) against the same row expanded
    row = logits[:, :1]
    runs = []
    for lg, kw in ((row.expand(b, n, vocab).contiguous(), {}), (row, {"shared": True})):
        pools = [torch.zeros(b, n * k, dtype=dt, device=dev) for dt in (torch.long, torch.float32, torch.long)]
        runs.append((draft.topk_expand(lg, score, pool_in, k, tid, *pools, 9, **kw), pools))
    same = all(torch.equal(x, y) for x, y in zip(list(runs[0][0]) + runs[0][1], list(runs[1][0]) + runs[1][1]))
    print(f"topk_expand shared b={b} n={n}: equal to the expanded logits {same}", flush=True)
for dtype in (torch.float32, torch.bfloat16):
    table = torch.randn(49152, 576, device=dev, dtype=dtype)
    hidden = torch.randn(8, 8, 576, device=dev, dtype=dtype)
    tokens = torch.randint(0, 49152, (8, 8), device=dev)
    rows = torch.randint(0, 8, (8, 8), device=dev)
    w1, w2 = torch.randn(576, device=dev, dtype=dtype), torch.randn(576, device=dev, dtype=dtype)
    x, _ = draft.head_input(tokens, table, hidden, rows, w1, 1e-5, w2, 1e-5)
    ref, _ = draft.head_input_reference(tokens, table, hidden, rows, w1, 1e-5, w2, 1e-5)
    print(f"head_input {dtype}: max abs err {(x.float() - ref.float()).abs().max().item():.2e}")

# The verify-side kernels: the tree mask and the accept walk on random trees of the default size
from specheads.kernels import verify  # noqa: E402

bad = 0
for trial in range(100):
    g = torch.Generator().manual_seed(trial)
    b, n, kv = 8, 33, 512
    parents = torch.full((b, n), -1)
    for i in range(1, n):
        parents[:, i] = (torch.rand(b, generator=g) * i).long()
    depth = torch.zeros(b, n, dtype=torch.long)
    for i in range(1, n):
        depth[:, i] = depth.gather(1, parents[:, i: i + 1])[:, 0] + 1
    d = int(depth.max())
    tokens = torch.randint(0, 3, (b, n), generator=g)
    y = torch.randint(0, 3, (b, n), generator=g)
    valid = torch.rand(b, n, generator=g) < 0.9
    committed = torch.randint(0, kv - n, (b,), generator=g)
    args = [t.to(dev) for t in (parents, committed)]
    got = verify.tree_masks(*args, kv, d)
    want = verify.tree_masks_reference(*args, kv, d)
    acc = verify.accept(*(t.to(dev) for t in (tokens, parents, valid, depth)), got[0], y.to(dev), d)
    ref = verify.accept_reference(*(t.to(dev) for t in (tokens, parents, valid, depth)), want[0], y.to(dev), d)
    bad += int(not all(torch.equal(x, y_) for x, y_ in zip(got + acc, want + ref)))
print(f"tree mask + accept: {bad} of 100 random batches differ from the reference")

# The device n-gram lookup at the engine's shapes (batch 64, a 1,024-key bucket, chains of 8)
from specheads.kernels import ngram  # noqa: E402

bad = 0
for trial in range(50):
    g = torch.Generator().manual_seed(trial)
    b, w = 64, 1025
    h = torch.randint(0, 4 + trial, (b, w + 10), generator=g)[:, :w].to(dev)
    length = torch.randint(0, w, (b,), generator=g).to(dev)
    roots = torch.randint(0, 4 + trial, (b,), generator=g).to(dev)
    cols = torch.arange(8, device=dev)
    for max_ngram in (1, 3, 4, 6, 8):
        d, f = ngram.ngram_lookup(h, length, roots, cols, max_ngram)
        rd, rf = ngram.ngram_lookup_reference(h, length, roots, cols, max_ngram)
        bad += int(not (torch.equal(f, rf) and torch.equal(d[f], rd[rf])))
print(f"ngram lookup: {bad} of 250 random batches differ from the reference")

# The greedy pick (kernels/argmax.py) against torch's argmax: SmolLM2's and Qwen's vocabularies,
# 1 to 2,048 rows (batch 64 of 31-draft chains plus their roots), ties planted across chunks
from specheads.kernels.argmax import argmax_last  # noqa: E402

bad = 0
for trial, (rows, vocab) in enumerate([(1, 49152), (16, 49152), (2048, 49152), (1, 151936), (64, 151936)]):
    g = torch.Generator().manual_seed(trial)
    x = torch.randn(rows, vocab, generator=g).to(dev, torch.bfloat16)
    top = x.max().item() + 1
    x[0, [vocab - 1, 3]] = top  # a tie: the lower index wins
    x[-1, vocab // 2:] = top
    for _ in range(2):  # a second launch reads the counters the first one reset
        bad += int(not torch.equal(argmax_last(x), x.argmax(-1)))
print(f"argmax: {bad} of 10 launches differ from torch's")
