"""The head-kinds comparison of issues 23 and 24: one table from the files gpu_runs/kinds_pipeline.sh writes.

    python3 gpu_runs/kinds_table.py prompts --out DIR [--per-category 10] [--coding 64]
        DIR/chat.json (the suite's test split, or --split validation; single-turn, round-robin over the chat categories)
        and DIR/coding.json (its first coding prompts): the prompt files scripts/bench.py reads
    python3 gpu_runs/kinds_table.py params HEAD_DIR        # trainable parameters of a saved head (JSON)
    python3 gpu_runs/kinds_table.py table --root ROOT --out PREFIX
        PREFIX.json, PREFIX.md (also printed) and PREFIX.png (speedup over our ar, per kind and cell)
    python3 gpu_runs/kinds_table.py pick-tree EVAL_JSON --out KIND-tree.json [--coding]
        the tree of `specheads evaluate --methods ar KIND@S,K,N ...` (validation split) with the best mean
        speedup over ar on the chat categories (--coding: the mean of that and coding's); prints S,K,N
        (the pipeline's TREES tuning; assist_bench.sh sweep)
    python3 gpu_runs/kinds_table.py tree-current KIND-tree.json S,K,N ...
        exit 0 if that choice was made among exactly these candidates, 1 if not (the pipeline then tunes again)
    python3 gpu_runs/kinds_table.py held-out-check SHARED_DATA RUN_DATA
        how many of the shared data's held-out conversations a run's own data (a mix) trains on, as JSON;
        exit 1 if any (its figures on them would not be held out): the pipeline runs it before eval_shared
    python3 gpu_runs/kinds_table.py selfcheck             # the table from fake run files (CPU, seconds)

ROOT is the pipeline's folder (default /tmp/kinds); per kind it reads
    runs/KIND/calls.jsonl        one line per device call that trained: wall_s, step_before, step_after, rc
    runs/KIND/metrics.jsonl      the trainer's curves (loss records: step, elapsed_s since that call's start)
    runs/KIND/train_summary.json the trainer's summary with the held-out eval/* keys (written once trained)
    runs/KIND/params.json        `params` above
    runs/KIND/variant.json       what the run is: its epochs, extra args and data (DATA_ spec, "" = the shared data)
    runs/KIND/data_report.json   the prepare report of the data it trained on (train tokens, the mix)
    runs/KIND/eval_shared.json   a run on its own data (DATA_<kind>): `specheads eval` on the shared data's
                                 held-out split, the conversations of every other run's held-out figures
    runs/KIND/heldout_check.json `held-out-check` above; where the run trained on any of those conversations
                                 its eval_shared.json is not used (its own split's figures are shown)
    bench/KIND-SOURCE.json       scripts/bench.py with --methods ar KIND-tree (SOURCE: chat, coding)
    bench/KIND-tree.json         `pick-tree` above, where the kind's tree was chosen on the validation split
and settings.json (epochs, batch, kinds, ...) and prepare_report.json. Runs of several machines (each
call's kinds.tgz unpacked into one ROOT) make one table: the kinds of settings.json, then any other
run folder, each described by its own variant.json.

Time per epoch is the training loop's seconds per optimizer step (metrics.jsonl, summed over the
calls it took; target load, evaluation and checkpoints not counted) times the steps of one
epoch; GPU-minutes are the training processes' whole wall time (calls.jsonl), one GPU each.
Simulated acceptance is the trainer's held-out chain acceptance (eval/accept_length: a chain as
deep as the head drafts, at most train.ttt_steps); served acceptance is scripts/bench.py's mean
acceptance length of the KIND-tree rows. A run on its own data shows its figures on the shared
data's held-out split (eval_shared.json; its own split's stay in the JSON as own_heldout_*).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

SOURCES = ("chat", "coding")
BATCHES = (1, 8)
# goals at batch 1 on chat (issue 23: mtp; issue 24: eagle, medusa): speedup over our ar
GOALS = {"mtp": 2.0, "eagle": 1.8, "medusa": 1.5}
MTP_WITHIN_EAGLE3 = 0.10  # issue 23: mtp's speedup within 10% of eagle3's


# ------------------------------------------------------------------ held out for every run
def heldout_check(shared_dir: str, run_dir: str) -> dict:
    """How many of the shared data's held-out conversations (by id) the run's data trains on."""
    from datasets import load_from_disk

    from specheads.data.mix import source_id

    held = set(load_from_disk(shared_dir)["eval"]["id"])
    trained = {source_id(i) for i in load_from_disk(run_dir)["train"]["id"]}
    return {"shared_heldout": len(held), "in_run_train": len(held & trained)}


# ------------------------------------------------------------------ prompts
def write_prompts(out: Path, per_category: int, coding: int, split: str = "test") -> dict:
    from specheads.evaluation.suite import CHAT_CATEGORIES, single_turn_texts

    cats = [c for c in CHAT_CATEGORIES if single_turn_texts(split, [c], 1)]  # multi-turn has none
    chat = single_turn_texts(split, cats, per_category * len(cats))  # categories in turn
    code = single_turn_texts(split, ["coding"], coding)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chat.json").write_text(json.dumps(chat, indent=1))
    (out / "coding.json").write_text(json.dumps(code, indent=1))
    counts = {"chat": len(chat), "coding": len(code), "chat_categories": cats, "per_category": per_category,
              "split": split}
    (out / "prompts.json").write_text(json.dumps(counts, indent=1))
    return counts


def head_params(folder: str) -> dict:
    from specheads.heads.format import load_head

    head = load_head(folder)
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    return {"kind": head.kind, "trainable_params": trainable,
            "params": sum(p.numel() for p in head.parameters()),
            "buffers": sum(b.numel() for b in head.buffers()),
            "shape": {k: getattr(head.config, k) for k in ("num_modules", "num_heads", "num_layers",
                                                           "draft_vocab_size", "intermediate_size")
                      if hasattr(head.config, k)}}


# ------------------------------------------------------------------ reading the runs
def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def loop_seconds(metrics: list[dict]) -> tuple[float, int]:
    """(seconds, optimizer steps) of the training loops in metrics.jsonl. Each call resumes and
    restarts elapsed_s at 0; its first record is at its first step (start + 1)."""
    seconds, steps = 0.0, 0
    segment = None  # (start step, last record)
    for r in metrics:
        if "loss" not in r or "elapsed_s" not in r:
            continue
        if segment is None or r["elapsed_s"] < segment[1]["elapsed_s"] or r["step"] <= segment[1]["step"]:
            if segment is not None:
                seconds += segment[1]["elapsed_s"]
                steps += segment[1]["step"] - segment[0]
            segment = (r["step"] - 1, r)
        else:
            segment = (segment[0], r)
    if segment is not None:
        seconds += segment[1]["elapsed_s"]
        steps += segment[1]["step"] - segment[0]
    return seconds, steps


def head_kind(name: str) -> str:
    """The head kind of a run: a kind, or a variant KIND+LABEL (the pipeline's ARGS_KIND_LABEL)."""
    return name.partition("+")[0]


def pick_tree(report: dict, coding: bool = False) -> dict:
    """The tree with the best chat macro-average speedup over ar in a `specheads evaluate` report
    (methods KIND@S,K,N[:options]; ties to the earlier candidate; chosen as written after the @); with
    `coding`, the best mean of the chat macro-average's and the coding category's speedups (the report
    must hold coding)."""
    chat = report.get("chat_macro_average") or {}
    code = (report.get("categories") or {}).get("coding") if coding else None
    if coding and not code:
        raise SystemExit("pick-tree --coding: the report has no coding category")
    cands = {m["name"]: m for m in report.get("methods", []) if m.get("name") != "ar" and m["name"] in chat}
    if not cands:
        raise SystemExit("pick-tree: the report has no tree method with a chat average (run it on chat categories)")

    def score(n):
        return (chat[n]["speedup_vs_ar"] + code[n]["speedup_vs_ar"]) / 2 if code else chat[n]["speedup_vs_ar"]

    best = max(cands, key=lambda n: (score(n), -list(cands).index(n)))
    m = cands[best]
    out = {n: {"speedup_vs_ar": round(chat[n]["speedup_vs_ar"], 4), "accept": round(chat[n]["mean_accept_length"], 4)}
           for n in cands}
    for n in cands if code else ():
        out[n].update(coding_speedup_vs_ar=round(code[n]["speedup_vs_ar"], 4),
                      coding_accept=round(code[n]["mean_accept_length"], 4), score=round(score(n), 4))
    # the method spec after KIND@ (S,K,N, with its drafter options where it has any: ...:ngram_gate_chain=31)
    chosen = best.split("@", 1)[1] if "@" in best else f"{m['num_steps']},{m['topk']},{m['num_draft_tokens']}"
    return {"chosen": chosen, "split": report.get("split"),
            "card": report.get("card"), "batch_size": report.get("batch_size"),
            "by": "mean of chat and coding speedups" if code else "chat speedup", "candidates": out}


def default_trees() -> str:
    """The trees heads draft without one of their own, as the registry's kinds name them, e.g.
    'medusa 2,8,12, else 6,4,15'."""
    from specheads.heads.registry import head_kind as kind_entry, head_kinds
    from specheads.runtime.defaults import DEFAULT_TREE

    own = [f"{n} {','.join(map(str, kind_entry(n).default_tree))}" for n in head_kinds() if kind_entry(n).default_tree]
    return ", ".join(own + [f"else {','.join(map(str, DEFAULT_TREE))}"])


def tree_current(choice: dict, candidates: list[str]) -> bool:
    """Whether a `pick-tree` choice was made among exactly these S,K,N candidates (order aside)."""
    return sorted(name.rpartition("@")[2] for name in choice.get("candidates", {})) == sorted(candidates)


def bench_rows(root: Path, kind: str) -> dict:
    """(source, batch, 'ar'|'tree') -> bench row."""
    cells = {}
    for source in SOURCES:
        report = read_json(root / "bench" / f"{kind}-{source}.json")
        for r in (report or {}).get("rows", []):
            method = r["method"].partition(":")[0]
            what = "ar" if method == "ar" else "tree" if method.startswith(f"{head_kind(kind)}-tree") else None
            if what:
                cells[(source, r["batch"], what)] = {**r, "card": report.get("card")}
    return cells


def run_epochs(settings: dict, kind: str, variant: dict | None = None) -> float:
    """The epochs a run trained: the pipeline's EPOCHS (or the run's EPOCHS_<kind>), unless
    TRAIN_ARGS or the run's own ARGS_<kind> set train.epochs (the later one wins, as on the
    trainer's command line). `variant`: the run's variant.json, where the pipeline wrote one."""
    if variant:
        args, epochs = f"{variant.get('train_args', '')} {variant.get('args', '')}", variant.get("epochs")
    else:
        args = f"{settings.get('train_args', '')} {(settings.get('kind_args') or {}).get(kind, '')}"
        epochs = (settings.get("kind_epochs") or {}).get(kind)
    given = re.findall(r"train\.epochs=(\S+)", args)
    return float(given[-1] if given else epochs if epochs is not None else settings.get("epochs", 1))


def kind_row(root: Path, kind: str, settings: dict) -> dict:
    run = root / "runs" / kind
    summary = read_json(run / "train_summary.json") or {}
    params = read_json(run / "params.json") or {}
    calls = read_jsonl(run / "calls.jsonl")
    metrics = read_jsonl(run / "metrics.jsonl")
    variant = read_json(run / "variant.json")
    seconds, steps = loop_seconds(metrics)
    epochs = run_epochs(settings, kind, variant)
    total = summary.get("steps")
    data = (variant or {}).get("data_spec", (settings.get("kind_data") or {}).get(kind, "")) or ""
    prep = read_json(run / "data_report.json") or ({} if data else read_json(root / "prepare_report.json") or {})
    check = read_json(run / "heldout_check.json") or {}
    leaked = check.get("in_run_train", 0)  # shared held-out conversations the run trained on
    shared = read_json(run / "eval_shared.json") if data and not leaked else None
    held = shared or summary  # a run on its own data: held out on the shared data's conversations
    row = {
        "kind": kind,
        "trained": bool(summary),
        "trainable_params": params.get("trainable_params"),
        "shape": params.get("shape"),
        "steps": total,
        "epochs": epochs,
        "train_calls": len(calls),
        "train_device": summary.get("device") or next((c.get("device") for c in calls if c.get("device")), None),
        "loop_s_per_step": seconds / steps if steps else None,
        "s_per_epoch": seconds / steps * total / epochs if steps and total else None,
        "gpu_minutes": round(sum(c.get("wall_s", 0) for c in calls) / 60, 2) if calls else None,
        "tokens": summary.get("tokens"),
        "data": data,  # DATA_<kind> ("" = the shared data)
        "train_tokens": prep.get("train_tokens"),
        "conversations": prep.get("conversations"),
        "mix": [{k: r.get(k) for k in ("label", "path", "drawn", "share", "loss_token_share")}
                for r in (prep.get("mix") or {}).get("sources", [])] or None,
        "heldout_on": "own" if data and not shared else "shared",
        **({"shared_heldout_trained_on": leaked, "shared_heldout": check.get("shared_heldout")} if leaked else {}),
        "heldout_acc": held.get("eval/acc"),
        "heldout_chain_acc": held.get("eval/chain_acc"),
        "sim_accept": held.get("eval/accept_length"),
        "sim_accept_opening": held.get("eval/accept_length_opening"),
        **({"own_heldout_acc": summary.get("eval/acc"), "own_sim_accept": summary.get("eval/accept_length")}
           if shared else {}),
        "tree": (read_json(root / "bench" / f"{kind}-tree.json") or {}).get("chosen"),
        "cells": {},
    }
    for (source, batch, what), r in sorted(bench_rows(root, kind).items()):
        cell = row["cells"].setdefault(f"{source}-b{batch}", {})
        if what == "ar":
            cell["ar_tokens_per_s"] = r["tokens_per_s"]
        else:
            cell.update(method=r["method"], tokens_per_s=r["tokens_per_s"], speedup_vs_ar=r.get("speedup_vs_ar"),
                        accept=r.get("mean_accept_length"), identical_to_ar=r.get("identical_to_ar"),
                        identical_to_ar_b1=r.get("identical_to_ar_b1"), card=r.get("card"))
    for source in SOURCES:
        acc = [row["cells"].get(f"{source}-b{b}", {}).get("accept") for b in BATCHES]
        row[f"served_accept_{source}"] = next((a for a in acc if a is not None), None)
    return row


def goals(rows: list[dict]) -> list[dict]:
    def speed(kind):
        r = next((x for x in rows if x["kind"] == kind), None)
        return (r or {}).get("cells", {}).get("chat-b1", {}).get("speedup_vs_ar")

    out = []
    for kind, want in GOALS.items():  # the kind's run, then each variant of it (its own recipe)
        for run in [r["kind"] for r in rows if head_kind(r["kind"]) == kind]:
            got = speed(run)
            out.append({"goal": f"{run} >= {want}x our ar at batch 1 on chat", "value": got,
                        "met": None if got is None else got >= want})
    mtp, eagle3 = speed("mtp"), speed("eagle3")
    if any(r["kind"] == "mtp" for r in rows) and any(r["kind"] == "eagle3" for r in rows):
        ratio = mtp / eagle3 if mtp and eagle3 else None
        out.append({"goal": "mtp's speedup within 10% of eagle3's (batch 1, chat)", "value": ratio,
                    "met": None if ratio is None else ratio >= 1 - MTP_WITHIN_EAGLE3})
    return out


def build(root: Path) -> dict:
    settings = read_json(root / "settings.json") or {}
    found = sorted(p.name for p in (root / "runs").iterdir() if p.is_dir()) if (root / "runs").is_dir() else []
    kinds = list(settings.get("kinds") or [])
    kinds += [k for k in found if k not in kinds]  # runs of other machines' calls unpacked here too
    rows = [kind_row(root, k, settings) for k in kinds]
    ar = {}
    for cell in (f"{s}-b{b}" for s in SOURCES for b in BATCHES):
        vals = [r["cells"][cell]["ar_tokens_per_s"] for r in rows if "ar_tokens_per_s" in r["cells"].get(cell, {})]
        if vals:
            ar[cell] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": len(vals)}
    prep = read_json(root / "prepare_report.json") or {}
    prompts = read_json(root / "prompts" / "prompts.json")
    return {"settings": settings, "prompts": prompts,
            "data": {k: prep.get(k) for k in ("conversations", "train_tokens", "train_loss_tokens", "cut_loops",
                                              "draft_vocab_size")},
            "ar": ar, "rows": rows, "goals": goals(rows)}


# ------------------------------------------------------------------ output
def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def markdown(table: dict) -> str:
    head = ["kind", "params (M)", "train tokens (M)", "s / epoch", "GPU-min", "held-out acc per depth", "sim. accept",
            "served accept chat / coding"]
    head += [f"{s} b{b} tok/s (x ar)" for s in SOURCES for b in BATCHES] + ["= ar b1 (chat b1/b8, coding b1/b8)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ar = table["ar"]
    ar_cells = [f"{ar[c]['median']:.0f} ({ar[c]['min']:.0f}-{ar[c]['max']:.0f})" if c in ar else "-"
                for c in (f"{s}-b{b}" for s in SOURCES for b in BATCHES)]
    lines.append("| ar (median of the kinds' runs) | | | | | | | | " + " | ".join(ar_cells) + " | |")
    for r in table["rows"]:
        acc = "/".join(f"{a:.2f}" for a in r["heldout_acc"]) if r["heldout_acc"] else "-"
        own = " (own split)" if r["heldout_on"] == "own" and r["heldout_acc"] else ""  # no eval_shared.json
        if r.get("shared_heldout_trained_on") and own:
            own = f" (own split: trained on {r['shared_heldout_trained_on']} of the shared {r['shared_heldout']})"
        cells, same = [], []
        for s in SOURCES:
            for b in BATCHES:
                c = r["cells"].get(f"{s}-b{b}", {})
                cells.append(f"{c['tokens_per_s']:.0f} ({c['speedup_vs_ar']:.2f}x)"
                             if c.get("tokens_per_s") and c.get("speedup_vs_ar") else "-")
                same.append(fmt(c.get("identical_to_ar_b1"), ".0%"))
        served = f"{fmt(r['served_accept_chat'], '.2f')} / {fmt(r['served_accept_coding'], '.2f')}"
        params = fmt(r["trainable_params"] / 1e6 if r["trainable_params"] else None, ".1f")
        shape = r.get("shape") or {}
        label = r["kind"] + (f" ({shape['num_modules']} modules)" if head_kind(r["kind"]) == "mtp" and "num_modules" in shape else
                             f" ({shape['num_heads']} heads)" if "num_heads" in shape else
                             f" ({shape['num_layers']} layers)" if head_kind(r["kind"]) == "eagle3"
                             and (shape.get("num_layers") or 1) > 1 else "")
        if r.get("tree"):
            label += f", tree {r['tree']}"
        if r["epochs"] != float(table["settings"].get("epochs", 1)):  # a run's own train.epochs
            label += f", {r['epochs']:g} epochs"
        if r["data"]:
            label += f", data + {r['data']}"
        tokens = fmt(r["train_tokens"] / 1e6 if r["train_tokens"] else None, ".1f")
        lines.append(f"| {label} | {params} | {tokens} | {fmt(r['s_per_epoch'], '.0f')} "
                     f"| {fmt(r['gpu_minutes'], '.1f')} "
                     f"| {acc}{own} | {fmt(r['sim_accept'], '.2f')}{own} | {served} | " + " | ".join(cells)
                     + f" | {'/'.join(same)} |")
    s = table["settings"]
    notes = [f"\n{s.get('card', '?')}, bf16, greedy; each kind trained alone on one GPU ({s.get('epochs')} epoch(s), "
             f"batch {s.get('batch')} conversations, configs/smollm2-135m-eagle3.yaml's lr and ttt_steps) on the same "
             f"prepared data ({table['data'].get('train_tokens')} train tokens)"
             + ("; a row with `data + SOURCE:FRACTION` trained on the whole ShareGPT regeneration plus that share of "
                "SOURCE's prompts answered by the target (DATA_<kind>), its held-out figures on the shared data's "
                "held-out conversations" if any(r["data"] for r in table["rows"]) else "")
             + "; `scripts/bench.py --methods ar KIND-tree "
             f"--speculation-policy fixed --max-new-tokens {s.get('max_new_tokens', 256)}` (tree "
             + (f"the kind's default where none is named: {default_trees()} (chosen trees: the best of TREES "
                "on the validation split's chat categories, batch 1)" if any(r.get("tree") for r in table["rows"])
                else f"the kind's default: {default_trees()}")
             + ", its depth capped at the head's: mtp's modules, medusa's heads) on "
             f"{(table['prompts'] or {}).get('chat', '?')} chat and {(table['prompts'] or {}).get('coding', '?')} "
             f"coding prompts of the evaluation suite's {(table['prompts'] or {}).get('split', 'test')} split, each "
             "kind against its own ar run on its GPU."]
    for g in table["goals"]:
        v = fmt(g["value"], ".2f")
        notes.append(f"- goal: {g['goal']}: {v} ({'met' if g['met'] else 'not met' if g['met'] is False else 'no value'})")
    return "\n".join(lines + notes)


def plot(table: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [f"{s}-b{b}" for s in SOURCES for b in BATCHES]
    rows = table["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(rows), 1)
    for j, r in enumerate(rows):
        vals = [r["cells"].get(c, {}).get("speedup_vs_ar") or 0 for c in cells]
        bars = ax.bar([i + j * width for i in range(len(cells))], vals, width, label=r["kind"])
        ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in vals], fontsize=6)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))])
    ax.set_xticklabels([c.replace("-b", "\nbatch ") for c in cells])
    ax.set_ylabel("tokens/s over our ar")
    ax.set_title(f"draft head kinds, tree drafting ({table['settings'].get('card', '?')})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def write_table(root: Path, prefix: Path) -> dict:
    table = build(root)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(table, indent=1))
    md = markdown(table)
    prefix.with_suffix(".md").write_text(md + "\n")
    print(md)
    plot(table, prefix.with_suffix(".png"))
    return table


# ------------------------------------------------------------------ self-check with fake run files
def fake_root(root: Path) -> None:
    import random

    rng = random.Random(0)
    kinds = ["eagle3", "mtp", "eagle", "medusa", "mtp+rand", "eagle3+code"]  # variants of mtp and eagle3 (own runs)
    (root / "prompts").mkdir(parents=True, exist_ok=True)
    (root / "prompts" / "prompts.json").write_text(json.dumps({"chat": 28, "coding": 28}))
    (root / "settings.json").write_text(json.dumps({"kinds": kinds, "epochs": 1, "batch": 16, "card": "FAKE GPU",
                                                    "max_new_tokens": 256, "train_args": "--set train.lr=1e-3",
                                                    "kind_args": {"mtp+rand": "--set train.epochs=2"},
                                                    "kind_data": {"eagle3+code": "code-prompts:1"}}))
    (root / "prepare_report.json").write_text(json.dumps({"train_tokens": 11372416, "conversations": {"train": 5}}))
    # eagle3+4ep: a run of another machine's call (not in this settings.json), described by its variant.json
    for i, kind in enumerate(kinds + ["eagle3+4ep"]):
        run = root / "runs" / kind
        run.mkdir(parents=True, exist_ok=True)
        if kind == "eagle3+code":  # its own data, also evaluated on the shared held-out split
            (run / "variant.json").write_text(json.dumps({"kind": kind, "epochs": 1, "args": "", "train_args": "",
                                                          "data_spec": "code-prompts:1"}))
            (run / "data_report.json").write_text(json.dumps({"train_tokens": 13_000_000, "mix": {"sources": [
                {"label": "jsonl#0", "drawn": 100, "share": 0.84}, {"label": "jsonl#1", "drawn": 19, "share": 0.16}]}}))
            (run / "eval_shared.json").write_text(json.dumps({"eval/acc": [0.9] * 7, "eval/accept_length": 4.5}))
        if kind == "eagle3+4ep":
            (run / "variant.json").write_text(json.dumps({"kind": kind, "epochs": 4, "args": "--set train.lr=1e-3",
                                                          "train_args": "", "data_spec": ""}))
        depth = {"mtp": 3, "medusa": 4}.get(head_kind(kind), 7)
        # two calls: steps 1..500 (2 s a step), then 501..1000 (1 s a step); medusa in one call
        recs = []
        if kind == "medusa":
            recs += [{"step": s, "loss": 1.0, "acc": [0.5], "elapsed_s": 1.0 * s} for s in (1, 25, 1000)]
        else:
            recs += [{"step": s, "loss": 1.0, "acc": [0.5], "elapsed_s": 2.0 * s} for s in (1, 25, 500)]
            recs += [{"step": s, "loss": 1.0, "acc": [0.5], "elapsed_s": 1.0 * (s - 500)} for s in (501, 525, 1000)]
        recs.append({"step": 1000, "eval/acc": [0.7] * depth})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run / "calls.jsonl").write_text(json.dumps({"wall_s": 540, "step_before": 0, "step_after": 500}) + "\n"
                                         + json.dumps({"wall_s": 60, "step_before": 500, "step_after": 1000}) + "\n")
        if kind == "eagle":  # not trained yet, not benched: the table still builds
            (run / "train_summary.json").unlink(missing_ok=True)
            continue
        (run / "train_summary.json").write_text(json.dumps({
            "steps": 1000, "device": "FAKE GPU", "tokens": 123, "eval/acc": [round(0.8 - 0.02 * k, 4) for k in range(depth)],
            "eval/chain_acc": [0.8] * depth, "eval/accept_length": 3.0 + i / 10}))
        (run / "params.json").write_text(json.dumps({"trainable_params": 10_000_000 * (i + 1),
                                                     "shape": {"num_modules": 3} if head_kind(kind) == "mtp" else {}}))
        (root / "bench").mkdir(exist_ok=True)
        for source in SOURCES:
            rows = []
            for b in BATCHES:
                ar = 1500.0 * b ** 0.8 * (1 + rng.uniform(-0.02, 0.02))
                tree = ar * (2.5 - i * 0.3) / b ** 0.2
                rows.append({"method": "ar", "prompts": source, "batch": b, "tokens_per_s": ar,
                             "mean_accept_length": None})
                rows.append({"method": f"{head_kind(kind)}-tree", "prompts": source, "batch": b, "tokens_per_s": tree,
                             "mean_accept_length": 3.5 - i * 0.2, "speedup_vs_ar": tree / ar,
                             "identical_to_ar": 1.0, "identical_to_ar_b1": 1.0 if b == 1 else 0.75})
            (root / "bench" / f"{kind}-{source}.json").write_text(json.dumps({"card": "FAKE GPU", "rows": rows}))
        if kind == "eagle3":  # its tree chosen on the validation split
            (root / "bench" / "eagle3-tree.json").write_text(json.dumps(pick_tree(fake_tuning())))


def fake_tuning() -> dict:
    """A `specheads evaluate` report of three eagle3 trees: the second is fastest on chat."""
    names = ["ar", "eagle3@6,4,15", "eagle3@7,8,31", "eagle3@5,4,15"]
    methods = [{"name": "ar", "method": "ar", "num_steps": 0, "topk": 0, "num_draft_tokens": 0}]
    methods += [{"name": n, "method": "eagle3", **dict(zip(("num_steps", "topk", "num_draft_tokens"),
                                                             map(int, n.partition("@")[2].split(","))))}
                for n in names[1:]]
    speed = {"eagle3@6,4,15": 2.0, "eagle3@7,8,31": 2.2, "eagle3@5,4,15": 2.2}  # a tie: the earlier wins
    chat = {n: {"speedup_vs_ar": v, "mean_accept_length": v + 1} for n, v in speed.items()}
    return {"methods": methods, "chat_macro_average": chat, "split": "validation", "card": "FAKE GPU", "batch_size": 1}


def selfcheck() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "kinds"
        fake_root(root)
        table = write_table(root, Path(tmp) / "out" / "kinds_table")
        rows = {r["kind"]: r for r in table["rows"]}
        # 500 steps at 2 s + 500 at 1 s: 1.5 s a step, 1000 steps an epoch
        assert abs(rows["eagle3"]["loop_s_per_step"] - 1.5) < 1e-9, rows["eagle3"]["loop_s_per_step"]
        assert abs(rows["eagle3"]["s_per_epoch"] - 1500) < 1e-6
        assert abs(rows["medusa"]["s_per_epoch"] - 1000) < 1e-6
        assert rows["mtp"]["gpu_minutes"] == 10.0
        assert len(rows["mtp"]["heldout_acc"]) == 3 and rows["eagle"]["heldout_acc"] is None
        assert rows["eagle"]["cells"] == {} and not rows["eagle"]["trained"]
        assert abs(rows["eagle3"]["cells"]["chat-b1"]["speedup_vs_ar"] - 2.5) < 1e-9
        assert rows["medusa"]["served_accept_coding"] == 3.5 - 3 * 0.2
        assert table["ar"]["chat-b1"]["runs"] == 6
        got = {g["goal"].split()[0]: g["met"] for g in table["goals"]}
        assert got["mtp"] is True and got["medusa"] is True and got["eagle"] is None, got
        # the variant: its own row, read from its bench files' mtp-tree rows; the goals read the kind's run
        assert abs(rows["mtp+rand"]["cells"]["chat-b1"]["speedup_vs_ar"] - (2.5 - 4 * 0.3)) < 1e-9
        assert len(rows["mtp+rand"]["heldout_acc"]) == 3
        # ... a goal line of its own (its recipe differs), and its own epochs (ARGS_mtp_rand's train.epochs=2)
        assert got["mtp+rand"] is False and got["mtp"] is True
        assert rows["mtp+rand"]["epochs"] == 2 and rows["mtp"]["epochs"] == 1
        assert abs(rows["mtp+rand"]["s_per_epoch"] - 750) < 1e-6
        assert rows["eagle3"]["tree"] == "7,8,31" and rows["mtp"]["tree"] is None
        md = (Path(tmp) / "out" / "kinds_table.md").read_text()
        assert "| eagle3, tree 7,8,31 | 10.0 | 11.4 |" in md
        # an ablation's variants: its own data (held-out figures on the shared split), its own epochs, and a
        # run of another machine's call listed after this settings.json's kinds
        assert [r["kind"] for r in table["rows"]][-2:] == ["eagle3+code", "eagle3+4ep"]
        code, longer = rows["eagle3+code"], rows["eagle3+4ep"]
        assert code["data"] == "code-prompts:1" and code["train_tokens"] == 13_000_000 and len(code["mix"]) == 2
        assert code["heldout_acc"] == [0.9] * 7 and code["sim_accept"] == 4.5 and code["heldout_on"] == "shared"
        assert code["own_sim_accept"] == 3.5 and rows["eagle3"]["train_tokens"] == 11372416
        assert "| eagle3+code, data + code-prompts:1 | 60.0 | 13.0 |" in md
        assert longer["epochs"] == 4 and longer["data"] == "" and "| eagle3+4ep, 4 epochs |" in md
        for ext in (".json", ".md", ".png"):
            assert (Path(tmp) / "out" / f"kinds_table{ext}").stat().st_size > 0
        # a variant whose data trained on the shared held-out conversations: its own split's figures instead
        (root / "runs" / "eagle3+code" / "heldout_check.json").write_text(
            json.dumps({"shared_heldout": 340, "in_run_train": 332}))
        code = next(r for r in write_table(root, Path(tmp) / "out" / "kinds_table")["rows"] if r["kind"] == "eagle3+code")
        assert code["heldout_on"] == "own" and code["sim_accept"] == 3.5 and code["shared_heldout_trained_on"] == 332
        assert "(own split: trained on 332 of the shared 340)" in (Path(tmp) / "out" / "kinds_table.md").read_text()
    print("selfcheck: ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--out", required=True)
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--coding", type=int, default=64)
    p.add_argument("--split", choices=["test", "validation"], default="test",
                   help="the suite's part: test (reported) or validation (choosing options: ablations)")
    p = sub.add_parser("params")
    p.add_argument("head")
    p = sub.add_parser("table")
    p.add_argument("--root", default="/tmp/kinds")
    p.add_argument("--out", required=True, help="output prefix: PREFIX.json, .md, .png")
    p = sub.add_parser("pick-tree")
    p.add_argument("report", help="`specheads evaluate` JSON with ar and KIND@S,K,N methods")
    p.add_argument("--out", required=True, help="the choice as JSON (bench/KIND-tree.json)")
    p.add_argument("--coding", action="store_true", help="choose by the mean of the chat and coding speedups")
    p = sub.add_parser("tree-current")
    p.add_argument("choice", help="bench/KIND-tree.json (`pick-tree`)")
    p.add_argument("candidates", nargs="+", metavar="S,K,N")
    p = sub.add_parser("held-out-check")
    p.add_argument("shared", help="the shared prepared data (every other run's held-out conversations)")
    p.add_argument("run_data", help="the run's own prepared data")
    sub.add_parser("selfcheck")
    args = ap.parse_args(argv)
    if args.cmd == "prompts":
        print(json.dumps(write_prompts(Path(args.out), args.per_category, args.coding, args.split)))
    elif args.cmd == "params":
        print(json.dumps(head_params(args.head)))
    elif args.cmd == "table":
        write_table(Path(args.root), Path(args.out))
    elif args.cmd == "held-out-check":
        check = heldout_check(args.shared, args.run_data)
        print(json.dumps(check))
        return 1 if check["in_run_train"] else 0
    elif args.cmd == "tree-current":
        return 0 if tree_current(read_json(Path(args.choice)) or {}, args.candidates) else 1
    elif args.cmd == "pick-tree":
        choice = pick_tree(read_json(Path(args.report)) or {}, args.coding)
        Path(args.out).write_text(json.dumps(choice, indent=1) + "\n")
        print(choice["chosen"])
    else:
        selfcheck()
    return 0


if __name__ == "__main__":
    sys.exit(main())
