"""An older version of one of specheads' modules, loaded beside the current one for the side-by-side
scripts (policy_old_new.py, ngram_old_new.py, kernel_bench.py --prev)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path


def module_from_source(source: str, name: str, renames: tuple = ()):
    """A module of this source under `name`, each (old, new) of `renames` replaced first: Triton
    kernels renamed so that the jit cache (fused._kernel, keyed by name) keeps them apart from the
    current ones. Written to a file (Triton reads a kernel's source from its file) and registered
    in sys.modules (dataclasses look their module up)."""
    for old, new in renames:
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def module_at(commit: str, relative: str, name: str, renames: tuple = ()):
    """The file `relative` (e.g. specheads/runtime/policy.py) as of `commit`, loaded as `module_from_source`."""
    source = subprocess.run(["git", "show", f"{commit}:{relative}"], check=True, capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout
    return module_from_source(source, name, renames)
