"""Every decoding method at every batch size: does it run, and how fast.

    python scripts/batch_sweep.py --target <dir|.gguf> --draft <head> \
        --batch-sizes 1 8 32 48 64 128 256 --methods ar eagle3-tree eagle3-chain ngram --out bench/batch_sweep

Each method runs in a process of its own over the batch sizes in ascending order (a device
fault poisons a CUDA context, so one method's failure cannot hide another's result). A cell is
one engine with `max_batch` = the batch size, fed that many prompts (the evaluation suite's,
cycled) so every row decodes; it records ok or the error, output tokens/s, the mean
acceptance length and the peak GPU memory. Prints a table, writes <out>.json and <out>.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

METHODS = ("ar", "eagle3-tree", "eagle3-chain", "ngram")


def run_method(args, method: str) -> list[dict]:
    """One process: every batch size for `method`; returns a row per batch size."""
    import torch

    from specheads.target.chat import render, stop_token_ids
    from specheads.heads.format import load_head
    from specheads.runtime.defaults import DEFAULT_TREE
    from specheads.evaluation.run import Method
    from specheads.runtime.engine import pooled
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.loader import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target, tok, _ = load_target(args.target, dtype=dtype, device=device)
    head = load_head(args.draft, device=device, dtype=dtype) if method.startswith("eagle3") else None
    texts = prompt_texts(args.prompts)
    prompts = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"][: args.max_prompt_tokens] for t in texts]
    stops = stop_token_ids(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
    spec = {"ar": Method("ar"), "ngram": Method("ngram", "ngram", num_draft_tokens=8),
            "eagle3-tree": Method("eagle3-tree", "eagle3", *DEFAULT_TREE),
            "eagle3-chain": Method("eagle3-chain", "eagle3", args.chain_steps, 1, args.chain_steps)}[method]
    rows, broken = [], None
    for b in sorted(args.batch_sizes):
        row = {"method": method, "batch": b}
        rows.append(row)
        if broken:
            row.update(status="not run", error=f"the CUDA context was lost at batch {broken}")
            continue
        try:
            engine = spec.engine(target, head, args.max_len, b)
            batch = [prompts[i % len(prompts)] for i in range(b)]
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                if args.capture_all:  # as a server starts: every batch, context and prompt-width bucket
                    row["graphs"] = engine.capture_common(range(1, b + 1))
            engine.generate(batch, params, stops)  # warm-up: the graphs this batch replays
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = engine.generate(batch, params, stops)
            if device == "cuda":
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            totals = pooled(results)
            row.update(status="ok", tokens=totals["tokens"], seconds=secs, tokens_per_s=totals["tokens"] / secs,
                       mean_accept_length=totals["mean_accept_length"],
                       peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None)
            del engine
        except Exception as e:  # noqa: BLE001 - recorded, and the sweep goes on where it can
            row.update(status="error", error=f"{type(e).__name__}: {e}"[:500], trace=traceback.format_exc()[-2000:])
            if "CUDA" in str(e) or "cuda" in type(e).__module__:
                broken = b
        print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def prompt_texts(source: str) -> list[str]:
    if source == "suite":
        from specheads.evaluation.suite import load_suite

        return [p.text for p in load_suite(split="test")]
    return json.loads(Path(source).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target folder, hub id or .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--draft", default=None, help="EAGLE-3 head for the eagle3 methods")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 48, 64, 128, 256])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=None, help="context per row (default: the engine's, up to 4096)")
    ap.add_argument("--chain-steps", type=int, default=6)
    ap.add_argument("--prompts", default="suite", help="'suite' (the evaluation suite's test prompts) or a JSON list")
    ap.add_argument("--capture-all", action="store_true",
                    help="capture every graph up front, as `specheads serve` does at start")
    ap.add_argument("--out", default="bench/batch_sweep")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("ROWS " + json.dumps(run_method(args, args.child)), flush=True)
        return
    import torch

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    rows = []
    for method in args.methods:
        if method.startswith("eagle3") and not args.draft:
            continue
        print(f"== {method}", flush=True)
        cmd = [sys.executable, __file__, "--child", method] + [a for a in sys.argv[1:]]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        got = [line for line in proc.stdout.splitlines() if line.startswith("ROWS ")]
        for line in proc.stdout.splitlines():
            if not line.startswith("ROWS "):
                print("   ", line, flush=True)
        if got:
            rows += json.loads(got[-1][5:])
        else:  # the process died (a fault outside Python's reach): every size it had left is unknown
            seen = {r["batch"] for r in rows if r["method"] == method}
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.append(r)
                    seen.add(r["batch"])
            rows += [{"method": method, "batch": b, "status": "error", "error": f"process exited {proc.returncode}"}
                     for b in args.batch_sizes if b not in seen]
    report = {"card": card, "date": time.strftime("%Y-%m-%d"), "target": args.target, "draft": args.draft,
              "max_new_tokens": args.max_new_tokens, "max_len": args.max_len, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"card {card}; {args.max_new_tokens} new tokens a prompt; every row of the batch busy")
    print(f"{'method':>14} {'batch':>5} {'status':>8} {'tok/s':>9} {'accept':>7} {'peak GiB':>8}")
    for r in rows:
        tps = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "-"
        acc = f"{r['mean_accept_length']:.2f}" if r.get("mean_accept_length") else "-"
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else "-"
        print(f"{r['method']:>14} {r['batch']:>5} {r['status']:>8} {tps:>9} {acc:>7} {peak:>8}"
              + (f"  {r['error'][:80]}" if r.get("error") else ""))
    plot(report, out.with_suffix(".png"))


def plot(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method in dict.fromkeys(r["method"] for r in report["rows"]):
        pts = [r for r in report["rows"] if r["method"] == method]
        ok = [r for r in pts if r["status"] == "ok"]
        ax.plot([r["batch"] for r in ok], [r["tokens_per_s"] for r in ok], marker="o", label=method)
        bad = [r for r in pts if r["status"] != "ok"]
        ax.scatter([r["batch"] for r in bad], [1] * len(bad), marker="x", color="red")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (rows decoding together)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{report['card']}: every method x batch size (x: failed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
