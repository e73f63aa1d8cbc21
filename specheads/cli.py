"""`specheads prepare | self-prompts | train | eval | evaluate | demo | generate | export | publish | serve`.

Entry points parse arguments and call the library; errors the user can fix are printed
as one clear line and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from specheads.runtime.defaults import TREE_DEFAULT_HELP, resolve_tree

METHOD_HELP = ("the drafter: ar (none), ngram, a head kind such as eagle3, or KIND+ngram (the head's tree, or "
               "prompt lookup's chain where the text repeats); default with --draft: eagle3+ngram for an EAGLE-3 "
               "head, the head's kind for others; else ar")

TRAIN_DEFAULT_CONFIG = None


def _add_prepare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF folder, hub id or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--data", default="sharegpt",
                   help="ShareGPT .json, .jsonl, .parquet, a hub dataset id[:split], or a packaged source: chitchat, "
                        "code-prompts (with --regenerate) (default: embedded ShareGPT)")
    p.add_argument("--output", default="prepared/smollm2", help="output folder (an on-disk datasets DatasetDict)")
    p.add_argument("--config", default=None,
                   help="run config YAML whose data.sources (a mix of sources by ratio) and data.mix_seed replace --data")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override, e.g. --set 'data.sources=[{name: sharegpt, ratio: 3}, "
                        "{name: chitchat, ratio: 1}]' (repeatable; replaces --data)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--limit", type=int, default=None, help="use at most this many conversations")
    p.add_argument("--eval-fraction", type=float, default=0.02)
    p.add_argument("--draft-vocab-size", type=int, default=32000)
    p.add_argument("--regenerate", action="store_true", help="the target writes the assistant turns itself")
    p.add_argument("--max-new-tokens", type=int, default=512, help="per regenerated turn")
    p.add_argument("--temperature", type=float, default=0.0, help="regeneration: 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="regeneration batch")
    p.add_argument("--max-turns", type=int, default=None, help="regenerate at most this many user turns each")
    p.add_argument("--cut-loops", type=int, default=None, metavar="N",
                   help="cut each assistant answer after its first repeated N-gram (e.g. 32): drops looping tails")
    p.add_argument("--devices", default=None,
                   help="regeneration devices, one process each: all (every GPU), a count, or cuda:0,cuda:1 "
                        "(default: one, the GPU if there is one)")
    p.add_argument("--num-proc", type=int, default=None,
                   help="processes that tokenize (default: the CPUs this process may use, at most 16)")


def cmd_prepare(args) -> int:
    from specheads.data.prepare import PrepareOptions, prepare

    sources, mix_seed = None, 0
    if args.config or args.overrides:
        from specheads.config import load_config

        data = load_config(args.config, args.overrides).data
        sources, mix_seed = data.source_dicts(), data.mix_seed
    report = prepare(
        PrepareOptions(
            target=args.target, data=args.data, sources=sources, mix_seed=mix_seed, output=args.output, max_length=args.max_length, limit=args.limit,
            eval_fraction=args.eval_fraction, draft_vocab_size=args.draft_vocab_size, regenerate=args.regenerate,
            regen_max_new_tokens=args.max_new_tokens, regen_temperature=args.temperature, regen_top_p=args.top_p,
            regen_seed=args.seed, regen_batch_size=args.batch_size, regen_max_turns=args.max_turns,
            devices=args.devices, cut_loops=args.cut_loops, num_proc=args.num_proc,
        )
    )
    _print_prepare_report(report, args.output)
    return 0


def cmd_self_prompts(args) -> int:
    from specheads.data.self_prompts import PROMPTS_FILE, SelfPromptSettings, write_self_prompts

    settings = SelfPromptSettings(count=args.count, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
                                  max_tokens=args.max_tokens, min_words=args.min_words, system=args.system,
                                  chunk=args.chunk)
    info = write_self_prompts(args.target, args.out, settings, batch_size=args.batch_size, device=args.device)
    dropped = ", ".join(f"{n} {why}" for why, n in info["dropped"].items()) or "none"
    print(f"self-prompts: kept {info['kept']} of {info['sampled']} (median {info['words_median']} words) in "
          f"{info['seconds']} s -> {Path(args.out) / PROMPTS_FILE}; dropped: {dropped}")
    print(f"  answer them: specheads prepare --data {Path(args.out) / PROMPTS_FILE} --regenerate ...")
    return 0


def _print_prepare_report(report: dict, output: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"prepared -> {output}")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("train / eval conversations", f"{report['conversations']['train']} / {report['conversations']['eval']}")
    t.add_row("train tokens (loss tokens)", f"{report['train_tokens']} ({report['train_loss_tokens']})")
    t.add_row("truncated at max_length", str(report["truncated"]))
    if "cut_loops" in report:
        c = report["cut_loops"]
        t.add_row(f"answers cut at a repeated {c['ngram']}-gram (tokens removed)", f"{c['answers_cut']} ({c['tokens_removed']})")
    for row in (report.get("mix") or {}).get("sources", []):
        t.add_row(f"source {row['label']} (ratio {row['ratio']:.3f})",
                  f"{sum(row['kept'].values())} conv ({row['share']:.1%}), {row['loss_token_share']:.1%} of loss tokens")
    t.add_row("draft vocab (coverage)", f"{report['draft_vocab_size']} ({report['draft_vocab_coverage']:.2%})")
    for reason, info in report["skipped"].items():
        t.add_row(f"skipped: {reason}", str(info["count"]))
    Console(stderr=False).print(t)


class _Registered:
    """argparse choices read from the head registry only when a value is checked or help is
    printed: commands that name no head kind do not import the kinds' modules (torch)."""

    def __init__(self, names):
        self.names = names

    def __contains__(self, value) -> bool:
        return value in self.names()

    def __iter__(self):
        return iter(self.names())


def _head_kind_names() -> tuple[str, ...]:
    from specheads.heads.registry import head_kinds

    return head_kinds()


def _export_format_names() -> tuple[str, ...]:
    from specheads.hub import export_formats

    return export_formats()


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="run config YAML (see configs/)")
    p.add_argument("--kind", choices=_Registered(_head_kind_names), metavar="KIND", default=None,
                   help="the head kind to train: %(choices)s (= --set head.kind=...; default: the config's, eagle3)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--target", default=None, help="= --set target.path=...")
    p.add_argument("--data", default=None, help="prepared data folder (= --set data.path=...)")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--deepspeed", default=None, help="DeepSpeed JSON (= --set train.deepspeed=...)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)


def build_train_config(args):
    from specheads.config import load_config

    return load_config(
        args.config, args.overrides,
        **{"head.kind": args.kind, "target.path": args.target, "data.path": args.data, "output_dir": args.output_dir,
           "train.max_steps": args.max_steps, "train.deepspeed": args.deepspeed},
    )


# a run stopped by SIGTERM/SIGINT after saving a checkpoint (EX_TEMPFAIL): the same command resumes
EXIT_RESUMABLE = 75


def cmd_train(args) -> int:
    from specheads.training.trainer import train

    cfg = build_train_config(args)
    _check_train_inputs(cfg)
    summary = train(cfg)
    if "stopped_at_step" in summary:
        return EXIT_RESUMABLE
    if int(os.environ.get("RANK", 0)) == 0:
        _print_train_summary(summary)
    return 0


def cmd_eval(args) -> int:
    from specheads.training.trainer import evaluate_head

    # with --json, stdout carries the JSON alone (progress and setup lines go to stderr)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        summary = evaluate_head(args.draft, args.data, args.target, args.rows, args.batch_size, args.ttt_steps)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_eval_table(summary)
    return 0


def _check_train_inputs(cfg) -> None:
    """Everything a user can get wrong, before any model loads."""
    from pathlib import Path

    from specheads.training.data import PreparedDataError

    data = Path(cfg.data.path)
    if not (data / "vocab_map.safetensors").is_file():
        raise PreparedDataError(
            f"data.path {str(data)!r} is not a prepared data folder; run `specheads prepare --output {data}` first"
        )
    if cfg.train.deepspeed and not Path(cfg.train.deepspeed).is_file():
        raise FileNotFoundError(f"train.deepspeed {cfg.train.deepspeed!r} does not exist (see configs/ds_zero2.json)")


def _print_train_summary(summary: dict) -> None:
    console = _print_eval_table(summary)
    console.print(
        f"{summary['tokens']} tokens in {summary['train_wall_s']} s ({summary['train_tokens_per_s']} tok/s)"
        + (f"; peak GPU memory {summary['peak_gpu_mem_gib']} GiB" if summary.get("peak_gpu_mem_gib") else "")
    )


def _print_eval_table(summary: dict):
    from rich.console import Console
    from rich.table import Table

    t = Table(title="draft head: per-step results on the held-out split")
    t.add_column("draft step")
    t.add_column("top-1 acc vs target", justify="right")
    t.add_column("chain acc (greedy)", justify="right")
    for k, (a, c) in enumerate(zip(summary.get("eval/acc", []), summary.get("eval/chain_acc", []))):
        t.add_row(str(k), f"{a:.3f}", f"{c:.3f}")
    console = Console()
    console.print(t)
    console.print(
        f"simulated chain acceptance length {summary.get('eval/accept_length', float('nan')):.3f} over "
        f"{summary.get('eval/positions', 0)} answer positions; "
        f"{summary.get('eval/accept_length_opening', float('nan')):.3f} over the first 256 tokens of first answers"
    )
    return console


def cmd_demo(args) -> int:
    """prepare + train on the embedded default; small on CPU (configs/demo.yaml), the full recipe on a GPU."""
    import shutil

    import torch

    from specheads.data.prepare import prepare
    from specheads.demo import complete_message, cpu_plan, finished_run, gpu_plan, held_out_count
    from specheads.training.trainer import train

    gpu = torch.cuda.is_available() and not args.cpu
    plan = gpu_plan() if gpu else cpu_plan(conversations=args.conversations, steps=args.steps)
    done = None if args.fresh else finished_run(plan.run.output_dir)
    if done is not None:  # resuming would train 0 steps and report that as the run
        _print_eval_table(done)
        print(complete_message(plan.run, done))
        return 0
    if not os.path.isdir(plan.prepare.output) or args.fresh:
        _print_prepare_report(prepare(plan.prepare), plan.prepare.output)
    if args.fresh:
        shutil.rmtree(plan.run.output_dir, ignore_errors=True)
    _print_train_summary(train(plan.run))
    held_out = held_out_count(plan)
    if held_out is not None:
        print(f"held-out figures over {held_out} conversations of {plan.prepare.output}; "
              f"the head is {Path(plan.run.output_dir) / 'final'}")
    return 0


def cmd_generate(args) -> int:
    import torch

    from specheads.target.chat import render, stop_token_ids
    from specheads.drafters import method_needs_head
    from specheads.drafters.draft_model import load_draft
    from specheads.runtime.engine import SpecEngine, pooled
    from specheads.runtime.sampling import SamplingParams
    from specheads.server.launch import drafter_options
    from specheads.target.loader import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_new_tokens=args.max_new_tokens).validate()
    _use_kernel_tuning(args)
    model, tok, _ = load_target(args.target, dtype=dtype, device=device)
    head = load_draft(args.draft, tok, device=device, dtype=dtype) if args.draft and method_needs_head(args.method) \
        else None
    options = drafter_options(head, args.draft_lm_head == "int8", args.draft_option)
    steps, topk, n = resolve_tree(args.num_steps, args.topk, args.num_draft_tokens, head)
    engine = SpecEngine(model, head, method=args.method, num_steps=steps, topk=topk,
                        num_draft_tokens=n, static_tree=args.static_tree, max_len=args.max_len,
                        drafter_options=options, **_policy_options(args, device == "cuda"))
    prompts = []
    for text in args.prompt:
        text = text if args.raw else render(tok, [{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    t0 = time.time()
    results = engine.generate(prompts, params, stop_token_ids(tok))
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.time() - t0
    totals = pooled(results)
    mean = totals["mean_accept_length"]
    stats = {
        "method": engine.method,
        "speculation_policy": engine.policy.name if engine.policy is not None else None,
        "steps": totals["steps"],
        "accepted_tokens": totals["accepted_tokens"],
        # the engine's definition (GenerationResult.mean_accept_length), pooled over the outputs
        "mean_accept_length": round(mean, 3) if mean is not None else None,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(totals["tokens"] / max(wall, 1e-9), 1),
    }
    if args.json:
        print(json.dumps({"outputs": [{"token_ids": r.token_ids, "text": tok.decode(r.token_ids),
                                       "finish_reason": r.finish_reason,
                                       "mean_accept_length": round(r.mean_accept_length, 3) if r.steps else None}
                                      for r in results],
                          "stats": stats}))
    else:
        for r in results:
            print(tok.decode(r.token_ids))
        print(json.dumps(stats), file=sys.stderr)
    return 0


def _add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None)
    p.add_argument("--draft", default=None, help="EAGLE-3 head folder or hub id (for the eagle3 and chain methods)")
    p.add_argument("--methods", nargs="+", default=None,
                   help="eagle3[@S,K,N] eagle3+ngram[@S,K,N] chain[@S] ngram[@N] (ar always runs: it is the "
                        "reference); default: the head's default method with --draft (eagle3+ngram), else ngram")
    p.add_argument("--split", choices=["validation", "test"], default="test",
                   help="choose settings on validation; report test")
    p.add_argument("--categories", nargs="+", default=None, help="default: all nine")
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--num-steps", type=int, default=None, help=f"the tree of a method named without @S,K,N ({TREE_DEFAULT_HELP})")
    p.add_argument("--topk", type=int, default=None)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--save-tree", action="store_true",
                   help="with --split validation and a head folder: record the fastest of the head's trees measured "
                        "(mean speedup over the categories) as the head's default tree in its specheads.json")
    p.add_argument("--estimate", action="store_true",
                   help="also estimate each method's acceptance without the decode loop (teacher-forced drafts on "
                        "ar's answers), beside the measured one")
    p.add_argument("--sequential", action="store_true",
                   help="one method after another, one engine in memory at a time (default: every method's engine "
                        "built first and each category timed with the methods in turn, so that a drift of the card "
                        "over the run falls on every method alike)")
    p.add_argument("--out", default="bench/suite", help="path prefix for .json and .png")


def cmd_evaluate(args) -> int:
    import torch

    from specheads.evaluation.run import (check_save_tree, choose_tree, environment, evaluate, parse_methods,
                                          print_table, save)
    from specheads.drafters import default_method
    from specheads.evaluation.suite import SuiteError, load_suite
    from specheads.heads.format import load_head, save_head_tree
    from specheads.target.loader import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    head = load_head(args.draft, device=device, dtype=dtype) if args.draft else None
    kind = head.kind if head is not None else "eagle3"
    methods = parse_methods(args.methods or ([default_method(head)] if head is not None else ["ngram"]),
                            resolve_tree(args.num_steps, args.topk, args.num_draft_tokens, head), kind)
    if args.save_tree:
        check_save_tree(args.split, args.draft, methods, kind)
    drafting = [m.name for m in methods if m.method not in ("ar", "ngram")]
    if drafting and head is None:
        raise SuiteError(f"methods {', '.join(drafting)} need a draft head (--draft)")
    wrong = [m.name for m in methods if m.method not in ("ar", "ngram", kind, f"{kind}+ngram")]
    if wrong:
        raise SuiteError(f"methods {', '.join(wrong)} need a head of their kind; --draft is a {kind} head")
    prompts = load_suite(args.split, args.categories, limit=args.limit)
    model, tok, _ = load_target(args.target, dtype=dtype, device=device)
    report = {**environment(model), "target": args.target or "SmolLM2-135M-Instruct (embedded)", "draft": args.draft,
              "split": args.split}
    # the cells measured so far, on disk while the run goes on (a run stopped or killed keeps them)
    partial = Path(args.out).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)

    def keep(cells):
        tmp = partial.with_suffix(".tmp")
        tmp.write_text(json.dumps({**report, "categories": cells, "complete": False}, indent=1))
        tmp.replace(partial)

    report.update(evaluate(model, tok, head, prompts, methods, batch_size=args.batch_size,
                           max_new_tokens=args.max_new_tokens, progress=lambda s: print(s, file=sys.stderr, flush=True),
                           estimate=args.estimate, on_cell=keep,
                           interleave=not args.sequential))
    js, png = save(report, Path(args.out))
    partial.unlink(missing_ok=True)
    print_table(report)
    print(f"wrote {js} and {png}")
    if args.save_tree:
        tree, chosen_on = choose_tree(report, methods, kind)
        save_head_tree(args.draft, tree, {**chosen_on, "report": str(js)})
        print(f"{args.draft}: default tree {','.join(map(str, tree))} (mean speedup {chosen_on['speedup']:.3f}x over "
              f"{len(chosen_on['categories'])} categories of the validation split)")
    return 0


def cmd_export(args) -> int:
    from specheads.hub import export_head

    out = export_head(args.head, args.format, args.output)
    print(f"exported {args.head} for {args.format} -> {out}")
    serving = out / "SERVING.md"
    if not serving.is_file():  # a layout no engine at specheads' pins serves (speculators' EAGLE-1 type)
        print(f"no SERVING.md: specheads knows no engine that serves {args.format} folders of this head kind")
        return 0
    # SERVING.md past its title: the launch command, after what to fill in where the target is not known
    print("\n".join(line.strip() for line in serving.read_text().splitlines()[1:] if line.strip()))
    return 0


def cmd_publish(args) -> int:
    from specheads.publish import publish_head

    result = publish_head(args.head, args.repo_id, private=args.private, revision=args.revision,
                          dry_run=args.dry_run, output=args.output, token=args.token,
                          commit_message=args.commit_message, bench=args.bench, force=args.force,
                          base_model=args.base_model)
    for name, size in result.files.items():
        print(f"{size:>12,d}  {name}")
    if result.base_model is None:
        print("note: the card names no base model (the target is a local path); pass --base-model ORG/NAME "
              "to link the target's hub id")
    if result.status == "dry-run":
        print(f"dry run: nothing uploaded; the folder for {args.repo_id} is {result.folder}")
    elif result.status == "up-to-date":
        print(f"{args.repo_id}@{args.revision} already holds these files: nothing to do ({result.url})")
    else:
        print(f"published {args.head} -> {result.url}")
    return 0


def cmd_serve(args) -> int:
    from specheads.server.launch import serve

    _use_kernel_tuning(args)
    serve(args.target, args.draft, host=args.host, port=args.port, served_model_name=args.served_model_name,
          api_key=args.api_key or os.environ.get("SPECHEADS_API_KEY") or None, max_queue=args.max_queue,
          request_timeout=args.request_timeout, shutdown_grace=args.shutdown_grace,
          max_request_bytes=args.max_request_bytes, method=args.method,
          num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens, max_batch=args.max_batch,
          max_len=args.max_len, draft_lm_head_int8=args.draft_lm_head == "int8",
          speculation_policy=args.speculation_policy, speculation_tiers=args.speculation_tiers,
          speculation_profile=args.speculation_profile, speculation_settings=args.speculation_settings,
          draft_options=args.draft_option)
    return 0


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculation-policy", choices=["fixed", "adaptive"], default=None,
                   help="fixed: the tree of --num-steps/--topk/--num-draft-tokens at every step; adaptive: per step "
                        "one of --speculation-tiers (within that tree) or none, for the most tokens/s by the rows' "
                        "recent acceptance and the card's measured step costs (outputs are the same either way). "
                        "Default: adaptive on a GPU, fixed on a CPU (there adaptive where --speculation-tiers, "
                        "--speculation-settings or --speculation-profile is given)")
    p.add_argument("--speculation-tiers", default=None, metavar="S,K,N;...",
                   help="the adaptive policy's trees as STEPS,TOPK,DRAFT_TOKENS, e.g. '1,1,1;2,1,2;4,1,4' (the "
                        "full tree is always one); default: chains 1, 2 and 4 deep and the full tree")
    p.add_argument("--speculation-settings", default=None, metavar="NAME=VALUE,...",
                   help="the adaptive policy's settings, e.g. 'switch_margin=0.08' (a smaller tier replaces the "
                        "full tree only where it promises that share more tokens/s); names: window, prior, "
                        "prior_weight, pooled_window, probe_every, probe_backoff, explore_every, switch_margin "
                        "(specheads/runtime/policy.py)")
    p.add_argument("--speculation-profile", default=None, metavar="JSON",
                   help="the adaptive policy's step costs: loaded from this file where it exists; buckets it lacks "
                        "are measured on this card and saved there (default: measured at start-up, not saved; CPU "
                        "without a profile: a static model)")


def _policy_options(args, cuda: bool) -> dict:
    """The engine's speculation policy options from the command line."""
    from specheads.runtime.policy import default_policy

    return {"speculation_policy": args.speculation_policy or default_policy(cuda, args.speculation_tiers,
                                                                             args.speculation_profile,
                                                                             args.speculation_settings),
            "speculation_tiers": args.speculation_tiers, "speculation_profile": args.speculation_profile,
            "speculation_settings": args.speculation_settings}


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-lm-head", choices=["int8", "bf16"], default="int8",
                   help="the draft head's lm_head while drafting on the GPU: int8 (default: half the bytes a draft "
                        "depth streams) or bf16 (the weight as loaded); changes drafts only, never the output")
    p.add_argument("--draft-option", action="append", default=[], metavar="NAME=VALUE",
                   help="a drafter option (repeatable), e.g. ngram_gate=0: with the n-gram assist, a step whose rows "
                        "all take the lookup's chain skips the head's tree in batches up to ngram_gate rows "
                        "(default 1 under the fixed and the adaptive policy; 0: never); ngram_gate_chain, "
                        "ngram_gate_long (the gated steps' chains: 31 and, after a fully accepted one, 63); "
                        "ngram_min=2; "
                        "changes a step's cost or drafts, never the output")
    p.add_argument("--kernel-tuning", default=None, metavar="JSON_OR_FILE",
                   help="kernel settings over the card's defaults, as JSON or a JSON file, e.g. "
                        "'{\"speed\": {\"draft_warps\": 4}, \"numerics\": {\"attention_chunk\": 64}}' "
                        "(fields: specheads/kernels/tuning.py; speed fields never change an output bit, "
                        "numerics fields change how bf16 outputs round)")


def _use_kernel_tuning(args) -> None:
    """--kernel-tuning over the card's defaults, for every kernel from here on (before the
    engine fuses its models and captures its graphs)."""
    from specheads.kernels.tuning import use_given

    use_given(args.kernel_tuning)


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF folder, hub id or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="head folder or hub id, or a small LM of the target's family with "
                   "the same tokenizer (folder or .gguf: method draft_model); without it: --method ar or ngram")
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="required as 'Authorization: Bearer KEY' (default: env SPECHEADS_API_KEY)")
    p.add_argument("--served-model-name", default=None, help="the `model` clients pass (default: the target's name)")
    p.add_argument("--method", default=None, help=METHOD_HELP)
    p.add_argument("--num-steps", type=int, default=None, help=f"draft depth (requests may ask for less; {TREE_DEFAULT_HELP})")
    p.add_argument("--topk", type=int, default=None, help="branching per node; 1 = chain")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="tree nodes verified per step (requests may ask for less)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together")
    p.add_argument("--max-len", type=int, default=None, help="cache length per request: prompt + output")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot; more get 429")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds from arrival, queue included")
    p.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds in-flight requests get on shutdown")
    p.add_argument("--max-request-bytes", type=int, default=4 * 2**20,
                   help="largest request body; a larger one is a 413 (default 4 MiB)")
    _add_policy_args(p)
    _add_kernel_args(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specheads", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="conversations -> tokenized dataset (+ optional target regeneration)")
    _add_prepare_args(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("self-prompts", help="user prompts written by the target itself (then: prepare --regenerate)")
    p.add_argument("--target", default=None, help="HF folder, hub id or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="output folder: chunks as they are sampled (a rerun continues), "
                   "then prompts.jsonl.gz and info.json")
    p.add_argument("--count", type=int, default=1000, help="prompts sampled (fewer are kept: see info.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=256, help="a prompt whose turn has not ended by then is dropped")
    p.add_argument("--min-words", type=int, default=3)
    p.add_argument("--system", default=None, help="a system turn of your own (default: the chat template's)")
    p.add_argument("--chunk", type=int, default=512, help="prompts saved at a time")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:K (default: the GPU if there is one)")
    p.set_defaults(func=cmd_self_prompts)

    p = sub.add_parser("train", help="train a draft head (also under deepspeed / torchrun)")
    _add_train_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="a trained head's held-out accuracy and simulated acceptance on prepared data")
    p.add_argument("--draft", required=True, help="head folder (final/)")
    p.add_argument("--data", required=True, help="a folder written by `specheads prepare` (its eval split is used)")
    p.add_argument("--target", default=None, help="default: the target the data was prepared with")
    p.add_argument("--rows", type=int, default=256, help="held-out conversations, at most")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ttt-steps", type=int, default=7, help="draft steps simulated")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("demo", help="prepare + train on the embedded SmolLM2 + ShareGPT (CPU: configs/demo.yaml)")
    p.add_argument("--conversations", type=int, default=None,
                   help="CPU demo: conversations read (default 400: specheads/demo.py)")
    p.add_argument("--steps", type=int, default=None,
                   help="CPU demo: optimizer steps (default: train.max_steps in configs/demo.yaml, 80)")
    p.add_argument("--cpu", action="store_true", help="the CPU demo even where a GPU is present")
    p.add_argument("--fresh", action="store_true", help="redo data and training from scratch")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="generate with target + draft head (speculative, lossless)")
    p.add_argument("--target", default=None)
    p.add_argument("--draft", default=None, help="head folder written by specheads (final/) or hub id org/name[@rev], "
                   "or a small LM of the target's family with the same tokenizer (folder or .gguf: method draft_model)")
    p.add_argument("--method", default=None, help=METHOD_HELP)
    p.add_argument("--prompt", required=True, action="append", help="repeat for a batch")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-steps", type=int, default=None, help=f"draft depth ({TREE_DEFAULT_HELP})")
    p.add_argument("--topk", type=int, default=None, help="branching per node; 1 = chain")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="tree nodes verified per step")
    p.add_argument("--static-tree", default=None, help="fixed tree, e.g. '0;1;0,0;0,1;0,0,0'")
    _add_policy_args(p)
    _add_kernel_args(p)
    p.add_argument("--max-len", type=int, default=None,
                   help="cache length: prompt + output (default: the target's context, at most 4096)")
    p.add_argument("--json", action="store_true",
                   help="print token ids, text and stats as JSON; mean_accept_length = 1 + accepted drafts per "
                        "verify step (the prefill not counted): exactly 1.0 with nothing drafted (--method ar), "
                        "null where no verify step ran")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("evaluate", help="acceptance and speedup by category on the held-out evaluation suite")
    _add_evaluate_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("export", help="write a head folder for one serving engine (e.g. sglang or vllm)")
    p.add_argument("head", help="a head folder (e.g. runs/smollm2-eagle3/final) or hub id org/name[@rev]")
    p.add_argument("--format", choices=_Registered(_export_format_names), metavar="FORMAT", required=True,
                   help="the engine: one of the head kind's export formats (%(choices)s)")
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("publish", help="upload a head folder and a generated model card to the Hugging Face Hub")
    p.add_argument("head", help="a head folder (e.g. runs/smollm2-eagle3/final) or a hub id")
    p.add_argument("--repo-id", required=True, help="org/name on the Hub")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--revision", default="main", help="branch to commit to (created if missing)")
    p.add_argument("--dry-run", action="store_true", help="write the folder that would be uploaded; no network")
    p.add_argument("--output", default=None, help="with --dry-run: write the folder here (default: a temp folder)")
    p.add_argument("--token", default=None, help="default: HF_TOKEN, else the token of `huggingface-cli login`")
    p.add_argument("--commit-message", default=None)
    p.add_argument("--bench", default=None, help="scripts/bench.py JSON for the card (default: <head>/bench.json)")
    p.add_argument("--force", action="store_true", help="overwrite a repo that holds other content")
    p.add_argument("--base-model", default=None, metavar="ORG/NAME",
                   help="the target's hub id for the card's base_model and launch commands "
                        "(default: the target's hub id when it was loaded by id)")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("serve", help="serve target + head over an OpenAI-compatible HTTP API")
    _add_serve_args(p)
    p.set_defaults(func=cmd_serve)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    from specheads.errors import USER_ERRORS

    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"specheads {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
