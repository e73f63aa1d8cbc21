"""On the GPU: where a batch-1 tree step's time goes. One engine mid-generation; the draft
(`drafter.propose`), the verify (`engine._verify`: the step's inputs and masks, the target
forward over the tree, the target's token at each node) and the whole step are each captured
as a CUDA graph and replayed, each replay timed with CUDA events and the engine's state put
back between replays; the rest of a step is the accept, the bookkeeping and the KV commit.
With programmatic dependent launch as set and off.

    python3 gpu_runs/tree_parts.py HEAD [--out DIR] [--profile] [--compare LABEL:SETTINGS ...]
                                      [--tree STEPS,TOPK,TOKENS] [--prompt INDEX]  (TARGET in the environment)

Also times the verify of a lone root (a plain decode step's forward and argmax, `decode_ms`).
--prompt picks the held-out prompt (index into .dev/prompts/sharegpt.json; -1: the longest, a
larger context bucket). Prints a table and writes tree_parts.json under --out; --profile also
writes the kernels of ten replays of the draft, the verify and the decode, by time
(tree_parts_{draft,verify,decode}_kernels.txt; PDL off, so kernel times add up)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from specheads.data.chat import render
from specheads.heads.format import load_head
from specheads.kernels import tuning
from specheads.runtime.defaults import DEFAULT_TREE
from specheads.runtime.engine import Request, SpecEngine
from specheads.runtime.graphs import capture_graph
from specheads.runtime.sampling import SamplingParams
from specheads.target.loader import load_target


def timed(graph, restore, n=100) -> float:
    """Mean ms of n replays, each alone between two events (the restore is not timed)."""
    total = 0.0
    for _ in range(n + 10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        restore()
        total += start.elapsed_time(end)
        if _ == 9:
            total = 0.0  # warm-up replays
    return total / n


def kernel_table(graph, restore) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
            torch.cuda.synchronize()
            restore()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)


def parts(target, head, prompt, profile=False, tree=None) -> dict:
    steps, topk, n_draft = tree or DEFAULT_TREE
    engine = SpecEngine(target, head, max_batch=1, method="eagle3", num_steps=steps, topk=topk, num_draft_tokens=n_draft)
    engine.generate([prompt], SamplingParams(max_new_tokens=300))  # compiles and captures
    engine.add(Request(prompt, SamplingParams(max_new_tokens=300), frozenset()))
    for _ in range(20):  # prefill, then steady steps
        engine.step()
    engine._drain()
    torch.cuda.synchronize()
    b, kv = 1, engine._context_bucket(max(r.committed for r in engine.rows) + engine.tree_nodes + 1)
    restore = engine._restorer()
    out = {"kv_bucket": kv}
    draft_g, tree = capture_graph(lambda: engine._tree(b, kv, True), engine._pool, restore)
    restore()
    out["draft_ms"] = timed(draft_g, restore)
    verify_g, _ = capture_graph(lambda: engine._verify(tree, b, kv, False), engine._pool, restore)
    restore()
    out["verify_ms"] = timed(verify_g, restore)
    # the same verify for a lone root: a plain decode step's forward and argmax, at this bucket
    decode_g, _ = capture_graph(lambda: engine._verify(engine._tree(b, kv, False), b, kv, False), engine._pool,
                                restore)
    restore()
    out["decode_ms"] = timed(decode_g, restore)
    if profile:
        out["kernels"] = {name: kernel_table(g, restore)
                          for name, g in (("draft", draft_g), ("verify", verify_g), ("decode", decode_g))}
    step_g = engine.graphs.get((b, kv, False, True)) or engine._capture(b, kv, False, True)
    restore()
    out["step_ms"] = timed(step_g, restore)
    out["rest_ms"] = out["step_ms"] - out["draft_ms"] - out["verify_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("head")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile", action="store_true", help="the draft, verify and decode kernels by time (PDL off)")
    ap.add_argument("--compare", nargs="*", default=[], metavar="LABEL:JSON",
                    help="more kernel tunings timed in the same process, each over the defaults "
                         "(specheads/kernels/tuning.py), e.g. 'warps4:{\"speed\": {\"draft_warps\": 4}}' "
                         "'pdl_all:{\"speed\": {\"pdl_kernels\": \"all\"}}'")
    ap.add_argument("--tree", default=None, metavar="STEPS,TOPK,TOKENS", help="the tree shape (default: the engine's)")
    ap.add_argument("--prompt", type=int, default=0, help="held-out prompt index (-1: the longest)")
    a = ap.parse_args()
    tree = tuple(int(x) for x in a.tree.split(",")) if a.tree else None
    target, tok, _ = load_target(os.environ["TARGET"], dtype=torch.bfloat16, device="cuda")
    head = load_head(a.head, device="cuda", dtype=torch.bfloat16)
    prompts = [tok(render(tok, [{"role": "user", "content": text}], add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for text in json.load(open(".dev/prompts/sharegpt.json"))]
    prompt = max(prompts, key=len) if a.prompt == -1 else prompts[a.prompt]
    report = {"card": torch.cuda.get_device_name(), "tree": list(tree or DEFAULT_TREE), "prompt_tokens": len(prompt)}
    as_set = tuning.active()
    for label, t in (("pdl_off", as_set.replace(pdl_kernels=frozenset())), ("pdl_as_set", as_set)):
        with tuning.using(t):
            report[label] = parts(target, head, prompt, profile=a.profile and t is not as_set, tree=tree)
    for spec in a.compare:
        label, _, settings = spec.partition(":")
        with tuning.using(tuning.KernelTuning.parse(settings, base=as_set)):
            report[label] = parts(target, head, prompt, tree=tree)
    print(f"{'':12} {'draft ms':>9} {'verify ms':>9} {'rest ms':>8} {'step ms':>8} {'decode ms':>9}  (kv bucket)")
    for label in [k for k in report if isinstance(report[k], dict)]:
        r = report[label]
        print(f"{label:12} {r['draft_ms']:9.3f} {r['verify_ms']:9.3f} {r['rest_ms']:8.3f} {r['step_ms']:8.3f} "
              f"{r['decode_ms']:9.3f}  ({r['kv_bucket']})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in report["pdl_off"].pop("kernels", {}).items():
        (out / f"tree_parts_{name}_kernels.txt").write_text(table)
        print(f"== {name} (PDL off, ten replays)\n{table}")
    (out / "tree_parts.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
