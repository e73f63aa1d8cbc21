"""How the n-gram assist should share a step's draft nodes between the lookup's chain and the head's
tree, replayed from teacher-forced traces (CPU is fine; the served acceptance is what the estimate
scores, specheads/evaluation/estimate.py).

For every step root of the target's greedy answers in a policy_sim traces file (its prompts and
answers), this records: whether the lookup found a suffix match of at least `ngram_min` tokens, how
many of its chain's drafts the answer accepts (at most N), and how many drafts the head's tree
accepts when only its first n nodes by draft score are kept, for n = 0..N (the nodes of rank <= n
form a tree). A split L then drafts, in a row whose lookup matched, the chain's first L tokens and
the head's first N - L nodes in the same N + 1 node step (the union is still a tree of N + 1 nodes
at most; where the chain's first token is the head's, a node is shared and one is spare), and
accepts the longer of the two paths. L = N is the assist as it is (the chain replaces the tree).
Walking each answer as the engine does gives each split's mean acceptance.

    python3 gpu_runs/assist_split.py --traces docs/results/policy-sim-cpu/validation_l8_t256_traces.json.gz \
        --draft .dev/head --out docs/results/assist-split-cpu/validation_l8.json

With --chains C1,C2,... beside --traces and --positions (a replay of the same answers), the gated long
chain of each length C is replayed without the head: the lookup alone runs at every root (chains up to
the longest C), the head's full tree taken from the positions file, each answer walked with the chain
where the lookup matched (as a gated batch-1 step verifies it) and the tree elsewhere. With --ladder
L1,L2,... as well, the first C is the gated chain and each L the ladder's (ngram_gate_long: a gated step
right after a gated one that accepted every draft verifies L drafts).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specheads.evaluation.estimate import (following, ladder_walk, lookup_accepted, prefilled_roots,  # noqa: E402
                                          scoring_drafter, walk, walk_with)
from specheads.files import read_text  # noqa: E402
from specheads.kernels.verify import accept, ancestors_reference  # noqa: E402


def positions(drafter, target, sequence: list[int], start: int, rows: int = 64) -> list[dict]:
    """Per step root L in [start, len - 1): {"found", "chain", "tree": [accepted with the head's first n
    nodes, n = 0..N]}."""
    head, big = drafter.inner, drafter.num_draft
    result = []
    with torch.no_grad():
        for chunk, seq, ctx in prefilled_roots(drafter, target, sequence, start, rows):
            tree = head.propose(ctx)
            # the chain: how many of its drafts spell the answer's next tokens
            chain, found = lookup_accepted(drafter, ctx, seq, chunk, drafter.cols)
            chain = chain.clamp(max=big)
            # the head's tree cut to its first m nodes by rank, m = 0..N
            y = following(seq, chunk[:, None] + tree.depth + 1)
            anc = ancestors_reference(tree.parents, tree.max_depth).contiguous()
            rank = tree.ranks()
            per_m = []
            for m in range(big + 1):
                valid = (tree.valid & (rank <= m)).contiguous()
                _, length, _, _ = accept(tree.tokens.contiguous(), tree.parents.contiguous(), valid,
                                         tree.depth.contiguous(), anc, y, tree.max_depth)
                per_m.append(length - 1)
            per_m = torch.stack(per_m, 1)
            result += [{"found": bool(found[r]), "chain": int(chain[r]) if found[r] else 0, "tree": per_m[r].tolist()}
                       for r in range(len(chunk))]
    return result


def accepted(pos: list[dict], split: int, big: int) -> list[int]:
    """Drafts accepted a step with the chain's first `split` tokens beside the head's first big - split nodes."""
    return [max(min(p["chain"], split), p["tree"][big - split]) if p["found"] else p["tree"][big] for p in pos]


def mean_length(accepts: list[list[int]], new: list[int]) -> float:
    """The engine's mean acceptance length over answers walked with these per-root accepted drafts."""
    s_t = [walk(a, n) for a, n in zip(accepts, new)]
    return 1 + sum(t for _, t in s_t) / sum(s for s, _ in s_t)


def chain_steps(pos: list[dict], n: int, big: int) -> tuple[int, int]:
    """(steps, steps whose row took the lookup's chain) serving n tokens with the assist as it is."""
    steps, _, chained = walk_with(n, lambda i: (pos[i]["chain"] if pos[i]["found"] else pos[i]["tree"][big],
                                                int(pos[i]["found"])))
    return steps, chained


def _groups(cats: list[str]) -> dict[str, list[int]]:
    """Prompt indices of all prompts, the chat ones and the coding ones."""
    groups = {"all": list(range(len(cats)))}
    for i, c in enumerate(cats):
        groups.setdefault("coding" if c == "coding" else "chat", []).append(i)
    return groups


def summarize(rows: list[list[dict]], cats: list[str], new: list[int], big: int) -> dict:
    """Each split's mean acceptance, the longer of the full chain and the full tree, and the share of
    the assist's steps that take the chain, over all prompts, the chat ones and the coding ones."""
    groups = _groups(cats)
    splits = {split: {c: mean_length([accepted(rows[i], split, big) for i in idx], [new[i] for i in idx])
                      for c, idx in groups.items()} for split in range(big + 1)}
    oracle = {c: mean_length([[max(p["chain"], p["tree"][big]) for p in rows[i]] for i in idx],
                             [new[i] for i in idx]) for c, idx in groups.items()}
    # the gated long chain (ngram_gate_chain = big): the whole chain where the lookup matched, the
    # head's first m nodes (a tree of m drafts, what a step of that width drafts) elsewhere
    long_chain = {m: {c: mean_length([[p["chain"] if p["found"] else p["tree"][m] for p in rows[i]] for i in idx],
                                     [new[i] for i in idx]) for c, idx in groups.items()} for m in range(1, big + 1)}
    share = {}
    for c, idx in groups.items():
        counts = [chain_steps(rows[i], new[i], big) for i in idx]
        share[c] = sum(k for _, k in counts) / sum(s for s, _ in counts)
    return {"categories": cats, "prompts": len(cats), "splits": splits, "oracle": oracle, "long_chain": long_chain,
            "matched_roots": sum(p["found"] for pos in rows for p in pos) / sum(len(pos) for pos in rows),
            "chain_step_share": share}


def lookup_chains(target, prompts: list[list[int]], answers: list[list[int]], longest: int,
                  max_ngram: int, min_ngram: int) -> list[list[tuple[bool, int]]]:
    """Per answer, per step root (as `positions`): (whether the lookup matched, how many of its chain's
    first `longest` drafts the answer accepts), the lookup alone (no head)."""
    from types import SimpleNamespace

    from specheads.drafters.ngram import DeviceNgramDrafter

    ngram = DeviceNgramDrafter(longest, max_ngram)
    longest_seq = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ngram.allocate(64, longest_seq + longest + 2, torch.device("cpu"), torch.float32)
    cols = torch.arange(longest)
    out = []
    with torch.no_grad():
        for p, a in zip(prompts, answers):
            rows = []
            for chunk, seq, ctx in prefilled_roots(ngram, target, p + a, len(p)):
                n, found = lookup_accepted(SimpleNamespace(lookup=ngram, min_ngram=min_ngram), ctx, seq, chunk, cols)
                rows += [(bool(f), int(k)) for f, k in zip(found, n)]
            out.append(rows)
    return out


def gated_walks(rows: list[list[dict]], chains: list[list[tuple[bool, int]]], cats: list[str], new: list[int],
                chain: int, long: int, nodes: int) -> dict:
    """By group, the mean acceptance and the steps by kind ("tree", "chain", "ladder") of each answer walked
    with the lookup alone's chain of `chain` drafts where it matched (`long` right after a gated step that
    accepted all of its: the ladder, none where long == chain) and the head's tree of `nodes` nodes elsewhere."""
    for pos, ch in zip(rows, chains):
        assert len(pos) == len(ch) and all(p["found"] == f for p, (f, _) in zip(pos, ch)), "another replay's positions"
    out = {}
    for g, idx in _groups(cats).items():
        steps = drafts = 0
        kinds = {"tree": 0, "chain": 0, "ladder": 0}
        for i in idx:
            s, d = ladder_walk([p["tree"][nodes] for p in rows[i]], [k if f else -1 for f, k in chains[i]], new[i],
                               chain, long, kinds)
            steps, drafts = steps + s, drafts + d
        out[g] = {"accept": 1 + drafts / steps, "steps": kinds}
    return out


def chain_walks(rows: list[list[dict]], chains: list[list[tuple[bool, int]]], cats: list[str], new: list[int],
                lengths: list[int], nodes: int) -> dict:
    """Mean acceptance per gated chain length C (the chain up to C where the lookup matched, the head's
    tree of `nodes` nodes elsewhere), over all prompts, the chat ones and the coding ones."""
    return {c: {g: v["accept"] for g, v in gated_walks(rows, chains, cats, new, c, c, nodes).items()} for c in lengths}


def ladder_walks(rows: list[list[dict]], chains: list[list[tuple[bool, int]]], cats: list[str], new: list[int],
                 chain: int, ladders: list[int], nodes: int) -> dict:
    """Per ladder length L, by group, the mean acceptance and the steps by kind (gated_walks)."""
    return {long: gated_walks(rows, chains, cats, new, chain, long, nodes) for long in ladders}


def chain_step_shares(rows: list[list[dict]], chains: list[list[tuple[bool, int]]], cats: list[str],
                      new: list[int], lengths: list[int], nodes: int) -> dict:
    """Per gated chain length C, the steps a batch-1 request takes (its walk as in chain_walks) and the
    share of them that verify the chain (gated steps, which skip the head's tree), by group: what a
    step's cost of each kind prices into tokens/s."""
    out = {}
    for c in lengths:
        out[c] = {}
        for g, v in gated_walks(rows, chains, cats, new, c, c, nodes).items():
            steps = sum(v["steps"].values())
            out[c][g] = {"steps": steps, "gated_share": v["steps"]["chain"] / steps}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", help="a policy_sim traces file: its prompts and the target's answers")
    ap.add_argument("--positions", help="instead: a _positions.json.gz this script wrote (summarized again, no model)")
    ap.add_argument("--target", default=None, help="default: the traces file's")
    ap.add_argument("--draft", help="the head (with --traces)")
    ap.add_argument("--tree", default="6,4,15", help="S,K,N: the head's tree (N nodes shared with the chain)")
    ap.add_argument("--ngram-min", type=int, default=None)
    ap.add_argument("--ngram-max", type=int, default=None, help="with --chains: the lookup's longest suffix "
                    "(default: the assist's)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--skip", nargs="*", default=[], help="categories to leave out (e.g. coding, traced elsewhere)")
    ap.add_argument("--chains", default=None, help="C1,C2,...: the gated long chain's lengths, replayed with the "
                    "lookup alone (with --traces and --positions)")
    ap.add_argument("--nodes", type=int, default=None, help="with --chains: the head's tree cut to its first N nodes "
                    "(default: every node the positions hold)")
    ap.add_argument("--ladder", default=None, help="L1,L2,...: with --chains C,...: the ladder's chains after C")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.chains:
        return replay_chains(args)
    if bool(args.traces) == bool(args.positions) or (args.traces and not args.draft):
        ap.error("give --traces and --draft (a replay), or --positions (a replay's positions to summarize again)")
    if args.positions:
        saved = json.loads(read_text(args.positions))
        rows, cats, new = saved["positions"], saved["categories"], saved["new_tokens"]
        big = len(rows[0][0]["tree"]) - 1
        report = {"positions": args.positions, **summarize(rows, cats, new, big)}
        Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1))
        show(report, big)
        return 0

    from specheads.evaluation.suite import load_suite
    from specheads.heads.format import load_head
    from specheads.target.loader import load_target

    data = json.loads(read_text(args.traces))
    target, _, _ = load_target(args.target or data["key"]["target"], dtype=torch.float32, device="cpu")
    head = load_head(args.draft, device="cpu", dtype=torch.float32)
    steps, topk, big = (int(x) for x in args.tree.split(","))
    prompts, answers = data["prompts"], data["answers"]
    drafter = scoring_drafter(target, head, "eagle3+ngram", {"num_steps": steps, "topk": topk, "num_draft_tokens": big},
                              prompts, answers)
    if args.ngram_min is not None:
        drafter.min_ngram = args.ngram_min
    key = data["key"]
    cats = [q.category for q in load_suite(key["split"], key["categories"], limit=key["limit"])]
    assert len(cats) == len(prompts), (len(cats), len(prompts))
    keep = [i for i, c in enumerate(cats) if c not in args.skip]
    prompts, answers, cats = [prompts[i] for i in keep], [answers[i] for i in keep], [cats[i] for i in keep]
    rows = []
    for i, (p, a) in enumerate(zip(prompts, answers)):
        rows.append(positions(drafter, target, p + a, len(p)))
        print(f"{i + 1}/{len(prompts)}", flush=True)
    new = [max(min(len(a), args.max_new_tokens), 1) for a in answers]
    report = {"traces": args.traces, "draft": args.draft, "tree": args.tree, "ngram_min": drafter.min_ngram,
              **summarize(rows, cats, new, big)}
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    with gzip.open(out.with_name(out.stem + "_positions.json.gz"), "wt") as f:
        json.dump({"categories": cats, "new_tokens": new, "positions": rows}, f)
    show(report, big)
    return 0


def replay_chains(args) -> int:
    """--chains: each gated chain length's mean acceptance (see the module doc)."""
    from specheads.drafters.assist import MAX_NGRAM, MIN_NGRAM
    from specheads.target.loader import load_target

    if not (args.traces and args.positions):
        raise SystemExit("--chains needs --traces (the answers) and --positions (the head's side, the same answers)")
    data, saved = json.loads(read_text(args.traces)), json.loads(read_text(args.positions))
    target, _, _ = load_target(args.target or data["key"]["target"], dtype=torch.float32, device="cpu")
    prompts, answers = data["prompts"], data["answers"]
    assert len(prompts) == len(saved["positions"]), "the positions file is of another replay"
    lengths = [int(x) for x in args.chains.split(",")]
    chains = lookup_chains(target, prompts, answers, max(lengths), args.ngram_max or MAX_NGRAM,
                           args.ngram_min or MIN_NGRAM)
    nodes = len(saved["positions"][0][0]["tree"]) - 1  # the head's tree as the positions were replayed
    nodes = min(nodes, args.nodes or nodes)
    report = {"traces": args.traces, "positions": args.positions, "tree_nodes": nodes,
              "chains": chain_walks(saved["positions"], chains, saved["categories"], saved["new_tokens"], lengths, nodes),
              "steps": chain_step_shares(saved["positions"], chains, saved["categories"], saved["new_tokens"], lengths,
                                         nodes)}
    if args.ladder:
        ladders = [int(x) for x in args.ladder.split(",")]
        assert max(ladders) <= max(lengths), "--chains must reach the longest --ladder"
        report["ladder"] = {"chain": lengths[0], **ladder_walks(saved["positions"], chains, saved["categories"],
                                                                 saved["new_tokens"], lengths[0], ladders, nodes)}
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    for c_len, acc in report["chains"].items():
        steps = report["steps"][c_len]
        print(f"gated chain {c_len:>3}, the head's {nodes} nodes elsewhere: " + "  ".join(
            f"{g} {v:.3f} ({steps[g]['steps']} steps, {steps[g]['gated_share']:.1%} gated)" for g, v in acc.items()))
    for long, by in report.get("ladder", {}).items():
        if long != "chain":
            print(f"gated chain {lengths[0]:>3}, ladder {long:>3}: " + "  ".join(
                f"{g} {v['accept']:.3f} (steps {v['steps']})" for g, v in by.items()))
    return 0


def show(report: dict, big: int) -> None:
    for split, acc in report["splits"].items():
        print(f"chain {split:>2} + head {big - split:>2}: " + "  ".join(f"{c} {v:.3f}" for c, v in acc.items()))
    for m, acc in report["long_chain"].items():
        print(f"chain {big} where matched, else the head's {m:>2} nodes: "
              + "  ".join(f"{c} {v:.3f}" for c, v in acc.items()))
    print("oracle (the longer of the full chain and the full tree): "
          + "  ".join(f"{c} {v:.3f}" for c, v in report["oracle"].items())
          + f"; matched at {report['matched_roots']:.1%} of roots; steps on the chain: "
          + "  ".join(f"{c} {v:.1%}" for c, v in report["chain_step_share"].items()))


if __name__ == "__main__":
    raise SystemExit(main())
