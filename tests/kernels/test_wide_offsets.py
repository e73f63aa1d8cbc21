"""Kernels that index a buffer of many rows compute their offsets in 64 bits.

A KV cache of SmolLM2 at 4k context passes 2^31 elements at ~48 rows: with 32-bit offsets the
commit wrote to an illegal address at batch 48 and 64 (an H200 run died in the warm-up before
graph capture). Here each kernel runs under Triton's interpreter on a buffer whose row (or layer)
stride fits 32 bits while row * stride does not. The buffers are allocated with torch.empty and
only the rows a case reads or writes are touched, so their pages never exist. A 32-bit offset
wraps to an address outside the buffer, which kills the process, so each case runs in a
subprocess and reports its result on stdout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.kernels.interpret import needs_triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
BIG = 2**30 + 64  # elements between two rows: fits int32; row 2 starts past 2^31
"""

CASES = {
    # cache [layers, rows, heads, slots, dim] with stride(0) = BIG: layer 2 starts at 2^31 + 128
    "kv_commit": """
from specheads.kernels import kv_commit
slots, dim = BIG // 16, 16
cache = torch.empty((3, 1, 1, slots, dim), dtype=torch.float16)
base, src, n = torch.tensor([slots - 8]), torch.tensor([[0, 2, 3]]), torch.tensor([3])
region = cache[:, :, :, slots - 8:]
region.copy_(torch.arange(region.numel(), dtype=torch.float16).view(region.shape))
want = region.clone()
kv_commit.commit_kv_reference(want, torch.tensor([0]), src, n)
kv_commit.commit_kv_triton(cache, base, src, n)
print("OK" if torch.equal(region, want) else "MISMATCH")
""",
    # keys / values [rows, kv heads, slots, dim] seen through a view whose row stride is BIG
    "attention": """
from specheads.kernels import attention
rows, dim, keys = 3, 16, 64
store_k = torch.empty((rows, 1, BIG // dim, dim), dtype=torch.float32)
store_v = torch.empty((rows, 1, BIG // dim, dim), dtype=torch.float32)
k, v = store_k[:, :, :keys], store_v[:, :, :keys]
g = torch.Generator().manual_seed(0)
k.copy_(torch.randn(k.shape, generator=g)); v.copy_(torch.randn(v.shape, generator=g))
q = torch.randn(rows, 2, 3, dim, generator=g)
mask = torch.rand(rows, 1, 3, keys, generator=g) < 0.7
mask[..., 0] = True
out = attention.tree_attention(q, k, v, mask)
ref = attention.attention_reference(q, k.clone(), v.clone(), mask)
print("OK" if torch.allclose(out, ref, atol=1e-5, rtol=1e-5) else "MISMATCH")
""",
    # the layer's cache rows [rows, kv heads, slots, dim] with row stride BIG
    "rope_cache": """
from specheads.kernels import fused
rows, t, heads, n_kv, dim = 3, 2, 2, 1, 16
slots = 32
k_store = torch.empty((rows, n_kv, BIG // dim, dim), dtype=torch.float32)
v_store = torch.empty((rows, n_kv, BIG // dim, dim), dtype=torch.float32)
k_cache, v_cache = k_store[:, :, :slots], v_store[:, :, :slots]
k_cache.zero_(); v_cache.zero_()
g = torch.Generator().manual_seed(0)
qkv = torch.randn(rows, t, (heads + 2 * n_kv) * dim, generator=g)
cos, sin = torch.randn(64, dim, generator=g), torch.randn(64, dim, generator=g)
pos = torch.tensor([[3, 4], [7, 8], [1, 2]])
slot = torch.tensor([[3, 4], [7, 8], [30, 31]])
q = fused.rope_cache(qkv, cos, sin, pos, k_cache, v_cache, slot, heads, n_kv, dim)
k_ref, v_ref = torch.zeros(rows, n_kv, slots, dim), torch.zeros(rows, n_kv, slots, dim)
q_ref = fused.rope_cache_reference(qkv, cos, sin, pos, k_ref, v_ref, slot, heads, n_kv, dim)
same = torch.allclose(q, q_ref) and torch.allclose(k_cache, k_ref) and torch.allclose(v_cache, v_ref)
print("OK" if same else "MISMATCH")
""",
    # the drafter's features [rows, slots, hidden] with row stride BIG
    "head_input": """
from specheads.kernels import draft
rows, t, h, vocab = 3, 2, 16, 20
store = torch.empty((rows, BIG // h, h), dtype=torch.float32)
hidden = store[:, :4]
g = torch.Generator().manual_seed(0)
hidden.copy_(torch.randn(hidden.shape, generator=g))
table = torch.randn(vocab, h, generator=g)
tokens = torch.randint(0, vocab, (rows, t), generator=g)
sel = torch.tensor([[3, 0], [1, 2], [2, 3]])
w_e, w_h = torch.randn(h, generator=g), torch.randn(h, generator=g)
x, hid = draft.head_input(tokens, table, hidden, sel, w_e, 1e-5, w_h, 1e-6)
rx, rhid = draft.head_input_reference(tokens, table, hidden.clone(), sel, w_e, 1e-5, w_h, 1e-6)
print("OK" if torch.allclose(x, rx, atol=1e-5) and torch.equal(hid, rhid) else "MISMATCH")
""",
}


@needs_triton
@pytest.mark.parametrize("case", sorted(CASES))
def test_offsets_past_two_to_the_31(case):
    script = PRELUDE + textwrap.dedent(CASES[case])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (
        f"{case} died (exit {proc.returncode}: a 32-bit offset wrapped outside the buffer?)\n{proc.stderr[-2000:]}")
    assert proc.stdout.strip().splitlines()[-1] == "OK", proc.stdout + proc.stderr[-2000:]
