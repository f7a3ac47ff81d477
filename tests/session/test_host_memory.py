"""The default host cap: a share of what this process may use (cgroup honoured), divided among local ranks."""

import pytest

from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.config import DEFAULT_HOST_MEMORY_SHARE
from lightning_accudnn.session.host_memory import (
    cgroup_memory_limit,
    default_host_memory_limit,
    local_world_size,
)

GiB = 2**30


def _cgroup_files(tmp_path, proc_lines, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("".join(line + "\n" for line in proc_lines))
    root = tmp_path / "fs"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    root.mkdir(exist_ok=True)
    return proc, root


def test_cgroup_v2_limit_is_the_tightest_along_the_path(tmp_path):
    proc, root = _cgroup_files(
        tmp_path,
        ["0::/job/step"],
        {"job/memory.max": str(6 * GiB), "job/step/memory.max": "max", "memory.max": str(64 * GiB)},
    )
    assert cgroup_memory_limit(proc, root) == 6 * GiB


def test_cgroup_v2_without_a_limit_is_none(tmp_path):
    proc, root = _cgroup_files(tmp_path, ["0::/job"], {"job/memory.max": "max"})
    assert cgroup_memory_limit(proc, root) is None


def test_cgroup_v1_memory_controller_limit_is_read_and_its_no_limit_value_ignored(tmp_path):
    proc, root = _cgroup_files(
        tmp_path,
        ["5:devices:/", "4:memory:/docker/abc", "1:cpu:/"],
        {
            "memory/docker/abc/memory.limit_in_bytes": str(3 * GiB),
            "memory/memory.limit_in_bytes": str(2**63 - 4096),
        },
    )
    assert cgroup_memory_limit(proc, root) == 3 * GiB
    proc, root = _cgroup_files(
        tmp_path / "none", ["4:memory:/"], {"memory/memory.limit_in_bytes": str(2**63 - 4096)}
    )
    assert cgroup_memory_limit(proc, root) is None


def test_missing_cgroup_files_mean_no_limit(tmp_path):
    assert cgroup_memory_limit(tmp_path / "absent", tmp_path) is None


@pytest.mark.parametrize(
    ("ranks", "cgroup", "machine", "expected"),
    [
        (1, None, 64 * GiB, 32 * GiB),
        (8, None, 64 * GiB, 4 * GiB),  # eight ranks on the node share the half
        (1, 16 * GiB, 64 * GiB, 8 * GiB),  # the container's limit, not the machine's RAM
        (4, 16 * GiB, 64 * GiB, 2 * GiB),
        (2, 128 * GiB, 64 * GiB, 16 * GiB),  # a limit above the RAM changes nothing
    ],
)
def test_default_cap_is_a_share_of_usable_memory_divided_by_local_ranks(ranks, cgroup, machine, expected):
    assert (
        default_host_memory_limit(0.5, ranks_on_node=ranks, cgroup_limit=cgroup, machine_bytes=machine)
        == expected
    )


def test_local_world_size_comes_from_the_environment_and_bad_values_are_refused():
    assert local_world_size({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert local_world_size({}) == 1
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        local_world_size({"LOCAL_WORLD_SIZE": "0"})


def test_session_default_host_cap_divides_by_local_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = OffloadSession(OffloadConfig(budget="1GB"), "cpu").engine.pool.capacity_bytes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared = OffloadSession(OffloadConfig(budget="1GB"), "cpu").engine.pool.capacity_bytes
    assert alone == default_host_memory_limit(DEFAULT_HOST_MEMORY_SHARE, ranks_on_node=1)
    assert shared == alone // 4
    # A limit the user gives is theirs: not divided.
    given = OffloadSession(
        OffloadConfig(budget="1GB", host_memory_limit="1GB"), "cpu"
    ).engine.pool.capacity_bytes
    assert given == 10**9
