"""Decode the suite's prompts with plain decoding and with each speculative method, and report
per category: tokens/s, the speedup over plain decoding (`ar`), the mean acceptance length
(tokens a verify step emits), the share of emitted tokens inside a repeated 32-gram (looping
answers are easy to draft and inflate acceptance), and the share of outputs identical to `ar`.

A multi-turn prompt is measured on its last user turn; the answers to its earlier turns are
the target's own greedy answers (decoded once, shared by every method), so every method sees
the same context.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specheads.evaluation.suite import CATEGORIES, CHAT_CATEGORIES, EvalPrompt, SuiteError, loop_share

LOOP_NGRAM = 32


@dataclass(frozen=True)
class Method:
    """One decoding configuration: `ar`, `ngram`, or `eagle3` with its tree."""

    name: str
    method: str = "ar"
    num_steps: int = 0
    topk: int = 0
    num_draft_tokens: int = 0
    options: tuple = ()  # (name, value) pairs: the drafter's options (METHOD...:name=value)

    def engine(self, target, head, max_len: int, max_batch: int):
        from specheads.runtime.engine import SpecEngine

        from specheads.drafters import method_needs_head

        if self.method == "ar":
            return SpecEngine(target, method="ar", max_len=max_len, max_batch=max_batch)
        tree = {"num_draft_tokens": self.num_draft_tokens}
        if self.num_steps:
            tree.update(num_steps=self.num_steps, topk=self.topk)
        return SpecEngine(target, head if method_needs_head(self.method) else None, self.method, **tree,
                          max_len=max_len, max_batch=max_batch, drafter_options=dict(self.options))


def parse_methods(specs: list[str], tree: tuple[int, int, int], head_kind: str = "eagle3") -> list[Method]:
    """'KIND' (a head kind: eagle3, mtp, medusa, ... with the tree given; KIND+ngram: with the n-gram
    assist, drafters/assist.py), 'KIND@S,K,N', 'chain' (the
    head given, top-1, S steps; `head_kind` names its kind), 'ngram', 'ngram@N'; a head kind's method
    may end in ':name=value,...' (or ':a=1:b=2'), its drafter's options (e.g. 'eagle3+ngram@6,4,15:ngram_gate=1');
    `ar` always comes first (it is the reference)."""
    from specheads.drafters import DrafterError, parse_options
    from specheads.drafters.assist import split_method
    from specheads.heads.registry import head_kinds

    kinds = head_kinds()
    out = [Method("ar")]
    for spec in specs:
        spec_base, colon, opts = spec.partition(":")
        name, _, arg = spec_base.partition("@")
        try:
            # (options joined with ':' as well as ',', as scripts/bench.py takes them)
            options = tuple(sorted(parse_options(opts.replace(":", ",")).items())) if colon else ()
        except DrafterError as e:
            raise SuiteError(f"method {spec!r}: {e}") from None
        try:
            if name == "ar":
                continue
            if split_method(name)[0] in kinds:
                s, k, n = (int(x) for x in arg.split(",")) if arg else tree
                label = (spec_base if arg else f"{name}@{s},{k},{n}") + (f":{opts}" if colon else "")
                out.append(Method(label, name, s, k, n, options))
                continue
            if colon:
                raise ValueError
            elif name == "chain":
                s = int(arg) if arg else tree[0]
                out.append(Method(f"chain@{s}", head_kind, s, 1, s))
            elif name == "ngram":
                n = int(arg) if arg else 8
                out.append(Method(f"ngram@{n}", "ngram", 0, 0, n))
            else:
                raise ValueError
        except ValueError:
            raise SuiteError(f"method {spec!r}: expected ar, ngram[@N], chain[@S] or a head kind ({', '.join(kinds)}) "
                             f"[+ngram][@S,K,N][:name=value,...]") from None
    return out


def check_save_tree(split: str, draft: str | None, methods: list[Method], kind: str) -> None:
    """--save-tree's preconditions, before any decoding: the validation split (the test split is only
    reported), a local head folder, and at least one tree of the head's kind to choose from."""
    if split != "validation":
        raise SuiteError("--save-tree chooses on the validation split: pass --split validation (the test split "
                         "is only reported)")
    if draft is None or not Path(draft).is_dir():
        raise SuiteError(f"--save-tree writes into the head's folder: --draft {draft!r} is not a local folder")
    if not [m for m in methods if m.method == kind and m.topk > 1]:
        raise SuiteError(f"--save-tree needs a tree of the head's kind among the methods, e.g. --methods "
                         f"{kind}@6,4,15 {kind}@4,4,10")


def choose_tree(report: dict, methods: list[Method], kind: str) -> tuple[tuple[int, int, int], dict]:
    """The head's tree (topk > 1) with the best mean speedup over the report's categories, and how
    it was chosen (each candidate's mean speedup, the categories and prompts, the card and date)."""
    cells = report["categories"]
    trees = [m for m in methods if m.method == kind and m.topk > 1]
    means = {m.name: sum(cells[c][m.name]["speedup_vs_ar"] for c in cells) / len(cells) for m in trees}
    best = max(trees, key=lambda m: means[m.name])
    prompts = {c: cells[c]["ar"]["prompts"] for c in cells}
    return (best.num_steps, best.topk, best.num_draft_tokens), {
        "split": report.get("split"), "categories": list(cells), "prompts": prompts, "card": report.get("card"),
        "date": report.get("date"), "batch_size": report.get("batch_size"),
        "max_new_tokens": report.get("max_new_tokens"), "speedup": round(means[best.name], 4),
        "candidates": {name: round(v, 4) for name, v in means.items()}}


def contexts(target, tokenizer, prompts: list[EvalPrompt], max_new_tokens: int, max_prompt_tokens: int,
             batch_size: int = 8) -> list[list[int]]:
    """Each prompt's token ids up to its last user turn, earlier answers decoded greedily by the
    target (plain decoding)."""
    from specheads.runtime.engine import decode
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import render, stop_token_ids

    def ids(messages):
        text = render(tokenizer, messages, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"][-max_prompt_tokens:]

    histories = [[{"role": "user", "content": p.turns[0]}] for p in prompts]
    stops = stop_token_ids(tokenizer)
    for turn in range(1, max(len(p.turns) for p in prompts)):
        todo = [i for i, p in enumerate(prompts) if len(p.turns) > turn]
        answers = decode(target, [ids(histories[i]) for i in todo], SamplingParams(max_new_tokens=max_new_tokens),
                         stops, max_batch=batch_size)
        for i, answer in zip(todo, answers):
            histories[i] += [{"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)},
                             {"role": "user", "content": prompts[i].turns[turn]}]
    return [ids(h) for h in histories]


def turn_order(n: int, k: int) -> list[int]:
    """The order n methods are timed in, in round (or category) k of an interleaved run: forward in even
    rounds, backward in odd ones, so a drift of the card or the host over the run falls on every method
    alike (`evaluate`, scripts/bench.py)."""
    return list(range(n)) if k % 2 == 0 else list(range(n - 1, -1, -1))


def evaluate(target, tokenizer, head, prompts: list[EvalPrompt], methods: list[Method], batch_size: int = 1,
             max_new_tokens: int = 256, max_prompt_tokens: int = 3072, progress=print, estimate: bool = False,
             on_cell=None, interleave: bool = True) -> dict:
    """Every method over every prompt, category by category; returns the report (see module doc).
    estimate: also each drafting method's acceptance estimated without the decode loop
    (evaluation/estimate.py) from `ar`'s answers, beside the measured one.
    on_cell(cells): called after each (method, category) with the cells measured so far
    ({category: {method: cell}}), e.g. to keep them on disk while a long run goes on.
    interleave: every method's engine is built first and each category runs the methods in turn,
    forward and backward in alternate categories (on an H100 at batch 1 an engine run later in one
    process ran about 1% slower than the one before it, 2026-12-06: in turn, that falls on every
    method alike); False: one method after another, one engine in memory at a time."""
    from specheads.evaluation.machine import machine_state
    from specheads.runtime.engine import pooled
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import stop_token_ids

    cats = [c for c in CATEGORIES if any(p.category == c for p in prompts)]
    t0 = time.perf_counter()
    ctx = contexts(target, tokenizer, prompts, max_new_tokens, max_prompt_tokens, batch_size=max(batch_size, 8))
    progress(f"contexts of {len(prompts)} prompts ready in {time.perf_counter() - t0:.1f} s")
    limit = target.rotary.max_positions - 64
    max_len = min(max(len(c) for c in ctx) + max_new_tokens + 1, limit)
    stops = stop_token_ids(tokenizer)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    cuda = next(target.parameters()).device.type == "cuda"
    per_prompt = [{"id": p.id, "category": p.category, "source": p.source, "prompt_tokens": len(c), "methods": {}}
                  for p, c in zip(prompts, ctx)]
    lookahead = {}  # ar's answers a tree's depth past max_new_tokens: how the last step of each scores
    if estimate:
        from specheads.runtime.engine import decode

        depth = max((m.num_steps or 8) for m in methods) + 1
        longer = decode(target, ctx, SamplingParams(max_new_tokens=max_new_tokens + depth), stops,
                        max_batch=max(batch_size, 8))
        lookahead = dict(enumerate(longer))
    cells: dict = {c: {} for c in cats}
    outputs: dict = {}

    def timed(engine, idx):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        results = engine.generate([ctx[i] for i in idx], params, stops)
        if cuda:
            torch.cuda.synchronize()
        secs = time.perf_counter() - start
        return results, secs, machine_state()  # (the clocks read after the run's clock stopped)

    def record(m: Method, cat: str, idx: list[int], results, secs: float, machine: dict) -> None:
        totals = pooled(results)
        tokens = totals["tokens"]
        looped = sum(loop_share(r.token_ids, LOOP_NGRAM) * len(r.token_ids) for r in results)
        for i, r in zip(idx, results):
            outputs[(m.name, i)] = r.token_ids
            per_prompt[i]["methods"][m.name] = {
                "tokens": len(r.token_ids), "mean_accept_length": round(r.mean_accept_length, 4),
                "loop_share": round(loop_share(r.token_ids, LOOP_NGRAM), 4)}
        same = None
        if m.name != "ar":
            same = sum(outputs[(m.name, i)] == outputs[("ar", i)] for i in idx) / len(idx)
        cells[cat][m.name] = {
            "prompts": len(idx), "tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs,
            "mean_accept_length": totals["mean_accept_length"] or 1.0,
            "loop_share": looped / tokens if tokens else 0.0, "identical_to_ar": same, "machine": machine}
        c = cells[cat][m.name]
        if estimate and m.name != "ar":
            c["estimated_accept_length"] = _estimate(target, head, m, [ctx[i] for i in idx],
                                                     [outputs[("ar", i)] for i in idx],
                                                     [lookahead[i] for i in idx])
        ar = cells[cat].get("ar")
        c["speedup_vs_ar"] = c["tokens_per_s"] / ar["tokens_per_s"] if ar else 1.0
        est = f" (estimated {c['estimated_accept_length']:.2f})" if "estimated_accept_length" in c else ""
        progress(f"{m.name:>16} {cat:>11}: {c['tokens_per_s']:8.1f} tok/s, accept {c['mean_accept_length']:.2f}{est}, "
                 f"{c['speedup_vs_ar']:.2f}x ar, looping {c['loop_share']:.1%}")
        if on_cell is not None:
            on_cell({k: dict(v) for k, v in cells.items() if v})

    def started(m: Method):
        engine = m.engine(target, head, max_len, batch_size)
        if cuda:  # every graph these batches replay, captured before the clock starts
            engine.capture_common(range(1, batch_size + 1))  # rows leave: every smaller bucket too
        return engine

    groups = [(cat, [i for i, p in enumerate(prompts) if p.category == cat]) for cat in cats]
    if not interleave:
        for m in methods:
            engine = started(m)
            for cat, idx in groups:
                record(m, cat, idx, *timed(engine, idx))
            del engine
    else:
        # every method's engine first; each category then runs them in turn, forward in one category and
        # backward in the next, so a drift of the card or the host over the run falls on every method alike
        engines = [started(m) for m in methods]
        for k, (cat, idx) in enumerate(groups):
            got = {j: timed(engines[j], idx) for j in turn_order(len(methods), k)}
            for j, m in enumerate(methods):  # (`ar` first, `parse_methods`: the others compare with it)
                record(m, cat, idx, *got[j])
        del engines
    chat = {}
    for m in methods:
        in_chat = [cells[c][m.name] for c in cats if c in CHAT_CATEGORIES]
        if in_chat:
            keys = ("mean_accept_length", "speedup_vs_ar", "loop_share") + (
                ("estimated_accept_length",) if all("estimated_accept_length" in x for x in in_chat) else ())
            chat[m.name] = {key: sum(x[key] for x in in_chat) / len(in_chat) for key in keys}
    return {"categories": cells, "chat_macro_average": chat, "prompts": per_prompt,
            "methods": [asdict(m) for m in methods], "batch_size": batch_size, "max_new_tokens": max_new_tokens}


def _estimate(target, head, m: Method, prompts: list[list[int]], answers: list[list[int]],
              longer: list[list[int]]) -> float:
    """The method's acceptance over these prompts estimated from ar's answers (pooled as the engine
    pools it); `longer`: the same answers decoded a tree's depth further, where they agree."""
    from specheads.drafters import method_needs_head
    from specheads.evaluation.estimate import served_acceptance

    tree = {"num_draft_tokens": m.num_draft_tokens}
    if m.num_steps:
        tree.update(num_steps=m.num_steps, topk=m.topk)
    longer = [x if x[: len(a)] == a else a for x, a in zip(longer, answers)]
    est = served_acceptance(target, head if method_needs_head(m.method) else None, m.method, tree, prompts, longer,
                            [len(a) for a in answers], options=dict(m.options))
    steps = sum(e["steps"] for e in est)
    return 1 + sum(e["accepted_tokens"] for e in est) / steps if steps else 1.0


def environment(target) -> dict:
    dev = next(target.parameters()).device
    return {"card": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "dtype": str(next(target.parameters()).dtype), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(["specheads"] + sys.argv[1:])}


def print_table(report: dict, out=print) -> None:
    names = [m["name"] for m in report["methods"]]
    spec = [n for n in names if n != "ar"]
    out(f"{report.get('card', '')} {report.get('dtype', '')}, batch {report['batch_size']}, "
        f"{report['max_new_tokens']} new tokens, split {report.get('split', '')}")
    head = f"{'category':>11} {'n':>4} {'ar tok/s':>9}" + "".join(f" | {n:>16} accept  x ar  loop" for n in spec)
    out(head)
    rows = [(c, report["categories"][c]) for c in report["categories"]]
    for cat, cell in rows:
        line = f"{cat:>11} {cell['ar']['prompts']:>4} {cell['ar']['tokens_per_s']:>9.0f}"
        for n in spec:
            x = cell[n]
            line += f" | {x['tokens_per_s']:>16.0f} {x['mean_accept_length']:>6.2f} {x['speedup_vs_ar']:>5.2f} " \
                    f"{x['loop_share']:>5.0%}"
        out(line)
    n_chat = sum(c in CHAT_CATEGORIES for c in report["categories"])
    for n in spec:
        c = report["chat_macro_average"].get(n)
        if c:
            est = f" (estimated without decoding {c['estimated_accept_length']:.2f})" \
                if "estimated_accept_length" in c else ""
            out(f"chat (macro-average over {n_chat} non-coding categories), {n}: accept "
                f"{c['mean_accept_length']:.2f}{est}, {c['speedup_vs_ar']:.2f}x ar")


def save(report: dict, out: Path) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    js = out.with_suffix(".json")
    js.write_text(json.dumps(report, indent=1))
    png = out.with_suffix(".png")
    plot(report, png)
    return js, png


def plot(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(report["categories"])
    spec = [m["name"] for m in report["methods"] if m["name"] != "ar"]
    if not spec:
        return
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(cats) + 3), 4))
    width = 0.8 / len(spec)
    for j, name in enumerate(spec):
        xs = [i + j * width for i in range(len(cats))]
        axes[0].bar(xs, [report["categories"][c][name]["mean_accept_length"] for c in cats], width, label=name)
        axes[1].bar(xs, [report["categories"][c][name]["speedup_vs_ar"] for c in cats], width, label=name)
    for ax, title in zip(axes, ("mean acceptance length (tokens / step)", "speedup over plain decoding")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))])
        ax.set_xticklabels(cats, rotation=40, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{report.get('card', '')}, batch {report['batch_size']}, {report.get('split', '')} split", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
