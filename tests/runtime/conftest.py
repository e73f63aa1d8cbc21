import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matmuls: one thread is fastest, and 2 threads on a busy 2-core box are ~1000x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
