#!/usr/bin/env bash
# mypy --strict over the whole prefixkv package and the example managers; mypy over tests/.
#
# The source directories map onto subpackages through setuptools' package-dir, which mypy
# cannot see through an editable install. Stage a tree of symlinks with the installed
# layout and check that instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/prefixkv"
for entry in "$root"/src/prefixkv/*; do
    case "$(basename "$entry")" in __pycache__) continue ;; esac
    ln -s "$entry" "$stage/prefixkv/"
done
for sub in spec impl kernels proofs; do ln -s "$root/$sub" "$stage/prefixkv/$sub"; done
ln -s "$root/examples" "$stage/examples"  # a top-level package next to prefixkv
cd "$stage"
python -m mypy --config-file "$root/pyproject.toml" -p prefixkv -p examples  # strict = true in pyproject

# tests/: mypy's defaults (not strict), every directory, one at a time: the test directories are
# rootdir-relative (no __init__.py), so each has its own conftest.py and helper modules,
# and two directories checked together would collide on those module names.
export MYPYPATH="$stage"
python -m mypy --python-version 3.11 --ignore-missing-imports --follow-imports=silent \
    "$root"/tests/*.py
for dir in benchmarks commands conformance engine events impl kernels mutation proofs spec; do
    python -m mypy --python-version 3.11 --ignore-missing-imports --follow-imports=silent \
        "$root/tests/$dir"
done
