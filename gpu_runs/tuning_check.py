"""On the GPU: kernel tuning's Speed fields leave every output bit as it is; Numerics fields may
not. Random-weight bf16 targets (SmolLM2-135M's shape, and Llama-3.1-8B's with 2 layers): the
graphed forward over k tokens after a 200-token context, under the default tuning and under each
variant below; logits and KV cache compared bit for bit with the default's.

    python3 gpu_runs/tuning_check.py [--out DIR]

Also draft.topk_expand under each Speed.draft_warps (drafts only: reported, never a failure).
Prints a table and writes tuning_check.json under --out; exits 1 if a Speed variant changed a
bit of the target's logits or cache (a Numerics variant may: those rows show which do)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # bench.py
from bench import LLAMA_8B, chain_inputs, prefill_random, random_target  # noqa: E402

from specheads.kernels import tuning  # noqa: E402
from specheads.kernels.linear import layer_shapes  # noqa: E402
from specheads.runtime.graphs import GraphedForward  # noqa: E402
from specheads.target.model import KVCache  # noqa: E402

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rms_norm_eps=1e-5)
CONTEXT, BUCKET = 200, 256


def variants(spec) -> dict[str, tuple[str, dict]]:
    """name -> (group, fields for KernelTuning.replace)."""
    d = tuning.KernelTuning()
    shapes = layer_shapes(spec.hidden_size, spec.num_attention_heads * spec.head_dim, spec.intermediate_size)
    qkv = ((spec.num_attention_heads + 2 * spec.num_key_value_heads) * spec.head_dim, spec.hidden_size)
    from specheads.kernels.linear import _config

    layer = (*shapes, qkv)

    def tiles(change):  # Speed.linear_tiles: every layer shape's rule (BLOCK_N, stages), changed
        return {**d.speed.linear_tiles, **{s: change(_config(*s)[0], _config(*s)[3]) for s in layer}}

    def with_warps(warps):  # Numerics.linear_shapes: the rule's K steps, these warps
        return {**d.numerics.linear_shapes, **{s: (_config(*s)[1], warps) for s in layer}}

    return {
        "row_block_32": ("speed", {"linear_row_block": 32}),
        "row_block_64": ("speed", {"linear_row_block": 64}),
        "tree_n_scale_1": ("speed", {"linear_tree_n_scale": 1}),
        "tree_n_scale_4": ("speed", {"linear_tree_n_scale": 4}),
        "layer_tiles_block_n_x2": ("speed", {"linear_tiles": tiles(lambda bn, st: (2 * bn, st))}),
        "layer_tiles_stages_2": ("speed", {"linear_tiles": tiles(lambda bn, st: (bn, 2))}),
        "prefetch_0": ("speed", {"linear_prefetch_bytes": 0}),
        "norm_keys_0": ("speed", {"linear_norm_keys": 0}),
        "pdl_none": ("speed", {"pdl_kernels": frozenset()}),
        "pdl_all": ("speed", {"pdl_kernels": tuning.PDL_KERNEL_NAMES}),
        "layer_warps_2": ("numerics", {"linear_shapes": with_warps(2)}),
        "layer_warps_8": ("numerics", {"linear_shapes": with_warps(8)}),
        "tree_warps_2": ("numerics", {"linear_tree_warps": 2}),
        "tree_warps_8": ("numerics", {"linear_tree_warps": 8}),
        "attn_row_block_32": ("numerics", {"attention_row_block": 32}),
        "attn_row_block_64": ("numerics", {"attention_row_block": 64}),
        "attn_row_block_128": ("numerics", {"attention_row_block": 128}),
        "attention_chunk_64": ("numerics", {"attention_chunk": 64}),
        "attention_sdpa": ("numerics", {"attention": "sdpa"}),
    }


def forward(model, k: int):
    dev, dt = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    cache = KVCache(model.spec, 1, BUCKET, dt, dev)
    prefill_random(model, cache, CONTEXT)
    graphed = GraphedForward(model, cache, k, tree=True)
    toks, pos, mask = chain_inputs(cache, CONTEXT, k)
    logits = graphed(toks, pos, pos, mask).logits.clone()
    torch.cuda.synchronize()
    return logits, cache.k[:, :, :, :CONTEXT + k].clone(), cache.v[:, :, :, :CONTEXT + k].clone()


def draft_warps_rows() -> list[dict]:
    """draft.topk_expand (a draft depth's expansion and next layer input: batch 4, 4 frontier
    nodes, top-4, a 32000-entry draft vocabulary, hidden 576, bf16) under each Speed.draft_warps,
    compared bit for bit with the default's."""
    from specheads.kernels.draft import topk_expand

    g = torch.Generator(device="cuda").manual_seed(3)
    b, n, k, vocab, h = 4, 4, 4, 32000, 576
    logits = (torch.randn(b, n, vocab, generator=g, device="cuda") * 3).to(torch.bfloat16)
    front_score = -torch.rand(b, n, generator=g, device="cuda")
    front_pool = torch.arange(n, device="cuda").repeat(b, 1)
    target_ids = torch.arange(vocab, device="cuda")
    emb = torch.randn(vocab, h, generator=g, device="cuda").to(torch.bfloat16)
    hidden = torch.randn(b, n, h, generator=g, device="cuda").to(torch.bfloat16)
    ones = torch.ones(h, device="cuda", dtype=torch.bfloat16)

    def run():
        pools = [torch.zeros(b, n * k, dtype=dt, device="cuda") for dt in (torch.long, torch.float32, torch.long)]
        out = topk_expand(logits, front_score, front_pool, k, target_ids, *pools, 0,
                          next_input=(emb, hidden, ones, 1e-5, ones, 1e-5))
        torch.cuda.synchronize()
        return [t.clone() for t in (*out, *pools)]

    base = run()
    rows = []
    for warps in tuning.WARPS:
        with tuning.using(tuning.KernelTuning().replace(draft_warps=warps)):
            got = run()
        same = all(torch.equal(x, y) for x, y in zip(base, got))
        rows.append({"variant": f"draft_warps_{warps}", "same": same})
        print(f"topk_expand draft_warps={warps:2}: {'same' if same else 'DIFFER'}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", nargs="*", default=["smollm2", "llama8b_2layers"])
    ap.add_argument("--ks", type=int, nargs="*", default=[1, 8, 41], help="tokens per forward")
    a = ap.parse_args()
    report = {"card": torch.cuda.get_device_name(), "rows": []}
    bad = []
    with torch.no_grad():
        models = {"smollm2": SMOLLM2, "llama8b_2layers": {**LLAMA_8B, "num_hidden_layers": 2}}
        for name in a.models:
            cfg = models[name]
            torch.manual_seed(0)
            model = random_target(cfg, "cuda", torch.bfloat16)
            for k in a.ks:
                base = forward(model, k)
                for label, (group, fields) in variants(model.spec).items():
                    with tuning.using(tuning.KernelTuning().replace(**fields)):
                        got = forward(model, k)
                    same = [bool(torch.equal(x, y)) for x, y in zip(base, got)]
                    row = {"model": name, "k": k, "variant": label, "group": group,
                           "logits_same": same[0], "kv_same": same[1] and same[2]}
                    report["rows"].append(row)
                    print(f"{name:16} k={k:2} {group:8} {label:22} logits {'same' if same[0] else 'DIFFER':6} "
                          f"kv {'same' if row['kv_same'] else 'DIFFER'}", flush=True)
                    if group == "speed" and not all(same):
                        bad.append(row)
            del model
            torch.cuda.empty_cache()
    with torch.no_grad():
        report["draft_warps"] = draft_warps_rows()  # drafts only: never a bit of the output
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tuning_check.json").write_text(json.dumps(report, indent=1))
    print(f"speed variants that changed a bit: {len(bad)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
