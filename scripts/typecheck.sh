#!/usr/bin/env bash
# mypy --strict on prefixkv.spec, prefixkv.impl and prefixkv.conformance, then on prefixkv.engine (the Triton
# kernels it imports are untyped, so errors in them are not reported here).
#
# The source directories map onto subpackages through setuptools' package-dir, which mypy
# cannot see through an editable install. Stage a tree of symlinks with the installed
# layout and check that instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/prefixkv"
cp "$root/src/prefixkv/__init__.py" "$root/src/prefixkv/py.typed" "$stage/prefixkv/"
for sub in spec impl kernels; do ln -s "$root/$sub" "$stage/prefixkv/$sub"; done
ln -s "$root/src/prefixkv/engine" "$stage/prefixkv/engine"
ln -s "$root/src/prefixkv/conformance" "$stage/prefixkv/conformance"
cd "$stage"
python -m mypy --config-file "$root/pyproject.toml" --strict -p prefixkv.spec -p prefixkv.impl \
    -p prefixkv.conformance
python -m mypy --config-file "$root/pyproject.toml" --strict --follow-imports=silent \
    -p prefixkv.engine
