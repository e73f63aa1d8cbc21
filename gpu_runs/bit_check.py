"""Bit checks on the GPU: every kernel an engine step launches gives a fixed row the same output
bits at any batch size among random other rows, and a tree node the bits of its path's plain
decode (the interpreter does not exercise the tensor cores' accumulation, so CI cannot).

    python3 gpu_runs/bit_check.py --out $OUT/bit_check

SmolLM2-135M shapes (hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocab 49152), random
bf16 weights. Per kernel and variant: row 0 computed alone, then at batch 8, 32 and 256 (and
the row counts a tree verify and a prefill give: 41, 2048) with other random rows; "same" when
every bit of row 0 matches. Then the whole target forward: a prompt prefilled alone and among
other prompts of other lengths, and each node of a 41-node tree at batch 8 and 32 against the
plain decode of its path at batch 1, on the logits. Prints a table, writes <out>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specheads.kernels import attention, fused, linear
from specheads.kernels.verify import ancestors_reference

H, HQ, HKV, D, I, V = 576, 9, 3, 64, 1536, 49152
BATCHES = (8, 32, 256)


def _rand(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()


def check_linear(g) -> list[dict]:
    rows = []
    variants = {
        "qkv (norm)": dict(n=(HQ + 2 * HKV) * D, k=H, norm=True),
        "o_proj (+residual)": dict(n=H, k=HQ * D, residual=True),
        "gate_up (norm, silu)": dict(n=2 * I, k=H, norm=True, silu=True),
        "down (+residual)": dict(n=H, k=I, residual=True),
        "lm_head": dict(n=V, k=H),
    }
    for name, v in variants.items():
        w = _rand(v["n"], v["k"], g=g, scale=v["k"] ** -0.5)
        nw = (torch.rand(v["k"], generator=g, device="cuda") + 0.5).bfloat16() if v.get("norm") else None
        out_n = v["n"] // 2 if v.get("silu") else v["n"]
        big = 2048
        x = _rand(big, v["k"], g=g)
        res = _rand(big, out_n, g=g) if v.get("residual") else None

        def call(m):
            return linear.linear(x[:m], w, norm_weight=nw, eps=1e-5, silu=v.get("silu", False),
                                 residual=None if res is None else res[:m])
        alone = call(1)
        for m in BATCHES + (41, 2048):
            rows.append(dict(kernel="linear", variant=name, rows=m, same=bool(torch.equal(call(m)[:1], alone))))
    return rows


def check_small_kernels(g) -> list[dict]:
    rows = []
    x, r = _rand(2048, H, g=g), _rand(2048, H, g=g)
    nw = (torch.rand(H, generator=g, device="cuda") + 0.5).bfloat16()
    alone = fused.rmsnorm(x[:1], nw, 1e-5, r[:1])
    table = _rand(V, H, g=g)
    ids = torch.randint(0, V, (2048,), generator=g, device="cuda")
    emb_alone = fused.embedding(ids[:1], table)
    cos = torch.randn(4096, D, generator=g, device="cuda")
    sin = torch.randn(4096, D, generator=g, device="cuda")
    qkv = _rand(256, 1, (HQ + 2 * HKV) * D, g=g)
    pos = torch.randint(0, 4000, (256, 1), generator=g, device="cuda")

    def rope(m):
        kc = torch.zeros(m, HKV, 4096, D, dtype=torch.bfloat16, device="cuda")
        vc = torch.zeros_like(kc)
        q = fused.rope_cache(qkv[:m].contiguous(), cos, sin, pos[:m], kc, vc, pos[:m], HQ, HKV, D)
        return q[:1], kc[:1, :, pos[0, 0]]
    rope_alone = rope(1)
    for m in BATCHES + (2048,):
        got = fused.rmsnorm(x[:m], nw, 1e-5, r[:m])
        rows.append(dict(kernel="rmsnorm", variant="with residual", rows=m,
                         same=bool(torch.equal(got[0][:1], alone[0]) and torch.equal(got[1][:1], alone[1]))))
        rows.append(dict(kernel="embedding", variant="", rows=m, same=bool(torch.equal(fused.embedding(ids[:m], table)[:1],
                                                                                       emb_alone))))
        if m <= 256:
            got = rope(m)
            rows.append(dict(kernel="rope_cache", variant="q and cached k", rows=m,
                             same=bool(torch.equal(got[0], rope_alone[0]) and torch.equal(got[1], rope_alone[1]))))
    return rows


def _tree(n: int, g) -> tuple[torch.Tensor, torch.Tensor]:
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = int(torch.randint(max(0, i - 4), i, (1,), generator=g))
        parents.append(p)
        depth.append(depth[p] + 1)
    return torch.tensor(parents), torch.tensor(depth)


def check_attention(g, g_cpu) -> list[dict]:
    """g draws on the GPU, g_cpu the tree shapes and positions."""
    rows = []
    s = 1024
    kc, vc = _rand(256, HKV, s, D, g=g), _rand(256, HKV, s, D, g=g)
    q = _rand(256, HQ, 1, D, g=g)
    pos = torch.randint(100, 900, (256, 1), generator=g_cpu).cuda()
    for split in (None, True, False):
        alone = attention.causal_attention(q[:1], kc[:1], vc[:1], pos[:1], split=split)
        for m in BATCHES:
            got = attention.causal_attention(q[:m], kc[:m], vc[:m], pos[:m], split=split)
            rows.append(dict(kernel="causal_attention", variant=f"decode, split={split}", rows=m,
                             same=bool(torch.equal(got[:1], alone))))
    # a 41-node tree at base L, each node against the decode of its path (the path at L..L+d)
    n = 41
    for base_pos in (300, 383):  # the second tree crosses a 128-key chunk boundary
        for m in (1, 8, 32):
            parents, depth = zip(*(_tree(n, g_cpu) for _ in range(m)))
            parents, depth = torch.stack(parents).cuda(), torch.stack(depth).cuda()
            anc = ancestors_reference(parents, int(depth.max()))
            base = torch.full((m,), base_pos, device="cuda")
            tq = _rand(m, HQ, n, D, g=g)
            out = attention.causal_attention(tq, kc[:m], vc[:m], base[:, None] + depth, tree=(base, anc, depth))
            same = True
            for node in range(n):
                path = [node]
                while parents[0, path[-1]] >= 0:
                    path.append(int(parents[0, path[-1]]))
                path.reverse()
                k1, v1 = kc[:1].clone(), vc[:1].clone()
                for j, p in enumerate(path):
                    k1[0, :, base_pos + j], v1[0, :, base_pos + j] = kc[0, :, base_pos + p], vc[0, :, base_pos + p]
                p1 = torch.tensor([[base_pos + len(path) - 1]], device="cuda")
                dec = attention.causal_attention(tq[:1, :, node:node + 1].contiguous(), k1, v1, p1)
                same &= bool(torch.equal(dec[0, :, 0], out[0, :, node]))
            rows.append(dict(kernel="causal_attention", variant=f"41-node tree at {base_pos} vs path decode", rows=m,
                             same=same))
    # a prefill: a prompt alone and among others (right-padded to the longest)
    t = 700
    pq = _rand(32, HQ, t, D, g=g)
    ppos = torch.arange(t, device="cuda").expand(32, t)
    alone = attention.causal_attention(pq[:1, :, :300].contiguous(), kc[:1, :, :300], vc[:1, :, :300], ppos[:1, :300])
    for m in (8, 32):
        got = attention.causal_attention(pq[:m], kc[:m, :, :t], vc[:m, :, :t], ppos[:m])
        rows.append(dict(kernel="causal_attention", variant="prefill 300 tokens among 700-token prompts", rows=m,
                         same=bool(torch.equal(got[:1, :, :300], alone))))
    return rows


def check_forward(g) -> list[dict]:
    """The whole target: prefill alone vs in a group; tree verify at batch 8/32 vs path decode."""
    from transformers import LlamaConfig

    from specheads.target.model import KVCache, TargetModel

    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=30, num_attention_heads=HQ,
                      num_key_value_heads=HKV, head_dim=D, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = TargetModel(cfg).to("cuda", torch.bfloat16).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
        for mod in model.modules():
            if hasattr(mod, "weight") and mod.__class__.__name__ == "RMSNorm":
                mod.weight.fill_(1.0)
    model.fuse_for_inference()
    rows = []
    prompt = torch.randint(0, V, (32, 400), generator=g).cuda()
    with torch.no_grad():
        cache1 = KVCache(model.spec, 1, 1024, torch.bfloat16, "cuda")
        alone = model(prompt[:1, :250], cache=cache1, kv_len=250).logits
        for m in (8, 32):
            cache = KVCache(model.spec, m, 1024, torch.bfloat16, "cuda")
            got = model(prompt[:m], cache=cache, kv_len=400).logits
            rows.append(dict(kernel="target forward", variant="prefill 250 tokens among 400", rows=m,
                             same=bool(torch.equal(got[:1, :250], alone))))
        n, L = 41, 250
        for m in (1, 8, 32):
            parents, depth = zip(*(_tree(n, g) for _ in range(m)))
            parents, depth = torch.stack(parents).cuda(), torch.stack(depth).cuda()
            anc = ancestors_reference(parents, int(depth.max()))
            cache = KVCache(model.spec, m, 1024, torch.bfloat16, "cuda")
            model(prompt[:m, :L], cache=cache, kv_len=L)
            toks = torch.randint(0, V, (m, n), generator=g).cuda()
            base = torch.full((m,), L, device="cuda")
            slots = base[:, None] + torch.arange(n, device="cuda")
            out = model(toks, base[:, None] + depth, cache=cache, kv_len=1024, tree=(base, anc, depth),
                        cache_slots=slots).logits
            same = True
            for node in range(0, n, 5):
                path = [node]
                while parents[0, path[-1]] >= 0:
                    path.append(int(parents[0, path[-1]]))
                path.reverse()
                c1 = KVCache(model.spec, 1, 1024, torch.bfloat16, "cuda")
                model(prompt[:1, :L], cache=c1, kv_len=L)
                for j, p in enumerate(path):  # plain decode, one token a step
                    last = model(toks[:1, p:p + 1], torch.tensor([[L + j]], device="cuda"), cache=c1, kv_len=1024,
                                 tree=(torch.tensor([L + j], device="cuda"), torch.ones(1, 1, 1, dtype=torch.bool,
                                       device="cuda"), torch.zeros(1, 1, dtype=torch.long, device="cuda"))).logits
                same &= bool(torch.equal(last[0, 0], out[0, node]))
            rows.append(dict(kernel="target forward", variant="41-node tree vs decode of each path (every 5th node)",
                             rows=m, same=same))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bit_check")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="kernel tuning fields to check instead of the defaults (integers or words), e.g. "
                         "attention_tree_many_batch=1 attention_tree_tokens=3 linear_norm=folded")
    args = ap.parse_args()
    if args.set:
        from specheads.kernels import tuning

        tuning.use(tuning.active().replace(**{k: int(v) if v.lstrip("-").isdigit() else v
                                              for k, v in (item.split("=") for item in args.set)}))
    g = torch.Generator().manual_seed(0)
    gc = torch.Generator(device="cuda").manual_seed(0)
    rows = check_linear(gc) + check_small_kernels(gc) + check_attention(gc, g) + check_forward(g)
    report = {"card": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "set": args.set, "rows": rows,
              "all_same": all(r["same"] for r in rows)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"card {report['card']}")
    print(f"{'kernel':>18} {'variant':>52} {'rows':>5} same")
    for r in rows:
        print(f"{r['kernel']:>18} {r['variant']:>52} {r['rows']:>5} {'yes' if r['same'] else 'NO'}")
    print("all same" if report["all_same"] else "SOME DIFFER")


if __name__ == "__main__":
    main()
