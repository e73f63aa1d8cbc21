"""On the GPU: a target layer's kernels at the row counts of a decode (1 token), a draft depth
(8) and the default tree's verify (41), SmolLM2-135M shapes with random weights, a context of
200 in a 256-key bucket. Each op is called 30 times in a row inside one CUDA graph; the figure
is a call's mean time over 20 replays, PDL off and on. Knobs compared in the same process: with
--forward the graphed forward over K-token trees (default 41) by the projection's row block and column
scale for 17-64 rows (kernel tuning: linear_row_block, linear_tree_n_scale, linear_tree_warps;
logits checked bit for bit); the attention by keys per program (attention_chunk); lm_heads by tile.

    python3 gpu_runs/verify_kernels.py [--out DIR] [--forward [K ...]] [--head-tiles]

Prints a table and writes verify_kernels.json under --out."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from specheads.kernels import attention, tuning
from specheads.kernels.fused import rope_cache
from specheads.kernels.linear import linear as proj
from specheads.modules import RotaryTable
from timing import graph_us

H, I, V, HEADS, KV, D = 576, 1536, 49152, 9, 3, 64
CONTEXT, BUCKET, CALLS = 200, 256, 30
DEVICE = "cuda"


def use_pdl(on: bool) -> None:
    """The default kernel tuning, with PDL for the forward's kernels (on) or for none."""
    tuning.use(tuning.KernelTuning().replace(pdl_kernels=tuning.PDL_DEFAULT if on else frozenset()))


def per_call_us(fn, replays: int = 20) -> float:
    return graph_us(fn, calls=CALLS, replays=replays)


def ops(rows: int) -> dict:
    """The forward's kernels for `rows` tokens of one sequence (a chain: each sees the ones before)."""
    dev, dt = DEVICE, torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(rows)

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dt)

    x, h = rnd(1, rows, H, scale=1.0), rnd(1, rows, H, scale=1.0)
    w = {"qkv": rnd((HEADS + 2 * KV) * D, H), "o": rnd(H, HEADS * D), "gate_up": rnd(2 * I, H), "down": rnd(H, I),
         "lm_head": rnd(V, H)}
    norm = torch.ones(H, device=dev, dtype=dt)
    attn_in, act = rnd(1, rows, HEADS * D, scale=1.0), rnd(1, rows, I, scale=1.0)
    qkv = rnd(1, rows, (HEADS + 2 * KV) * D, scale=1.0)
    k_cache, v_cache = rnd(1, KV, BUCKET + 64, D, scale=1.0), rnd(1, KV, BUCKET + 64, D, scale=1.0)
    pos = torch.arange(CONTEXT, CONTEXT + rows, device=dev)[None]
    with torch.device(dev):
        rotary = RotaryTable(1.0 / (100000.0 ** (torch.arange(0, D, 2).float() / D)), 1.0, 4096)
    cos, sin = rotary.cos, rotary.sin
    q = rnd(1, HEADS, rows, D, scale=1.0)
    cols = torch.arange(BUCKET, device=dev)
    mask = ((cols[None, :] < CONTEXT) | ((cols[None, :] >= CONTEXT) & (cols[None, :] <= pos[0, :, None])))[None, None]
    logits = rnd(1, rows, V, scale=1.0)
    return {
        "qkv+norm": lambda: proj(x, w["qkv"], norm_weight=norm, eps=1e-5),
        "rope_cache": lambda: rope_cache(qkv, cos, sin, pos, k_cache, v_cache, pos, HEADS, KV, D),
        "attention": lambda: attention.tree_attention(q, k_cache[:, :, :BUCKET], v_cache[:, :, :BUCKET], mask),
        "o+res": lambda: proj(attn_in, w["o"], residual=h),
        "gate_up+norm+silu": lambda: proj(h, w["gate_up"], norm_weight=norm, eps=1e-5, silu=True),
        "down+res": lambda: proj(act, w["down"], residual=h),
        "lm_head+norm": lambda: proj(h, w["lm_head"], norm_weight=norm, eps=1e-5),
        "argmax": lambda: logits.argmax(-1),
    }


def forward_knobs(ks=(41,)) -> list[dict]:
    """The graphed SmolLM2 forward over k-token chains (a tree verify of k rows) and over 1 token,
    random weights, PDL on, for each (linear_row_block, linear_tree_n_scale, linear_tree_warps); logits compared
    bit for bit with the first setting's (16, 1, the tile's warps)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # bench.py; pdl_check.py sits beside this file
    from bench import chain_inputs, graphed_ms, prefill_random, random_target
    from pdl_check import SMOLLM2

    from specheads.runtime.graphs import GraphedForward
    from specheads.target.model import KVCache

    torch.manual_seed(0)
    model = random_target(SMOLLM2, DEVICE, torch.bfloat16)
    rows, ref = [], {}
    shipped = tuning.active()
    for block, scale, warps in [(16, 1, 0), (16, 2, 0), (16, 4, 0), (32, 1, 0), (32, 2, 0), (64, 1, 0), (32, 1, 8),
                                (32, 2, 8), (64, 1, 8), (16, 2, 8), (32, 1, 2)]:
        tuning.use(shipped.replace(linear_row_block=block, linear_tree_n_scale=scale, linear_tree_warps=warps))
        for k in (*ks, 1):
            if k <= 16 and (block, scale, warps) != (16, 1, 0):
                continue  # calls of up to 16 rows do not read these knobs
            cache = KVCache(model.spec, 1, BUCKET, torch.bfloat16, DEVICE)
            prefill_random(model, cache, CONTEXT)
            graphed = GraphedForward(model, cache, k, tree=True)
            toks, pos, mask = chain_inputs(cache, CONTEXT, k)
            logits = graphed(toks, pos, pos, mask).logits.clone()
            ms = graphed_ms(graphed, toks, pos, mask, 50, warmup=0, rounds=5)  # best of 5 rounds of 50
            ref.setdefault(k, logits)
            rows.append({"row_block": block, "tree_n_scale": scale, "tree_warps": warps, "k": k, "ms": ms,
                         "identical": bool(torch.equal(logits, ref[k]))})
            print(f"forward k={k:2} ROW_BLOCK={block:2} TREE_N_SCALE={scale} TREE_WARPS={warps}: {ms:.3f} ms, "
                  f"logits identical to (16, 1): {rows[-1]['identical']}", flush=True)
            del graphed, cache
    tuning.use(shipped)
    return rows


def kernel_knobs() -> list[dict]:
    """Per call us of the attention by chunk at 1, 8, 41 rows and of an lm_head by tile: the
    draft head's (32000 x 576) at 8 rows, the target's (49152 x 576) at 1 and 41 (output bits
    compared with the rule's tile); a tile that does not fit: us None."""
    out = []

    def add(knob, kernel, rows, fn):
        try:
            us = per_call_us(fn)
        except Exception as e:  # noqa: BLE001 (an out-of-resources tile is a result here)
            print(f"{knob} {kernel} {rows}: {type(e).__name__}")
            us = None
        out.append({"knob": knob, "kernel": kernel, "rows": rows, "us": us})

    shipped = tuning.active()
    for block in (16,):
        for chunk in (64, 128, 256):
            tuning.use(shipped.replace(attention_row_block=block, attention_chunk=chunk))
            for rows in (1, 8, 41):
                add(f"attention ROW_BLOCK={block} CHUNK={chunk}", "attention", rows, ops(rows)["attention"])
    tuning.use(shipped)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    norm = torch.ones(H, device=DEVICE, dtype=torch.bfloat16)
    for vocab, rows_list in ((32000, (8,)), (V, (1, 41))):  # the draft head's lm_head, the target's
        w = (torch.randn(vocab, H, generator=g, device=DEVICE) * 0.05).to(torch.bfloat16)
        for rows in rows_list:
            x = torch.randn(1, rows, H, generator=g, device=DEVICE).to(torch.bfloat16)
            want = proj(x, w, norm_weight=norm, eps=1e-5)
            for tile in [None, (256, 64, 8, 3), (256, 64, 4, 3), (128, 64, 8, 4), (512, 64, 8, 2), (128, 32, 4, 4)]:
                label = f"lm_head {vocab} tile={tile or 'rule'}"
                add(label, "lm_head", rows, lambda: proj(x, w, norm_weight=norm, eps=1e-5, tile=tile))
                if out[-1]["us"] is not None:
                    out[-1]["identical"] = bool(torch.equal(proj(x, w, norm_weight=norm, eps=1e-5, tile=tile), want))
    return out


def head_tiles(rows: int = 4) -> list[dict]:
    """The draft head's projections (SmolLM2's EAGLE-3 head) at a draft depth's rows, PDL on, by
    tile (BLOCK_N, BLOCK_K, warps, stages; None: the weight shape's rule): us per call and
    whether the output bits equal the rule's."""
    g = torch.Generator(device=DEVICE).manual_seed(7)
    dt = torch.bfloat16

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dt)

    norm = torch.ones(H, device=DEVICE, dtype=dt)
    h = rnd(1, rows, H, scale=1.0)
    cases = {  # name: (weight, input, kwargs)
        "qkv 960x1152": (rnd((HEADS + 2 * KV) * D, 2 * H), rnd(1, rows, 2 * H, scale=1.0), {}),
        "o+res 576x576": (rnd(H, HEADS * D), rnd(1, rows, HEADS * D, scale=1.0), {"residual": h}),
        "gate_up+norm+silu 3072x576": (rnd(2 * I, H), h, {"norm_weight": norm, "eps": 1e-5, "silu": True}),
        "down+res 576x1536": (rnd(H, I), rnd(1, rows, I, scale=1.0), {"residual": h}),
        "fc 576x1728 (7 rows)": (rnd(H, 3 * H), rnd(1, 7, 3 * H, scale=1.0), {}),
    }
    tiles = [None] + [(bn, bk, w, 3) for bn in (16, 32, 64) for bk in (64, 128) for w in (2, 4)]
    out = []
    for name, (w, x, kw) in cases.items():
        want = proj(x, w, **kw)
        for tile in tiles:
            try:
                us = per_call_us(lambda: proj(x, w, tile=tile, **kw))
                same = bool(torch.equal(proj(x, w, tile=tile, **kw), want))
            except Exception as e:  # noqa: BLE001 (a tile that does not fit is a result)
                us, same = None, f"{type(e).__name__}"
            out.append({"weight": name, "rows": rows, "tile": tile, "us": us, "identical": same})
            print(f"head {name:28} tile={str(tile or 'rule'):22} " + ("failed" if us is None else f"{us:7.2f} us")
                  + f"  same bits as rule: {same}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--forward", type=int, nargs="*", metavar="K",
                    help="also the forward over K-token trees (default 41) by linear_row_block, linear_tree_n_scale")
    ap.add_argument("--head-tiles", action="store_true", help="only the draft head's projections by tile (4 rows)")
    a = ap.parse_args()
    report = {"card": torch.cuda.get_device_name(), "rows": {}, "knobs": []}
    if a.head_tiles:
        use_pdl(True)
        with torch.no_grad():
            report["head_tiles"] = head_tiles()
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "verify_kernels_head_tiles.json").write_text(json.dumps(report, indent=1))
        return
    with torch.no_grad():
        for pdl in (False, True):
            use_pdl(pdl)
            for rows in (1, 8, 41):
                times = {name: per_call_us(fn) for name, fn in ops(rows).items()}
                report["rows"][f"{rows}{'_pdl' if pdl else ''}"] = times
            table = {r: report["rows"][f"{r}{'_pdl' if pdl else ''}"] for r in (1, 8, 41)}
            print(f"PDL {'on' if pdl else 'off'}: us per call")
            print(f"{'kernel':20} {'1 row':>8} {'8 rows':>8} {'41 rows':>8}")
            for name in table[1]:
                print(f"{name:20} {table[1][name]:8.2f} {table[8][name]:8.2f} {table[41][name]:8.2f}")
            print(f"{'sum':20} " + " ".join(f"{sum(table[r].values()):8.2f}" for r in (1, 8, 41)), flush=True)
        use_pdl(True)
        if a.forward is not None:
            report["forward"] = forward_knobs(tuple(a.forward) or (41,))
        report["knobs"] = kernel_knobs()
    print("knobs (PDL on): us per call")
    for r in report["knobs"]:
        us = "failed" if r["us"] is None else f"{r['us']:8.2f}"
        print(f"{r['knob']:44} {r['kernel']:14} {r['rows']:3} rows {us}  {r.get('identical', '')}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_kernels.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
