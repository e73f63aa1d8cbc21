"""On the GPU: every Triton kernel against its torch reference at the engine's shapes (bf16
and float32), and the fused engine's tokens against the unfused one's. Prints max errors.
    python3 scripts/gpu/check_kernels.py"""
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
