import os

# cuBLAS needs this before its first use to run deterministically (GPU gradient tests).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Under pytest-xdist every core runs a worker: one intra-op thread each, not one per core each.
# OMP_NUM_THREADS set also keeps Lightning from changing the count for a fit (its CPU DDP sets
# it from the process count otherwise): results that must be bitwise equal are computed alike.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def deterministic() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(0)
