import os

# cuBLAS needs this before its first use to run deterministically (GPU gradient tests).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Under pytest-xdist every core runs a worker: one intra-op thread each, not one per core each.
# OMP_NUM_THREADS set also keeps Lightning from changing the count for a fit (its CPU DDP sets
# it from the process count otherwise): results that must be bitwise equal are computed alike.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import gc  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI must not go red on a new random draw);
# HYPOTHESIS_PROFILE=explore draws new ones, to look for counterexamples on purpose.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

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


@pytest.fixture(autouse=True)
def collector_stays_on():
    """A test that leaves Python's garbage collector off (a training pass never closed) fails,
    and the next test starts with it on."""
    yield
    if not gc.isenabled():
        gc.enable()
        pytest.fail("the test left Python's garbage collector off: a session's pass was never closed")
