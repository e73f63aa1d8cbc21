"""Build the `code-prompts` data source (specheads/data/code_prompts.jsonl.gz): programming prompts
made from the functions of the CPython standard library (PSF-2.0), one user turn each, no answer.
`specheads prepare --regenerate` has the target answer them.

    python scripts/build_code_prompts.py [--check]

It walks the running interpreter's standard library in sorted order (leaving out test/, tests/,
idlelib/, lib2to3/, turtledemo/, ensurepip/, site-packages/, files that do not parse, and modules
that carry a licence grant of their own besides the PSF's, such as logging, tarfile or xml.etree)
and takes public top-level functions and public methods of public top-level classes that have a
docstring of at least MIN_DOC characters and at most MAX_BODY lines of code after it. Each becomes
one prompt, its template drawn by a random generator seeded with the function's id (so that one
function's template does not depend on the others):
  complete  (1/2)  "Complete the following Python function." + its def line(s) and docstring, no
                   body: the shape of the evaluation suite's HumanEval prompts
  explain   (1/4)  "Explain what this Python function does and how it works." + its source
  write     (1/4)  "Write a Python function `name(signature)` that ..." + the docstring's first
                   paragraph (its verb in the third person; a paragraph that does not open with a
                   verb follows "matching this description: ")
Prompts longer than MAX_CHARS, exact duplicates, and every prompt that shares a word 8-gram with
any turn of the evaluation suite (all splits) are dropped. The counts, the Python version that
built the file and the licence go to code_prompts.json beside it. The standard library differs
between Python versions, so `--check` (rebuild and compare) needs the version named there.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import platform
import random
import re
import sys
import sysconfig
import textwrap
import tokenize
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specheads.data.sources import CODE_PROMPTS_FILE, CODE_PROMPTS_INFO  # noqa: E402
from specheads.evaluation.suite import ngrams, suite_ngrams  # noqa: E402

SEED = "specheads-code-prompts-v1"
# a licence grant besides the PSF's: such a module is left out, so that every prompt is under the PSF's alone
OWN_LICENSE = re.compile(r"Permission\s+to\s+use|Permission\s+is\s+hereby\s+granted|Redistribution\s+and\s+use"
                         r"|licen[cs]ed\s+under", re.I)
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "__pycache__"}
MIN_DOC = 40  # characters of the cleaned docstring
MAX_BODY = 50  # lines of code after the docstring
MAX_CHARS = 3000  # of the whole prompt
TEMPLATES = (("complete", 2), ("explain", 1), ("write", 1))
LICENSE = "PSF-2.0"
# a docstring whose first word is one of these verbs (or its third person) reads on after "a function
# that ..."; any other is quoted as a description
VERBS = set("""
accept acquire add adjust allow append apply arrange ask assert attach attempt begin bind block build calculate
call cancel change check choose clean clear close collapse collect combine compare compile compress compute
configure connect construct consume convert copy count create decide decode decompress decorate define delegate
delete deliver deserialize destroy detect determine disable disassemble discard dispatch display divide do draw
dump emit enable encode end ensure enter escape evaluate execute exit expand extract fail feed fetch fill filter
find finish fix flush force format free generate get give guess handle hash identify ignore import indent indicate
initialize initialise insert install instruct interpret invoke iterate join keep link list load locate lock log
look lookup make map mark match merge modify move normalize normalise notify obtain open override pack parse
perform place pop post prepare print process produce push put query quote raise read receive record reduce reformat
register release reload remove rename render replace report represent request reset resolve restore retrieve
return reverse rewrite round run save scan schedule search seek select send separate serialize set shift show shut
signal skip sort spawn split start stop store strip submit substitute take tell terminate test toggle transform
translate truncate try turn unbind undo unescape unlink unlock unpack unquote unregister unwrap update upgrade use
validate verify visit wait wake walk wrap write yield
""".split())


def stdlib_files(stdlib: Path) -> list[Path]:
    """The library's .py files in sorted order, less the skipped folders."""
    files = []
    for path in stdlib.rglob("*.py"):
        parts = path.relative_to(stdlib).parts
        if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


def module_name(stdlib: Path, path: Path) -> str:
    parts = list(path.relative_to(stdlib).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def template_of(fid: str) -> str:
    names = [name for name, _ in TEMPLATES]
    return random.Random(f"{SEED}:{fid}").choices(names, weights=[w for _, w in TEMPLATES])[0]


def is_trivial(body: list[ast.stmt]) -> bool:
    """Nothing but pass, ..., or raise NotImplementedError (an abstract method or a stub)."""
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.unparse(stmt):
            continue
        return False
    return True


def first_paragraph(doc: str, name: str) -> str | None:
    """The docstring's first paragraph that is neither a signature line nor a doctest, on one line."""
    for para in re.split(r"\n\s*\n", doc.strip()):
        text = " ".join(para.split())
        if (not text or text.startswith(">>>") or re.match(rf"^[\w.]*{re.escape(name)}\s*\(", text)
                or re.match(r"^[\w.]+\(.*\)\s*->", text)):
            continue
        return text
    return None


def third_person(word: str) -> str | None:
    """`word` (lower case) as the third person of one of VERBS ("return", "returns" -> "returns"),
    or None when it is none of them."""
    if word in VERBS:
        if word.endswith(("s", "sh", "ch", "x", "z", "o")):
            return word + "es"
        if word.endswith("y") and word[-2:-1] not in tuple("aeiou"):
            return word[:-1] + "ies"
        return word + "s"
    stems = [word[:-3] + "y"] if word.endswith("ies") else []
    stems += [word[:-2]] if word.endswith("es") else []
    stems += [word[:-1]] if word.endswith("s") else []
    return word if any(stem in VERBS for stem in stems) else None


def write_request(text: str) -> str:
    """A docstring's first paragraph as what the function is to do: "that returns ..." where it
    opens with a verb ("Return ..." or "Returns ..."), else quoted as a description."""
    first, _, rest = text.partition(" ")
    word = first.rstrip(".,:;")
    verb = third_person(word.lower()) if word.isalpha() and word[:1].isupper() and word[1:].islower() else None
    if verb is None:
        return f"matching this description: {text}"
    return "that " + (verb + first[len(word):] + " " + rest).strip().rstrip(" .:;,") + "."


def function_lines(lines: list[str], node: ast.AST, until: int) -> list[str]:
    """The source lines of `node` from its first decorator to line `until` (1-based, inclusive)."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return lines[start - 1: until]


def code_block(code_lines: list[str], cls: str | None) -> str:
    code = textwrap.dedent("\n".join(code_lines))
    if cls is not None:  # a method: shown inside its class
        code = f"class {cls}:\n" + textwrap.indent(code, "    ")
    return code.rstrip()


def make_prompt(kind: str, lines: list[str], node, doc: str, cls: str | None) -> str | None:
    what = "method" if cls else "function"
    if kind == "complete":
        head = code_block(function_lines(lines, node, node.body[0].end_lineno), cls)
        return f"Complete the following Python {what}.\n\n```python\n{head}\n```"
    if kind == "explain":
        source = code_block(function_lines(lines, node, node.end_lineno), cls)
        return f"Explain what this Python {what} does and how it works.\n\n```python\n{source}\n```"
    para = first_paragraph(doc, node.name)
    if para is None:
        return None
    signature = f"{node.name}({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
    a = "an async Python" if isinstance(node, ast.AsyncFunctionDef) else "a Python"
    where = f" of a class `{cls}`" if cls else ""
    return f"Write {a} {what} `{signature}`{where} {write_request(para)}"


def candidates(tree: ast.Module):
    """(qualname, class or None, node) of public top-level functions and public methods of public
    top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, None, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", node.name, item


def prompts_of(module: str, source: str, dropped: Counter) -> tuple[int, list[dict]]:
    """The functions seen in one module's source and their prompts; what it leaves out is counted
    by reason in `dropped`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old modules
        tree = ast.parse(source)
    lines = source.split("\n")  # as ast counts lines (splitlines also breaks at form feeds)
    seen, out = 0, []
    for qualname, cls, node in candidates(tree):
        seen += 1
        doc = ast.get_docstring(node)
        if doc is None or len(doc) < MIN_DOC:
            dropped[f"no docstring of {MIN_DOC}+ characters"] += 1
            continue
        first = node.body[0]
        if first.lineno == node.lineno:
            dropped["docstring on the def line"] += 1
            continue
        if is_trivial(node.body[1:]):
            dropped["no body (pass, ..., NotImplementedError)"] += 1
            continue
        if node.end_lineno - first.end_lineno > MAX_BODY:
            dropped[f"body over {MAX_BODY} lines"] += 1
            continue
        fid = f"stdlib:{module}.{qualname}"
        kind = template_of(fid)
        prompt = make_prompt(kind, lines, node, doc, cls)
        if prompt is None:
            dropped["docstring is only a signature or doctest"] += 1
            continue
        if len(prompt) > MAX_CHARS:
            dropped[f"prompt over {MAX_CHARS} characters"] += 1
            continue
        out.append({"id": fid, "template": kind, "prompt": prompt})
    return seen, out


def build(stdlib: Path) -> tuple[list[dict], dict]:
    """The rows of the file, and what built them with the counts."""
    files = unparsed = seen = 0
    own_license = []
    dropped: Counter = Counter()
    found = []
    for path in stdlib_files(stdlib):
        files += 1
        module = module_name(stdlib, path)
        try:
            with tokenize.open(path) as f:  # honours a coding cookie
                source = f.read()
            if OWN_LICENSE.search(source):
                own_license.append(module)
                continue
            n, prompts = prompts_of(module, source, dropped)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            unparsed += 1
            continue
        seen += n
        found += prompts
    suite = suite_ngrams()
    rows, ids, texts = [], set(), set()
    kept: Counter = Counter()
    overlap: Counter = Counter()
    for item in found:
        if item["id"] in ids:  # a name defined twice in one module (e.g. per platform): the first
            dropped["name defined again in its module"] += 1
            continue
        ids.add(item["id"])
        if item["prompt"] in texts:
            dropped["duplicate prompt"] += 1
            continue
        texts.add(item["prompt"])
        if not ngrams(item["prompt"]).isdisjoint(suite):
            dropped["shares a word 8-gram with the evaluation suite"] += 1
            overlap[item["template"]] += 1
            continue
        kept[item["template"]] += 1
        rows.append({"id": item["id"], "messages": [{"role": "user", "content": item["prompt"]}]})
    info = {
        "source": "the CPython standard library's functions (scripts/build_code_prompts.py)",
        "license": LICENSE,
        "license_file": "LICENSE-code-prompts.txt",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "files": files,
        "files_not_parsed": unparsed,
        "modules_under_their_own_licence_left_out": own_license,
        "functions_seen": seen,
        "rows": len(rows),
        "kept_by_template": {name: kept[name] for name, _ in TEMPLATES},
        "dropped": dict(sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
        "dropped_by_overlap_by_template": {name: overlap[name] for name, _ in TEMPLATES},
    }
    return rows, info


def encode(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="rebuild and compare with the shipped file instead of writing it")
    args = ap.parse_args()
    if args.check:
        built_by = json.loads(CODE_PROMPTS_INFO.read_text())["python"]
        if built_by != platform.python_version():
            print(f"cannot check: {CODE_PROMPTS_FILE.name} was built with Python {built_by}, whose standard library "
                  f"this Python ({platform.python_version()}) does not have; run --check with Python {built_by}")
            sys.exit(2)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows, info = build(stdlib)
    own = info["modules_under_their_own_licence_left_out"]
    print(f"Python {info['python']} standard library at {stdlib}: {info['files']} files, "
          f"{info['files_not_parsed']} not parsed, {len(own)} left out for their own licence ({', '.join(own)}); "
          f"{info['functions_seen']} public functions and methods in the rest")
    print("kept: " + ", ".join(f"{k} {n}" for k, n in info["kept_by_template"].items()) + f" ({info['rows']} in all)")
    print("dropped:")
    for reason, n in info["dropped"].items():
        print(f"  {n:>5}  {reason}")
    print("  of those for an 8-gram: " + ", ".join(f"{k} {n}" for k, n in info["dropped_by_overlap_by_template"].items()))
    data = encode(rows)
    if args.check:
        with gzip.open(CODE_PROMPTS_FILE, "rb") as f:
            same = f.read() == data and json.loads(CODE_PROMPTS_INFO.read_text()) == info
        print(f"the shipped {CODE_PROMPTS_FILE.name} " + ("matches the standard library" if same else
                                                           "DIFFERS from what the standard library gives"))
        sys.exit(0 if same else 1)
    with gzip.GzipFile(CODE_PROMPTS_FILE, "wb", mtime=0, compresslevel=9) as f:
        f.write(data)
    CODE_PROMPTS_INFO.write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {len(rows)} prompts to {CODE_PROMPTS_FILE} ({CODE_PROMPTS_FILE.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
