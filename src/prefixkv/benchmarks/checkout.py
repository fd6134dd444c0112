"""Another source checkout of prefixkv, importable in a subprocess beside this one.

``prefixkv bench --baseline PATH`` times the same cases with the code of another checkout
(say, the main branch) in the same run, interleaved with this checkout's, so that the ratios
compare figures taken under the same drift in machine load.

A checkout is not importable as it stands: its packages live where its ``pyproject.toml``'s
``package-dir`` puts them (``prefixkv`` in ``src/prefixkv``, ``prefixkv.spec`` in ``spec``,
and so on). :func:`import_root` builds a directory holding one ``prefixkv`` package made of
symbolic links to the checkout's files, laid out as the install would; a subprocess with
that directory first on ``PYTHONPATH`` imports the other checkout's code, and
:func:`check_root` asks one such subprocess where its modules come from, so that a run never
times this checkout twice by mistake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from .errors import BenchmarkFailed

__all__ = ["baseline_env", "check_root", "import_root"]


def _package_dirs(checkout: Path) -> dict[str, Path]:
    """``package-dir`` of the checkout's ``pyproject.toml``: package name -> directory."""
    pyproject = checkout / "pyproject.toml"
    try:
        config = tomllib.loads(pyproject.read_text())
        mapping = config["tool"]["setuptools"]["package-dir"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise BenchmarkFailed(
            f"{checkout} is not a prefixkv checkout ({pyproject} has no "
            f"[tool.setuptools] package-dir: {exc}): give the root of a source checkout"
        ) from None
    dirs = {str(name): checkout / str(where) for name, where in mapping.items()}
    if "prefixkv" not in dirs or not (dirs["prefixkv"] / "__init__.py").is_file():
        raise BenchmarkFailed(f"{checkout} has no prefixkv package where its pyproject says")
    return dirs


def import_root(checkout: Path, into: Path) -> Path:
    """Build, under ``into`` (an empty directory), a tree whose ``prefixkv`` package is
    ``checkout``'s code; returns the directory to put first on ``PYTHONPATH``.

    Args:
        checkout: the root of another prefixkv source checkout.
        into: an empty directory this call may fill (the caller removes it).

    Returns:
        The directory that holds the ``prefixkv`` package.
    """
    dirs = _package_dirs(checkout.resolve())
    root = into / "prefixkv"
    root.mkdir(parents=True)
    sub = {name.removeprefix("prefixkv."): path for name, path in dirs.items() if "." in name}
    for entry in sorted(dirs["prefixkv"].iterdir()):
        if entry.name not in sub and entry.name != "__pycache__":
            (root / entry.name).symlink_to(entry)
    for name, path in sorted(sub.items()):
        if "." in name:
            raise BenchmarkFailed(f"nested package-dir {name!r} is not supported")
        (root / name).symlink_to(path, target_is_directory=True)
    return into


def baseline_env(root: Path, *also: Path) -> dict[str, str]:
    """The environment of a process that imports the checkout under ``root`` (then from
    ``also``, say the checkout's root for its ``examples``, before this process's path)."""
    first = [str(root), *map(str, also)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*first, *_pythonpath()])}


def _pythonpath() -> list[str]:
    current = os.environ.get("PYTHONPATH", "")
    return [p for p in current.split(os.pathsep) if p]


def check_root(root: Path, checkout: Path) -> tuple[str, ...]:
    """Import ``prefixkv.impl`` in a subprocess under ``root``: refuse the run unless its
    modules are ``checkout``'s; returns the call shapes its manager offers.

    Args:
        root: what :func:`import_root` returned.
        checkout: the checkout it was built from.

    Returns:
        The baseline's call shapes (:func:`~prefixkv.benchmarks.lifecycle.variants_of`).
    """
    probe = (
        "import json, os, prefixkv, prefixkv.impl\n"
        "from prefixkv.benchmarks.lifecycle import make_cache, variants_of\n"
        "print(json.dumps([prefixkv.impl.__file__, os.path.realpath(prefixkv.__file__),"
        " os.path.realpath(prefixkv.impl.__file__),"
        " list(variants_of(make_cache('impl', 16, 16)))]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        env=baseline_env(root),
        cwd=root,
    )
    if done.returncode != 0:
        raise BenchmarkFailed(f"the baseline does not import: {done.stderr.strip()[-300:]}")
    found, top, impl, variants = json.loads(done.stdout.strip().splitlines()[-1])
    if not os.path.abspath(found).startswith(str(root.absolute()) + os.sep):
        # Imported some installed prefixkv, not the tree (PYTHONPATH did not take).
        raise BenchmarkFailed(f"the baseline imported {found}, not the tree under {root}")
    base = str(checkout.resolve())
    if not (top.startswith(base + os.sep) and impl.startswith(base + os.sep)):
        raise BenchmarkFailed(f"the baseline imported {top} and {impl}, not {base}'s code")
    return tuple(variants)
