"""The memory a pool may take: the host's, or a control group's limit where it is less."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefixkv.impl import PrefixCacheManager, _host
from prefixkv.impl._host import cgroup_memory_limit, host_memory

from prefixkv.errors import InvalidConfig

GiB = 1 << 30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, text: str) -> Path:
    proc = tmp_path / "proc_cgroup"
    proc.write_text(text)
    return proc


def test_v2_the_tightest_limit_of_the_group_and_its_parents(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "a" / "memory.max", f"{4 * GiB}\n")
    _write(root / "a" / "b" / "memory.max", "max\n")
    proc = _proc(tmp_path, "0::/a/b\n")
    assert cgroup_memory_limit(proc, root) == 4 * GiB
    _write(root / "a" / "b" / "memory.max", f"{GiB}\n")
    assert cgroup_memory_limit(proc, root) == GiB


def test_v2_without_a_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "a" / "memory.max", "max\n")
    assert cgroup_memory_limit(_proc(tmp_path, "0::/a\n"), root) is None


def test_v1_memory_controller_and_its_unlimited_value(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(root / "memory" / "job" / "memory.limit_in_bytes", f"{2 * GiB}\n")
    text = "5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n"
    assert cgroup_memory_limit(_proc(tmp_path, text), root) == 2 * GiB
    _write(root / "memory" / "job" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_memory_limit(_proc(tmp_path, text), root) is None


def test_a_container_reads_its_own_group_at_the_mount_root(tmp_path: Path) -> None:
    """Inside a container the group path names the host's hierarchy, which is not mounted."""
    root = tmp_path / "cg"
    _write(root / "memory.max", f"{3 * GiB}\n")
    assert cgroup_memory_limit(_proc(tmp_path, "0::/docker/abc\n"), root) == 3 * GiB


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path / "absent", tmp_path) is None
    assert cgroup_memory_limit(_proc(tmp_path, "garbage\n"), tmp_path / "cg") is None


def test_host_memory_is_the_smaller_of_host_and_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_host, "cgroup_memory_limit", lambda: None)
    physical = host_memory()
    assert physical is not None and physical > 0
    monkeypatch.setattr(_host, "cgroup_memory_limit", lambda: 1 << 20)
    assert host_memory() == 1 << 20
    monkeypatch.setattr(_host, "cgroup_memory_limit", lambda: physical * 2)
    assert host_memory() == physical


def test_a_pool_past_the_groups_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_host, "cgroup_memory_limit", lambda: 1 << 20)
    with pytest.raises(InvalidConfig, match="more than this host"):
        PrefixCacheManager(1 << 16, 16)
    PrefixCacheManager(64, 16)  # 64 blocks fit in 1 MiB
