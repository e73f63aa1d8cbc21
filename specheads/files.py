"""Small file helpers shared by the loaders and the trainer."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The file's sha256 hex digest, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def read_text(path) -> str:
    """A text file's contents; gzip-compressed where its name ends in .gz."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


@contextlib.contextmanager
def open_aside(path):
    """A text file to write (gzip-compressed where its name ends in .gz), written aside and moved
    into place once the block ends without an error: a reader never sees half a file, and a
    write cut short leaves the old one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with (gzip.open(tmp, "wt", encoding="utf-8") if path.suffix == ".gz" else open(tmp, "w", encoding="utf-8")) as f:
        yield f
    os.replace(tmp, path)


def write_text(path, text: str) -> None:
    """Write a text file whole (`open_aside`)."""
    with open_aside(path) as f:
        f.write(text)
