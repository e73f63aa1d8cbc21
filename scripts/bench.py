"""Decoding benchmark: our ar / eagle3 chain / eagle3 tree / ngram, and transformers peers.

    python scripts/bench.py --target <dir|.gguf> --draft runs/smollm2-eagle3/final \
        --prompts sharegpt coding --batch-sizes 1 8 --max-new-tokens 256 --out bench/smollm2

Prints a table (tokens/s, mean acceptance length, speedup over our ar, a request's mean time from
its admission to its last token, share of outputs identical to our ar), writes <out>.json and
<out>.png. `--verify-shape llama-8b` also times one target forward over k = 1..128 tokens for a
random-weight Llama-3.1-8B shape (GPU).
Timings are wall clock after a warm-up, synchronized, the median of --repeats runs, a cell's methods
taken in turn (every engine of the cell built first; forward, then backward; `--sequential`: one
method after another); each run records the card's and the host's clocks after it. Nothing here
asserts speed.

Speculation policy: a drafting method runs under --speculation-policy (default: fixed) or the
one its name ends with, e.g. the best fixed tree, the adaptive policy
over the same maximum, and n-gram under both, at four batch sizes on the evaluation suite:

    python scripts/bench.py --target <dir> --draft <head> --peers --repeats 3 \
        --prompts suite:writing,roleplay,humanities,stem suite:coding --num-prompts 40 \
        --batch-sizes 1 8 32 64 --methods ar eagle3-tree@6,4,15:fixed eagle3-tree@6,4,15:adaptive \
        ngram:fixed ngram:adaptive --out bench/policy

An adaptive engine captures its graphs and times its tiers' steps before the warm-up run
(`SpecEngine.capture_common`); each row records the policy, its tiers, that start-up time, the
graph memory and the share of steps by tree verified. On a GPU the run's first engine compiles its
kernels ahead, in parallel (`SpecEngine.compile_kernels`; a capture_common does too): its row
records `compile_s` and `compile_ahead`.

Seeded sampling: `--temperature 0.8 --top-p 0.95 --seed 0` samples every prompt with its own seed
(seed + 1,000,003 x its index, as `SpecEngine.generate` gives them), so "same as ar" and "as ar
b1" then say whether sampled outputs are the same alone, in a batch and under speculation (the
peers, which sample with other noise, are skipped).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import time
from pathlib import Path

import torch

from specheads.evaluation.machine import machine_state
from specheads.evaluation.run import turn_order
from specheads.runtime.defaults import TREE_DEFAULT_HELP, resolve_tree

CODING_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Implement binary search over a sorted list in Python and explain its complexity.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that returns the 5 customers with the highest total order value.",
    "Write a Python class for a stack with push, pop and peek, with type hints.",
    "Explain the difference between a list and a tuple in Python with examples.",
    "Write a bash script that counts the lines of every .py file in a folder.",
    "Write a C function that reverses a string in place.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Rust function that sums the even numbers of a vector.",
    "Write a Python script that reads a CSV file and prints the average of a column.",
    "Write a recursive Python function that flattens a nested list.",
]


def sharegpt_prompts(n: int) -> list[str]:
    """First user turns of the held-out ShareGPT conversations (prepare's fixed eval split)."""
    from specheads.data.prepare import is_eval
    from specheads.data.sources import SkipLog, read_conversations

    out = []
    for conv in read_conversations("sharegpt", SkipLog()):
        if not is_eval(conv.id, 0.02):
            continue
        first = next((m["content"] for m in conv.messages if m["role"] == "user"), "")
        if 0 < len(first) < 2000:
            out.append(first)
        if len(out) >= n:
            break
    return out


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Stalls:
    """What may stall a timed run besides its steps: the garbage collector's passes (their ms, by
    generation), step costs the adaptive policy timed mid-run (the engine's _measure_costs), and
    whether the host kept the card fed: of the steps planned behind a step in flight, how many found
    that step already done (the card idled while the host read, planned and launched: a host-bound
    run), beside every step launched. On the CPU there is no event to ask: nothing is planned behind
    a step counted, only the launches."""

    def __init__(self, engine):
        self.engine, self.gc_ms, self.timed_ms, self._t = engine, {}, [], 0.0
        self.launches, self.behind, self.card_idle = 0, 0, 0

    def _gc(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.gc_ms.setdefault(info["generation"], []).append(1000 * (time.perf_counter() - self._t))

    def __enter__(self):
        measure = self.engine._measure_costs

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return measure(*a, **k)
            finally:
                self.timed_ms.append(1000 * (time.perf_counter() - t))

        self.engine._measure_costs = timed
        plan_ahead, launch = self.engine._plan_ahead, self.engine._launch

        def planned(current):
            if current.event is not None:
                self.behind += 1
                self.card_idle += bool(current.event.query())  # (asked before the assist's gate may wait on it)
            return plan_ahead(current)

        def launched(*a, **k):
            self.launches += 1
            return launch(*a, **k)

        self.engine._plan_ahead, self.engine._launch = planned, launched
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._gc)
        for name in ("_measure_costs", "_plan_ahead", "_launch"):
            delattr(self.engine, name)  # back to the class's methods

    def report(self) -> dict:
        return {"gc_passes": {str(g): len(ms) for g, ms in sorted(self.gc_ms.items())},
                "gc_ms": round(sum(sum(ms) for ms in self.gc_ms.values()), 2),
                "gc_max_ms": round(max((max(ms) for ms in self.gc_ms.values()), default=0.0), 2),
                "costs_timed_ms": round(sum(self.timed_ms), 2), "costs_timed": len(self.timed_ms),
                "launches": self.launches, "planned_behind": self.behind, "card_idle_behind": self.card_idle}


def run_ours(engine, prompt_ids, params, stops):
    """All prompts through one engine; its max_batch rows stay full (a finished row takes the next prompt)."""
    with Stalls(engine) as stalls:
        t0 = time.time()
        results = engine.generate(prompt_ids, params, stops)
        sync()
        wall = time.time() - t0
    tokens = sum(len(r.token_ids) for r in results)
    steps = sum(r.steps for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    trees = {}
    for r in results:
        for tree, n in r.steps_by_tree.items():
            trees[tree] = trees.get(tree, 0) + n
    # a request's time from its admission to its last token: in a batch that ends together (no
    # request waiting) speculation can lengthen the whole while most requests finish sooner
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "request_s_mean": sum(r.seconds for r in results) / max(len(results), 1),
            "mean_accept_length": 1 + accepted / steps if steps else None,
            "steps_by_tree": {t: round(n / steps, 4) for t, n in sorted(trees.items())} if steps else {},
            "stalls": stalls.report(), "machine": machine_state()}, [r.token_ids for r in results]


def run_repeats(engine, prompt_ids, params, stops, repeats: int):
    """`repeats` timed runs after the caller's warm-up: the median run's figures, every run's tokens/s."""
    return median_run([run_ours(engine, prompt_ids, params, stops) for _ in range(repeats)])


def interleaved_orders(n: int, repeats: int) -> list[list[int]]:
    """The methods' order in each round of an interleaved cell: forward in even rounds, backward in odd
    ones, so a drift over the rounds falls on every method alike (the default; not with --sequential)."""
    return [turn_order(n, r) for r in range(repeats)]


def median_run(runs: list) -> tuple[dict, list]:
    """One method's timed runs ((figures, outputs) each): the median run's figures, every run's tokens/s."""
    repeats = len(runs)
    order = sorted(range(repeats), key=lambda i: runs[i][0]["tokens_per_s"])
    res, outs = runs[order[repeats // 2]]
    res["tokens_per_s_runs"] = [r["tokens_per_s"] for r, _ in runs]
    res["stalls_runs"] = [r["stalls"] for r, _ in runs]  # (the median hides a stalled run)
    res["machine_runs"] = [r.get("machine", {}) for r, _ in runs]  # (each run's card and host clocks)
    res["identical_across_repeats"] = all(o == runs[0][1] for _, o in runs)
    return res, outs


def run_hf(target_dir, prompt_ids, max_new, stops, batch: int, static_compile: bool, device, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    kwargs = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(stops), pad_token_id=sorted(stops)[0])
    if static_compile:
        # generate compiles the decode forward itself with a static cache (torch.compile,
        # "reduce-overhead": CUDA graphs); compiling model.forward by hand as well crashed in
        # transformers' cache update on torch 2.11
        kwargs["cache_implementation"] = "static"
    outs = []
    # a static cache is sized by prompt width + max_new_tokens: one width for every call, so the
    # compiled forward is built once, not once per prompt length
    common = max(len(x) for x in prompt_ids) if static_compile else None

    seconds = []  # each request's: its batch's generate (a batch ends together)

    def once(ids_list):
        res = []
        seconds.clear()
        for i in range(0, len(ids_list), batch):
            t_chunk = time.time()
            chunk = ids_list[i : i + batch]
            width = common or max(len(x) for x in chunk)
            ids = torch.full((len(chunk), width), kwargs["pad_token_id"], dtype=torch.long)
            att = torch.zeros_like(ids)
            for r, x in enumerate(chunk):  # left padding for generate
                ids[r, width - len(x):] = torch.as_tensor(x)
                att[r, width - len(x):] = 1
            with torch.no_grad():
                gen = model.generate(ids.to(device), attention_mask=att.to(device), **kwargs)
            for r in range(len(chunk)):
                new = gen[r, width:].tolist()
                cut = next((j for j, t in enumerate(new) if t in stops), len(new))
                res.append(new[:cut])
            sync()
            seconds.extend([time.time() - t_chunk] * len(chunk))
        return res

    once(prompt_ids[:batch])  # warm-up (and compilation)
    sync()
    t0 = time.time()
    outs = once(prompt_ids)
    sync()
    wall = time.time() - t0
    tokens = sum(len(o) for o in outs)
    # a request's time from its admission to its last token: in a batch that ends together (no
    # request waiting) speculation can lengthen the whole while most requests finish sooner
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "request_s_mean": sum(seconds) / max(len(seconds), 1), "mean_accept_length": None}, outs


# Llama-3.1-8B's shape (random weights: no download needed)
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192})


def random_target(config: dict, device, dtype):
    """A fused TargetModel of a Llama config (a dict of LlamaConfig fields) with random weights."""
    from transformers import LlamaConfig

    from specheads.target.model import TargetModel

    with torch.device(device):
        model = TargetModel(LlamaConfig(**config), max_positions=4096).to(dtype).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    return model.fuse_for_inference()


def prefill_random(model, cache, context: int, seed: int = 1) -> None:
    """Fill the cache's first `context` entries from random tokens."""
    dev = cache.k.device
    ids = torch.randint(0, 1000, (1, context), device=dev, generator=torch.Generator(dev).manual_seed(seed))
    model(ids, cache=cache, kv_len=context, return_logits=False)


def chain_inputs(cache, context: int, k: int, seed: int = 2):
    """k random tokens after `context` as a chain under a tree mask: (tokens, positions, mask)."""
    dev = cache.k.device
    toks = torch.randint(0, 1000, (1, k), device=dev, generator=torch.Generator(dev).manual_seed(seed))
    pos = context + torch.arange(k, device=dev)[None]
    mask = torch.arange(cache.max_len, device=dev)[None, None, None, :] <= pos[:, None, :, None]
    return toks, pos, mask


def graphed_ms(graphed, toks, pos, mask, repeats: int, warmup: int = 25, rounds: int = 1) -> float:
    """Mean ms of `repeats` replays of a graphed tree forward (positions as slots) after `warmup`
    replays (steady clocks: a decode replays its graph hundreds of times in a row); the best of
    `rounds` such means."""
    for _ in range(warmup):
        graphed(toks, pos, pos, mask)
    best = float("inf")
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            graphed(toks, pos, pos, mask)
        sync()
        best = min(best, (time.perf_counter() - t0) / repeats * 1000)
    return best


def verify_cost(device, dtype, ks=(1, 2, 4, 8, 16, 32, 64, 128), context=512, repeats=100, warmup=25):
    """One forward over k new tokens (a chain under a tree mask, as verification runs it) on a
    random-weight Llama-3.1-8B shape with a KV cache, replayed as a CUDA graph on the fused
    kernels, as the engine runs it."""
    from specheads.runtime.graphs import GraphedForward
    from specheads.target.model import KVCache

    model = random_target(LLAMA_8B, device, dtype)
    cache = KVCache(model.spec, 1, context + max(ks) + 1, dtype, device)
    rows = []
    with torch.no_grad():
        prefill_random(model, cache, context)
        for k in ks:
            graphed = GraphedForward(model, cache, k, tree=True)
            toks, pos, mask = chain_inputs(cache, context, k)
            rows.append({"k": k, "ms": graphed_ms(graphed, toks, pos, mask, repeats, warmup)})
            del graphed
    base = rows[0]["ms"]
    for r in rows:
        r["ratio_to_k1"] = r["ms"] / base
    # the copy-bandwidth floor on this card: reading every weight once per forward
    buf = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device)
    dst = torch.empty_like(buf)
    for _ in range(3):
        dst.copy_(buf)
    sync()
    t0 = time.time()
    for _ in range(10):
        dst.copy_(buf)
    sync()
    bandwidth = 2 * buf.numel() * 10 / (time.time() - t0)  # read + write bytes per second
    del buf, dst
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor_ms = weight_bytes / bandwidth * 1000
    return {"rows": rows, "weight_bytes": weight_bytes, "context": context, "copy_bandwidth_tb_s": bandwidth / 1e12,
            "floor_ms": floor_ms, "k1_share_of_floor": floor_ms / base}


def profile_name(method: str, drafter_options: dict) -> str:
    """The file name of a method's speculation profile under --speculation-profile-dir: the method
    and its drafter options (they may change the drafter, hence its steps), in letters, digits,
    '.', '_' and '-' only (a device call returns no other file names)."""
    spec = method + "".join(f"_{k}-{v}" for k, v in sorted(drafter_options.items()))
    return re.sub(r"[^A-Za-z0-9._-]", "_", spec.replace("@", "_").replace(",", "-")) + ".json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--prompts", nargs="+", default=["sharegpt", "coding"],
                    help="sharegpt, coding, suite:CATEGORY[,CATEGORY...] (the evaluation suite's test split, "
                         "single-turn prompts; suite-validation:... its validation split, for choosing settings), "
                         "or a .txt / .json file")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--methods", nargs="+", default=["ar", "eagle3-chain", "eagle3-tree", "ngram"],
                    help="ar, ngram, and the draft's method (its head kind, or draft_model for a small LM) as "
                         "METHOD-chain, METHOD-tree or METHOD-tree@STEPS,TOPK,TOKENS (e.g. eagle3-tree@8,10,60); "
                         "a drafting method may end in :fixed or :adaptive (its speculation policy)")
    ap.add_argument("--speculation-policy", choices=["fixed", "adaptive"], default=None,
                    help="drafting methods' policy where their name does not say (default: fixed); "
                         "adaptive's maximum tree is the method's")
    ap.add_argument("--speculation-tiers", default=None, metavar="S,K,N;...",
                    help="the adaptive policy's tiers (default: chains 1, 2, 4 deep and the method's tree)")
    ap.add_argument("--speculation-settings", default=None, metavar="NAME=VALUE,...",
                    help="the adaptive policy's settings, e.g. switch_margin=0.15 (specheads/runtime/policy.py)")
    ap.add_argument("--speculation-profile-dir", default=None,
                    help="keep each adaptive method's measured step costs in DIR/<method>.json (loaded, completed "
                         "and saved back; default: measured for each engine)")
    ap.add_argument("--ngram-tokens", type=int, default=8, help="ngram's draft tokens (its longest chain)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell after the warm-up (the median)")
    ap.add_argument("--sequential", action="store_true",
                    help="one method after another, one engine in memory at a time (default: every method's engine of "
                         "a cell built first, then their timed runs taken in turn, forward then backward, so that a "
                         "drift of the card or the host over the cell falls on every method alike: at batch 1 on an "
                         "H100 a method's place in a sequential order moved it by 1-3%%)")
    ap.add_argument("--peers", nargs="*", default=["hf", "hf-static-compile"])
    ap.add_argument("--peer-batch-sizes", type=int, nargs="*", default=[1], help="batch sizes the peers run at")
    ap.add_argument("--tree", default=None, help=f"num_steps,topk,num_draft_tokens of KIND-tree ({TREE_DEFAULT_HELP})")
    ap.add_argument("--chain-steps", type=int, default=None, help="KIND-chain's depth (default: the head's tree's, else 6)")
    ap.add_argument("--verify-shape", choices=["none", "llama-8b"], default="none")
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0 samples, seeded (--seed)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0, help="the sampling seed of prompt 0 (prompt i: seed + 1000003 i)")
    ap.add_argument("--kernel-tuning", default=None, metavar="JSON_OR_FILE",
                    help="kernel settings over the card's defaults, as `specheads generate --kernel-tuning` takes "
                         "them (e.g. '{\"speed\": {\"draft_block\": 1024}}'); recorded in the JSON")
    ap.add_argument("--out", default="bench/result")
    args = ap.parse_args()
    from specheads.kernels.tuning import use_given

    use_given(args.kernel_tuning)  # before any engine fuses or captures

    from specheads.drafters import parse_options
    from specheads.drafters.draft_model import load_draft
    from specheads.runtime.engine import SpecEngine
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import render, stop_token_ids
    from specheads.target.loader import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    target, tok, target_dir = load_target(args.target, dtype=dtype, device=device)
    head = load_draft(args.draft, tok, device=device, dtype=dtype) if args.draft else None
    stops = stop_token_ids(tok)
    sampled = args.temperature > 0
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed if sampled else None).validate()
    if sampled and args.peers:
        print(f"sampling: the peers ({', '.join(args.peers)}) are skipped (their noise is not ours)", flush=True)
        args.peers = []
    tree = resolve_tree(*((int(x) for x in args.tree.split(",")) if args.tree else (None, None, None)), head)
    if args.chain_steps is None:  # the head's depth (else the default tree's), whatever --tree says
        args.chain_steps = resolve_tree(None, None, None, head)[0]

    default_policy = args.speculation_policy or "fixed"

    def split_spec(method: str) -> tuple[str, str | None, dict]:
        """METHOD[:POLICY][:name=value,...] -> (METHOD, its policy or None for ar, its drafter's options)."""
        name, *rest = method.split(":")
        opts = [r for r in rest if "=" in r]
        policy = next((r for r in rest if "=" not in r), "") or default_policy
        return name, None if name in ("ar", "ar-sync") else policy, parse_options(",".join(opts))

    def engine_for(method: str, b: int):
        """ar, ar-sync (the host reads each step before launching the next), ngram, or
        KIND-chain / KIND-tree[@S,K,N] with the draft given; :fixed or :adaptive its policy, then
        :name=value,... its drafter's options (e.g. eagle3+ngram-tree@6,4,15:fixed:ngram_gate=1)."""
        method, policy, drafter_options = split_spec(method)
        if method in ("ar", "ar-sync"):
            return SpecEngine(target, method="ar", max_len=args.max_len, max_batch=b, overlap=method == "ar")
        options = dict(speculation_policy=policy, drafter_options=drafter_options)
        if policy == "adaptive":
            options["speculation_tiers"] = args.speculation_tiers
            options["speculation_settings"] = args.speculation_settings
            if args.speculation_profile_dir:
                options["speculation_profile"] = Path(args.speculation_profile_dir) / profile_name(method,
                                                                                                 drafter_options)
        if method == "ngram":
            return SpecEngine(target, method="ngram", num_draft_tokens=args.ngram_tokens, max_len=args.max_len,
                              max_batch=b, **options)
        name, _, shape = method.partition("@")
        kind, _, form = name.rpartition("-")
        if form == "chain":
            steps, topk, n = args.chain_steps, 1, args.chain_steps
        else:
            steps, topk, n = (int(x) for x in shape.split(",")) if shape else tree
        return SpecEngine(target, head, kind, num_steps=steps, topk=topk, num_draft_tokens=n, max_len=args.max_len,
                          max_batch=b, **options)

    rows = []
    report = {"card": card, "dtype": str(dtype), "target": str(target_dir), "draft": args.draft,
              "kernel_tuning": args.kernel_tuning,
              "max_new_tokens": args.max_new_tokens, "date": time.strftime("%Y-%m-%d"), "rows": rows,
              "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                           "seed": args.seed} if sampled else None,
              "repeats": args.repeats, "interleave": not args.sequential, "speculation_policy": default_policy,
              "speculation_settings": args.speculation_settings,
              "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.speculation_profile_dir:
        Path(args.speculation_profile_dir).mkdir(parents=True, exist_ok=True)

    def save():  # after every row: a run cut short keeps what it measured
        for r in rows:
            ar = next((x for x in rows if x["method"] == "ar" and (x["prompts"], x["batch"]) == (r["prompts"], r["batch"])),
                      None)
            if ar:
                r["speedup_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))

    sources = {}
    for source in args.prompts:
        if source == "sharegpt":
            texts = sharegpt_prompts(args.num_prompts)
        elif source == "coding":
            texts = CODING_PROMPTS[: args.num_prompts]
        elif source.startswith(("suite:", "suite-validation:")):
            from specheads.evaluation.suite import single_turn_texts

            split = "validation" if source.startswith("suite-validation:") else "test"
            cats = source.split(":", 1)[1]
            texts = single_turn_texts(split, cats.split(","), args.num_prompts)
            source = ("suite-" if split == "test" else "suite-validation-") + cats.replace(",", "+")
        elif source.endswith(".json"):  # a list of prompt texts (e.g. held-out ShareGPT turns saved elsewhere)
            texts = json.loads(Path(source).read_text())[: args.num_prompts]
            source = Path(source).stem
        else:
            texts = [line for line in Path(source).read_text().splitlines() if line.strip()][: args.num_prompts]
        sources[source] = [tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True),
                               add_special_tokens=False)["input_ids"] for t in texts]
    ar_outs = {}
    compiled_ahead = False

    def prepared(method: str, batch: int, prompt_ids):
        """The method's engine for this batch, started as a server starts and warmed up: (engine, its start-up's figures)."""
        nonlocal compiled_ahead
        engine = engine_for(method, batch)
        startup = {}
        if engine.policy is not None and engine.policy.name == "adaptive" and engine.use_graphs:
            # what a server does at start: every tier's greedy graphs at every batch bucket up
            # to this batch (rows leave as prompts finish), their steps timed; a bucket first
            # met in a timed run would be captured and timed there, inside its wall time
            t0 = time.time()
            engine.capture_common(range(1, batch + 1))
            startup = {"startup_s": round(time.time() - t0, 2), "graphs": engine.graph_report}
            print(f"  {engine.graph_summary()}", flush=True)
            compiled_ahead = True
        elif not compiled_ahead and engine.use_graphs:
            # the first engine's kernels compiled in parallel before its warm-up (on a fresh
            # machine the warm-up compiles them one after another: most of a minute); later
            # engines share most of them
            t0 = time.time()
            compiled = engine.compile_kernels(range(1, batch + 1))
            startup = {"compile_s": round(time.time() - t0, 2), "compile_ahead": compiled}
            compiled_ahead = True
        run_ours(engine, prompt_ids, params, stops)  # warm-up: captures every graph the run needs
        return engine, startup

    def record(method: str, source: str, batch: int, engine, startup: dict, measured: tuple) -> None:
        res, outs = measured
        res.update(policy=engine.policy.name if engine.policy is not None else None,
                   tiers=[str(t) for t in engine.policy.tiers] if engine.policy is not None else None, **startup)
        if method == "ar":
            ar_outs[(source, batch)] = outs
        res.update(method=method, prompts=source, batch=batch,
                   identical_to_ar=identical(outs, ar_outs.get((source, batch))),
                   # the bit-exactness reference: each prompt decoded alone
                   identical_to_ar_b1=identical(outs, ar_outs.get((source, 1))))
        rows.append(res)
        save()

    for source, prompt_ids in sources.items():
        for batch in args.batch_sizes:
            methods = [m for m in args.methods
                       if m.partition(":")[0] in ("ar", "ar-sync", "ngram") or head is not None]
            if args.sequential:
                for method in methods:
                    print(f"running {method} on {source} prompts at batch {batch}", flush=True)
                    engine, startup = prepared(method, batch, prompt_ids)
                    record(method, source, batch, engine, startup,
                           run_repeats(engine, prompt_ids, params, stops, args.repeats))
                    del engine
                continue
            # every method's engine at once, their timed runs taken in turn (forward, then backward)
            engines = []
            for method in methods:
                print(f"preparing {method} on {source} prompts at batch {batch}", flush=True)
                engines.append(prepared(method, batch, prompt_ids))
            runs = [[] for _ in methods]
            for r, order in enumerate(interleaved_orders(len(methods), args.repeats)):
                for i in order:
                    runs[i].append(run_ours(engines[i][0], prompt_ids, params, stops))
                print(f"  round {r + 1}/{args.repeats}: " + ", ".join(
                    f"{methods[i]} {runs[i][-1][0]['tokens_per_s']:.0f}" for i in order) + " tok/s", flush=True)
            for i, method in enumerate(methods):  # (ar first where it was named first: the others compare with it)
                record(method, source, batch, *engines[i], median_run(runs[i]))
            del engines
    if args.verify_shape == "llama-8b":
        report["verify_cost_llama8b"] = verify_cost(device, dtype)
        save()
        for r in report["verify_cost_llama8b"]["rows"]:
            print(f"llama-8b shape: k={r['k']:>4} forward {r['ms']:.2f} ms ({r['ratio_to_k1']:.2f}x k=1)", flush=True)
        vc = report["verify_cost_llama8b"]
        print(f"llama-8b shape: copy bandwidth {vc['copy_bandwidth_tb_s']:.2f} TB/s, floor {vc['floor_ms']:.2f} ms, "
              f"k=1 at {100 * vc['k1_share_of_floor']:.1f}% of it", flush=True)
    for source, prompt_ids in sources.items():
        for batch in args.peer_batch_sizes:
            for peer in args.peers:
                print(f"running {peer} on {source} prompts at batch {batch}", flush=True)
                res, outs = run_hf(target_dir, prompt_ids, args.max_new_tokens, stops, batch,
                                   peer == "hf-static-compile", device, dtype)
                res.update(method=peer, prompts=source, batch=batch,
                           identical_to_ar=identical(outs, ar_outs.get((source, batch))))
                rows.append(res)
                save()
    print(f"card {card}, {dtype}, max_new_tokens {args.max_new_tokens}")
    print(f"{'prompts':>8} {'batch':>5} {'method':>28} {'tok/s':>9} {'accept':>7} {'speedup':>8} {'request s':>9} "
          f"{'same as ar':>10} {'as ar b1':>8}")
    for r in rows:
        acc = f"{r['mean_accept_length']:.2f}" if r.get("mean_accept_length") else "-"
        same, same1 = (f"{r[k]:.0%}" if r.get(k) is not None else "-" for k in ("identical_to_ar", "identical_to_ar_b1"))
        req = f"{r['request_s_mean']:.3f}" if r.get("request_s_mean") is not None else "-"
        print(f"{r['prompts']:>8} {r['batch']:>5} {r['method']:>28} {r['tokens_per_s']:>9.1f} {acc:>7} "
              f"{r.get('speedup_vs_ar', float('nan')):>8.2f} {req:>9} {same:>10} {same1:>8}")
    plot(report, out.with_suffix(".png"))


def identical(outs: list, reference: list | None) -> float | None:
    """The share of outputs token for token equal to the reference's (None without one)."""
    return sum(o == a for o, a in zip(outs, reference)) / len(outs) if reference else None


def plot(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["prompts"], r["batch"]) for r in report["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in report["rows"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4))
    width = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        vals = [next((r["tokens_per_s"] for r in report["rows"] if (r["prompts"], r["batch"]) == g and r["method"] == m), 0)
                for g in groups]
        ax.bar([i + j * width for i in range(len(groups))], vals, width, label=m)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{p}\nbatch {b}" for p, b in groups])
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{report['card']}, {report['dtype']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
