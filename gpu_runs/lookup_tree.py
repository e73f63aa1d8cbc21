"""Prompt lookup with several matches, replayed from teacher-forced traces (token ids only: no model).

The assist's lookup (drafters/ngram.py) drafts the continuation of the latest earlier occurrence of the
history's longest suffix (max_ngram down to min_ngram tokens). Where that suffix occurred several times
with different continuations, a tree of them (a trie: shared prefixes merged) verified in the gated
step's nodes accepts the longest that spells the answer. For every step root of a traces file's answers
where the lookup matches, this scores: the latest match's chain (the assist as it is), a trie of the
first m matches (the latest first, `--first` nodes to it, the others after it, `--nodes` in all) and
the oracle (the best match's full chain, any number of nodes); roots without a match take the head's
tree from an assist_split positions file. Each answer is walked as a batch-1 engine walks it.

    python3 gpu_runs/lookup_tree.py --traces docs/results/policy-sim-cpu/assist_validation_coding_l40_t256_traces.json.gz \\
        --positions docs/results/assist-split-cpu/validation_coding40_tree31_positions.json.gz --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specheads.evaluation.estimate import walk  # noqa: E402
from specheads.files import read_text  # noqa: E402


def matches(seq: list[int], root: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Positions p < root whose n tokens ending at p equal the n ending at the root, for the largest n
    (max_ngram down to min_ngram) that has any, latest first."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if root - n + 1 < 0:
            continue
        suffix = seq[root - n + 1: root + 1]
        found = [p for p in range(root - 1, n - 2, -1) if seq[p - n + 1: p + 1] == suffix]
        if found:
            return found
    return []


def continuation(seq: list[int], root: int, p: int, k: int) -> list[int]:
    """The k tokens after match p, repeating with the period root - p where they run into the suffix."""
    return [seq[p + 1 + (i % (root - p))] for i in range(k)]


def spelled(draft: list[int], want: list[int]) -> int:
    """How many of a chain's first tokens spell the answer's next ones."""
    n = 0
    for x, y in zip(draft, want):
        if x != y:
            break
        n += 1
    return n


def trie_accepts(chains: list[list[int]], nodes: int, want: list[int]) -> int:
    """The chains inserted in order into a trie of at most `nodes` nodes: the longest path spelling `want`."""
    trie, used = {}, 0
    for chain in chains:
        node = trie
        for tok in chain:
            if tok not in node:
                if used == nodes:
                    break
                node[tok] = {}
                used += 1
            node = node[tok]
    node, n = trie, 0
    for tok in want:
        if tok not in node:
            break
        node, n = node[tok], n + 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--positions", required=True, help="an assist_split positions file of the same answers")
    ap.add_argument("--nodes", type=int, default=31, help="the gated step's drafts")
    ap.add_argument("--tree-nodes", type=int, default=15, help="the head's tree where the lookup does not match")
    ap.add_argument("--first", type=int, default=20, help="the latest match's chain in the trie")
    ap.add_argument("--max-ngram", type=int, default=4)
    ap.add_argument("--min-ngram", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data, saved = json.loads(read_text(args.traces)), json.loads(read_text(args.positions))
    rules = ["latest", "trie2", "trie4", "oracle"]
    accepted = {r: [] for r in rules}
    for prompt, answer, pos in zip(data["prompts"], data["answers"], saved["positions"]):
        seq = prompt + answer
        per = {r: [] for r in rules}
        for j, root in enumerate(range(len(prompt), len(seq) - 1)):
            want = seq[root + 1: root + 1 + args.nodes]
            found = matches(seq, root, args.max_ngram, args.min_ngram)
            if not found:
                for r in rules:
                    per[r].append(pos[j]["tree"][args.tree_nodes])
                continue
            chains = [continuation(seq, root, p, args.nodes) for p in found]
            per["latest"].append(spelled(chains[0], want))
            per["oracle"].append(max(spelled(c, want) for c in chains))
            for m in (2, 4):
                per[f"trie{m}"].append(trie_accepts([chains[0][: args.first], *chains[1:m], chains[0]], args.nodes, want))
        for r in rules:
            accepted[r].append(per[r])
    new = saved["new_tokens"]
    report = {"traces": args.traces, "nodes": args.nodes, "first": args.first, "accept": {}}
    for r in rules:
        w = [walk(a, n) for a, n in zip(accepted[r], new)]
        report["accept"][r] = 1 + sum(t for _, t in w) / sum(s for s, _ in w)
        print(f"{r:>7}: accept {report['accept'][r]:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
