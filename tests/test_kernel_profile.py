"""gpu_runs/kernel_profile.py's methods: the legacy name and METHOD@S,K,N[:drafter options]."""

import pytest

from tests.helpers import load_script


def test_method_specs():
    kp = load_script("gpu_runs/kernel_profile.py")
    assert kp.engine_spec("eagle3-tree") == ("eagle3", (6, 4, 15), {})
    assert kp.engine_spec("eagle3+ngram@6,4,31:ngram_gate=1") == ("eagle3+ngram", (6, 4, 31), {"ngram_gate": 1})
    assert kp.engine_spec("medusa") == ("medusa", (6, 4, 15), {})
    with pytest.raises(ValueError, match="expected name=value"):  # (evaluate's SuiteError)
        kp.engine_spec("eagle3@6,4,15:gate")
