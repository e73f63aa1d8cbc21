"""gpu_runs/older.py loads an older version of a module beside the current one: from source with
its kernels renamed (Triton reads the source from a file), and from a commit with `git show`."""

import inspect
import subprocess

import pytest

from tests.helpers import REPO, load_script


def test_a_module_from_source_is_file_backed_renamed_and_registered():
    older = load_script("gpu_runs/older.py")
    mod = older.module_from_source("def _k_kernel():\n    return 7\n", "older_probe", (("_k_kernel", "_k_kernel_old"),))
    assert mod._k_kernel_old() == 7 and not hasattr(mod, "_k_kernel")
    assert "return 7" in inspect.getsource(mod._k_kernel_old)  # (its source read back from the file)
    import sys
    assert sys.modules["older_probe"] is mod


def test_a_module_at_the_current_commit_equals_the_file():
    try:
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    older = load_script("gpu_runs/older.py")
    mod = older.module_at("HEAD", "specheads/kernels/ngram.py", "ngram_at_head")  # (git run in the repository)
    assert hasattr(mod, "ngram_lookup_reference") and mod.KERNEL_MAX_NGRAM >= 4
