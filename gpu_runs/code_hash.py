"""A short hash of the Python code under a folder (default specheads/): each .py file's path
relative to the folder and its bytes, in path order. The device's git HEAD can be older than the
tree a call carried, so the pipelines record this beside the commit.

    python3 gpu_runs/code_hash.py [FOLDER]
    python3 gpu_runs/code_hash.py --commit COMMIT     # here: the same hash of a commit's specheads/
"""
from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path


def folder_hash(root: Path) -> str:
    h = hashlib.sha1()
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def commit_hash(commit: str, folder: str = "specheads", repo: str = ".") -> str:
    data = subprocess.run(["git", "-C", repo, "archive", commit, folder], check=True, capture_output=True).stdout
    h = hashlib.sha1()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")), key=lambda m: m.name)
        for m in files:
            rel = m.name[len(folder) + 1:]
            h.update(rel.encode() + b"\0" + tar.extractfile(m).read() + b"\0")
    return h.hexdigest()[:12]


if __name__ == "__main__":
    args = sys.argv[1:]
    print(commit_hash(args[1]) if args[:1] == ["--commit"] else folder_hash(Path(args[0] if args else "specheads")))
