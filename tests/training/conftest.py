from tests.helpers import one_torch_thread  # noqa: F401  (autouse for this folder)
