"""gpu_runs/skip_cost.py: the kernel whose launches the script times returns at once where its flag is
set and counts otherwise, under Triton's interpreter as in its torch reference; the slope it reports."""

import pytest
import torch

from tests.helpers import load_script
from tests.kernels.interpret import interpret_triton, needs_triton


@needs_triton
@pytest.mark.parametrize("flag_value", [0, 1])
def test_the_kernel_skips_where_the_flag_is_set_as_its_reference(monkeypatch, flag_value):
    interpret_triton(monkeypatch)
    script = load_script("gpu_runs/skip_cost.py")
    flag = torch.tensor([flag_value], dtype=torch.int32)
    out, ref = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    for _ in range(3):
        script.skip_reference(flag, ref)
    reference = script.skip_reference
    monkeypatch.setattr(script, "skip_reference", lambda *a: pytest.fail("the kernel did not run"))
    for _ in range(3):
        script.skip(flag, out)
    assert out.item() == ref.item() == (0 if flag_value else 3)
    assert reference is not script.skip_reference


def test_the_slope_drops_the_graphs_own_launch():
    script = load_script("gpu_runs/skip_cost.py")
    # 5 us for the graph, 1.5 us a launch
    assert script.slope([0, 9, 27], [5.0, 18.5, 45.5]) == pytest.approx(1.5)
    assert script.slope([4, 4], [1.0, 2.0]) == 0.0


def test_it_refuses_a_machine_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    script = load_script("gpu_runs/skip_cost.py")
    with pytest.raises(SystemExit):
        script.main(["--out", "/tmp/skip_cost_test"])
    assert "needs a CUDA GPU" in capsys.readouterr().err
