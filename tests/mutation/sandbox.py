"""Run a mutant on a temporary copy of the sources, so the checkout is never written.

Both bug harnesses (:mod:`tests.mutation.run` for the cache, :mod:`tests.mutation.engine_bugs`
for the engine) patch a copy and run the checks in a child process. Whatever happens to the
harness (a crash, a timeout, Ctrl-C, SIGKILL), the files under the checkout keep their bytes:
the worst a kill can leave behind is a directory under the system's temporary directory.

- :func:`stage_sources` copies the package's source directories, the tests and
  ``pyproject.toml`` into a directory and lays out the installed package there (symlinks
  named after ``[tool.setuptools] package-dir``), so ``PYTHONPATH=<copy>/src`` resolves
  ``prefixkv`` and every subpackage from the copy, ahead of the editable install (whose
  finder runs after the path finder).
- :func:`run_isolated` runs a child in its own process group, kills the whole group on a
  timeout or on any exception (``KeyboardInterrupt`` included), and asks the kernel to kill
  the child if the harness itself dies (``PR_SET_PDEATHSIG``, Linux only).
- :func:`checkout_digest` is what the tests compare before and after killing a harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "IGNORED",
    "Finished",
    "checkout_digest",
    "module_of",
    "package_dirs",
    "process_gone",
    "run_isolated",
    "stage_sources",
    "terminate_on_sigterm",
]

ROOT = Path(__file__).resolve().parents[2]

#: Names never copied nor digested: build outputs and caches (what ``.gitignore`` lists).
IGNORED = (
    ".git",
    ".venv",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".benchmarks",
    "_build",
)


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """``[tool.setuptools] package-dir`` of ``root``'s pyproject: package -> directory."""
    with (root / "pyproject.toml").open("rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {str(k): str(v) for k, v in table.items()}


def module_of(path: str, root: Path = ROOT) -> str:
    """The dotted module name of a source file given relative to the repository root."""
    rel = Path(path).with_suffix("")
    # NOTE: the longest directory wins: "src/prefixkv" maps the root package, and a
    # subpackage's own entry ("impl" -> prefixkv.impl) is more specific than any parent.
    best: tuple[int, str, Path] | None = None
    for package, directory in package_dirs(root).items():
        d = Path(directory)
        if rel.is_relative_to(d) and (best is None or len(d.parts) > best[0]):
            best = (len(d.parts), package, rel.relative_to(d))
    if best is None:
        raise ValueError(f"{path} is not under any package directory of {root / 'pyproject.toml'}")
    _, package, inner = best
    parts = [package, *inner.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_sources(destination: Path, root: Path = ROOT) -> Path:
    """Copy the sources of ``root`` into ``destination``; returns the ``PYTHONPATH`` entry.

    The copy keeps the repository's layout (so a patch names the same relative path in the
    copy as in the checkout), plus symlinks that give the root package its subpackages.
    """
    dirs = package_dirs(root)
    roots = [p for p in dirs if "." not in p]
    if len(roots) != 1:
        raise ValueError(f"expected one top-level package in package-dir, got {roots}")
    (top,) = roots
    ignore = shutil.ignore_patterns(*IGNORED)
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "pyproject.toml", destination / "pyproject.toml")
    for directory in sorted({*dirs.values(), "tests"}):
        shutil.copytree(root / directory, destination / directory, ignore=ignore)
    package = destination / dirs[top]
    for name, directory in dirs.items():
        if name == top:
            continue
        if not name.startswith(top + ".") or "." in name[len(top) + 1 :]:
            raise ValueError(f"package-dir entry {name!r} is not a direct subpackage of {top}")
        link = package / name[len(top) + 1 :]
        if link.exists():
            raise ValueError(f"{link} exists in the source tree and in package-dir")
        link.symlink_to(os.path.relpath(destination / directory, package), target_is_directory=True)
    return package.parent


@dataclass(frozen=True)
class Finished:
    """A child that ran to its end (or was killed for its time limit)."""

    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


# NOTE: looked up here, in the parent: the child of a threaded harness must not load libraries
# between fork and exec, only call what is already loaded.
_PRCTL = _load_prctl()
_PPID = os.getpid()


def _die_with_parent() -> None:
    """In the child, before exec: ask for SIGKILL when the parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # the parent may already be gone: then nobody would ever deliver the signal
        if os.getppid() != _PPID:
            os._exit(1)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_isolated(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None,
    on_start: Callable[[int], None] | None = None,
) -> Finished:
    """Run ``cmd`` to its end; the child and all its descendants die with this call.

    ``on_start`` (a callable taking the child's pid) is called once the child runs: the
    harnesses print it, so a test can interrupt them while a mutant is being checked.
    """
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: xdist workers die with it
        preexec_fn=_die_with_parent,
    )
    try:
        if on_start is not None:
            on_start(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return Finished(None, out, err)
        # the group may still hold descendants that outlived their parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return Finished(proc.returncode, out, err)
    except BaseException:
        _kill_group(proc)
        raise


def terminate_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` so ``finally`` blocks (and temp-dir cleanup) run."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not any(Path(d).match(p) for p in IGNORED))
        for name in sorted(filenames):
            if not any(Path(name).match(p) for p in IGNORED) and not name.endswith(".log"):
                yield Path(dirpath) / name


def checkout_digest(root: Path = ROOT) -> dict[str, str]:
    """sha256 of every source file a harness copies from ``root``, by relative path.

    That is every file a patch could name: the package directories, the tests and
    ``pyproject.toml`` (caches and build outputs excluded). Other directories are left out,
    so that another test writing, say, a report under ``docs/`` cannot make this differ.
    """
    tops = sorted({*package_dirs(root).values(), "tests"})
    files = [root / "pyproject.toml", *(f for top in tops for f in _walk(root / top))]
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in files
        if path.is_file()
    }


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (Linux ``/proc``), polling up to a minute for it.

    A zombie that nobody reaps counts as gone: it runs nothing.
    """
    for _ in range(600):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False
