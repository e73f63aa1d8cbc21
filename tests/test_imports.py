"""The package's import graph (every `import specheads...` anywhere in a module, function bodies
included): no module reaches itself through others, and serving, decoding and evaluation import
no data preparation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "specheads"


def import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specheads"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def test_no_import_circle():
    graph = import_graph()
    seen, on_path, circles = set(), [], []

    def visit(m):
        on_path.append(m)
        for n in sorted(graph[m]):
            if n in on_path:
                circles.append(on_path[on_path.index(n):] + [n])
            elif n not in seen:
                visit(n)
        on_path.pop()
        seen.add(m)

    for m in sorted(graph):
        if m not in seen:
            visit(m)
    assert not circles, f"import circles: {circles}"


def test_serving_decoding_and_evaluation_import_no_data_preparation():
    graph = import_graph()
    for m, deps in graph.items():
        if m.startswith(("specheads.server", "specheads.runtime", "specheads.evaluation", "specheads.target")):
            assert not {d for d in deps if d.startswith("specheads.data")}, m
