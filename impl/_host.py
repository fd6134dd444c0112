"""How much memory this process may allocate: the host's physical memory, or less where a
control group (a container's memory limit) caps it.

NOTE: the pool is allocated up front, so a pool larger than this is refused at construction
(see ``_allocate_pool`` in :mod:`prefixkv.impl.cache`). A container's limit matters as much as
the host's memory there: past it the kernel kills the process, it does not fail the
allocation.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cgroup_memory_limit", "host_memory"]

#: cgroup v1 writes "no limit" as a huge page-aligned number; anything from here up is none.
_V1_UNLIMITED = 1 << 60


def host_memory() -> int | None:
    """The bytes this process may allocate, or None where the platform does not say.

    Returns:
        The smaller of the host's physical memory and its control group's memory limit.
    """
    try:
        phys: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not POSIX
        phys = None
    limit = cgroup_memory_limit()
    if phys is None or limit is None:
        return phys if limit is None else limit
    return min(phys, limit)


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The tightest memory limit of this process's control group and its ancestors.

    Args:
        proc_cgroup: the process's ``cgroup`` file (its group per hierarchy).
        root: where the hierarchies are mounted.

    Returns:
        The limit in bytes, or None when no group sets one (or the files are not there).
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if hierarchy == "0" and not controllers:  # cgroup v2: one unified hierarchy
            limits += _limits(root, group, "memory.max")
        elif "memory" in controllers.split(","):  # cgroup v1: the memory controller's own
            limits += _limits(root / "memory", group, "memory.limit_in_bytes")
    return min(limits, default=None)


def _limits(mount: Path, group: str, name: str) -> list[int]:
    """The finite limits in ``name`` of ``group`` and of each group above it, up to the
    mount. A group outside this mount (a container sees its own group as the root) is
    read from the mount's root."""
    found = []
    here = mount / group.strip("/")
    dirs = [here, *here.parents] if here.is_dir() else [mount]
    for d in dirs:
        if d != mount and mount not in d.parents:
            break
        try:
            text = (d / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _V1_UNLIMITED:
            found.append(int(text))
    return found
