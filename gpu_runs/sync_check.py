"""Where the engine's serving loop makes the host wait for the card, by call site, needing no staged
files: random weights at SmolLM2-135M's shapes (the target and an EAGLE-3 head), requests of random
lengths and budgets (a third of them sampled) joining and leaving a batch as rows free up, under
torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`: every operation that synchronizes
with the stream, e.g. a blocking copy of a host scalar to the card, `.item()` of a device tensor, a
pageable copy). Reading a step's result through its event (`_finish`, `_read_prefill`) is the one
intended wait and is not an operation the mode flags. Each engine runs its requests twice: the first
pass warms up (graphs are captured at start, `capture_common`), the second is watched.

    python3 gpu_runs/sync_check.py [--max-batch 16] [--prompts 64] [--tokens 160] [--layers 30] [--checkout DIR]
        [--methods ar eagle3+ngram:fixed eagle3+ngram:adaptive ngram:fixed] [--out $OUT/sync_check.json]

Another checkout's engine: `--checkout .dev/old-COMMIT` (`git archive COMMIT specheads` there: its
`specheads` is imported instead of this one's, which the report names). Prints, per engine, the waits by
call site, the steps and the seconds of the watched pass; on a CPU (no sync mode) it runs the same passes
as a smoke run."""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_step_times import build  # noqa: E402


def requests(n: int, tokens: int = 160, seed: int = 0) -> list[tuple[list[int], dict]]:
    """n prompts of 8-300 random tokens, budgets of tokens / 10 to `tokens`; every third request sampled."""
    rng = random.Random(seed)
    return [([rng.randrange(10, 40000) for _ in range(rng.randrange(8, 300))],
             dict(max_new_tokens=rng.randrange(max(1, tokens // 10), tokens + 1),
                  temperature=0.7 if i % 3 == 2 else 0.0, seed=i))
            for i in range(n)]


def serve(engine, todo: list[tuple[list[int], dict]]) -> tuple[int, int]:
    """Every request added as rows free up and stepped to its end: (steps, tokens)."""
    from specheads.runtime.engine import Request
    from specheads.runtime.sampling import SamplingParams

    todo, steps, tokens = list(todo), 0, 0
    while engine.has_work or todo:
        while todo and engine.free_slots:
            prompt, params = todo.pop(0)
            engine.add(Request(prompt, SamplingParams(**params)))
        tokens += sum(len(out.new_tokens) for out in engine.step())
        steps += 1
    return steps, tokens


class Waits:
    """Counts the sync debug mode's warnings by the innermost specheads frame that raised them."""

    def __init__(self, cuda: bool):
        self.cuda, self.sites = cuda, Counter()

    def _seen(self, message, category, filename, lineno, file=None, line=None):
        ours = [f for f in traceback.extract_stack()[:-1] if "/specheads/" in f.filename]
        where = (f"{ours[-1].filename.rsplit('/specheads/', 1)[-1]}:{ours[-1].lineno} {ours[-1].line}"
                 if ours else f"{filename}:{lineno}")
        self.sites[where] += 1

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._seen
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(*exc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=160, help="the most new tokens a request asks for")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--methods", nargs="+",
                    default=["ar", "eagle3+ngram:fixed", "eagle3+ngram:adaptive", "ngram:fixed"],
                    help="METHOD:POLICY (the policy: fixed or adaptive; ar has none)")
    ap.add_argument("--checkout", default=None, help="a folder holding another checkout's specheads, run instead")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.checkout:  # (before anything imports specheads; draft_step_times put this checkout first)
        sys.path.insert(0, str(Path(args.checkout).resolve()))
    import specheads
    from specheads.runtime.engine import SpecEngine

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    target, head = build("eagle3", dev, torch.bfloat16 if cuda else torch.float32, args.layers)
    todo = requests(args.prompts, args.tokens)
    print(f"specheads from {Path(specheads.__file__).parent}")
    report = {"card": torch.cuda.get_device_name() if cuda else "cpu", "sync_debug_mode": cuda,
              "specheads": str(Path(specheads.__file__).parent),
              "max_batch": args.max_batch, "prompts": len(todo), "rows": []}
    for spec in args.methods:
        method, _, policy = spec.partition(":")
        kw = {} if method == "ar" else dict(speculation_policy=policy or "fixed")
        engine = SpecEngine(target, head if method.startswith("eagle3") else None, method=method,
                            max_batch=args.max_batch, max_len=1024, num_steps=6, topk=4, num_draft_tokens=15, **kw)
        if engine.use_graphs:
            engine.capture_common(range(1, args.max_batch + 1))
        serve(engine, todo)  # (warm-up: every graph and bucket met once)
        if cuda:
            torch.cuda.synchronize()
        with Waits(cuda) as waits:
            t0 = time.perf_counter()
            steps, tokens = serve(engine, todo)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        row = {"method": spec, "steps": steps, "tokens": tokens, "seconds": round(seconds, 3),
               "waits": sum(waits.sites.values()), "sites": dict(waits.sites.most_common())}
        report["rows"].append(row)
        print(f"{spec:24s} {steps:5d} steps  {tokens:6d} tokens  {seconds:6.2f} s  waits {row['waits']}", flush=True)
        for site, n in waits.sites.most_common(12):
            print(f"    {n:5d}  {site}")
        if args.out:  # (after each engine: a run cut short keeps what it measured)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
        del engine
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
