"""The layout shows the architecture: an acyclic layer graph, no private imports across
layers, an architecture page that matches the code, and one façade with one error root."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _architecture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts/architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


arch = _architecture()


def test_layer_graph_is_acyclic() -> None:
    assert arch.cycles(arch.dependencies()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    # The check above must be able to fail.
    assert arch.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert arch.cycles({"a": {"b"}, "b": set()}) == []


def test_layers_depend_one_way() -> None:
    graph = arch.dependencies()
    # The model imports nothing but the error root; kernels know nothing of the cache.
    assert graph["prefixkv.spec"] <= {"prefixkv.errors"}
    assert graph["prefixkv.kernels"] <= {"prefixkv.errors"}
    assert graph["prefixkv.errors"] == set()
    # The managers know nothing of the engine that drives them (scheduler included).
    assert graph["prefixkv.impl"] <= {"prefixkv.spec", "prefixkv.errors"}
    assert graph["prefixkv.proofs"] <= {"prefixkv.spec", "prefixkv.kernels", "prefixkv.errors"}


def test_no_private_imports_across_layers() -> None:
    assert arch.private_imports() == []


def test_architecture_page_matches_the_code() -> None:
    text = arch.DOC.read_text(encoding="utf-8")
    assert arch.BEGIN in text and arch.END in text
    generated = arch.BEGIN + text.partition(arch.BEGIN)[2].partition(arch.END)[0] + arch.END
    assert generated + "\n" == arch.render(), (
        "docs/architecture.md is stale: run `python scripts/architecture.py --write`"
    )


def test_architecture_page_names_only_real_modules() -> None:
    text = arch.DOC.read_text(encoding="utf-8").partition(arch.BEGIN)[0]
    named = set(re.findall(r"`(prefixkv(?:\.\w+)+)`", text))
    known = set(arch.modules())
    assert named, "the hand-written part names no module"
    assert named <= known, f"unknown modules: {sorted(named - known)}"


def test_facade_exports_the_public_surface() -> None:
    import prefixkv

    for name in prefixkv.__all__:
        assert hasattr(prefixkv, name), name
    assert {"PrefixCacheManager", "HybridPrefixCacheManager", "Request", "Namespace"} <= set(
        prefixkv.__all__
    )
    assert isinstance(prefixkv.__version__, str) and prefixkv.__version__


def test_facade_dir_lists_the_public_surface_only() -> None:
    # dir() is what an editor completes and a reader explores: the public names, the lazy
    # managers among them, and none of the façade's own imports.
    import prefixkv

    listed = dir(prefixkv)
    assert listed == sorted(listed)
    assert set(prefixkv.__all__) <= set(listed)
    assert {"PrefixCacheManager", "__version__"} <= set(listed)
    assert not {"import_module", "TYPE_CHECKING", "version", "Any"} & set(listed)


def test_facade_imports_neither_torch_nor_z3() -> None:
    code = "import sys, prefixkv; print('torch' in sys.modules, 'z3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_model_loads_without_the_managers() -> None:
    # The façade exports the managers lazily: importing the spec must not load the impl
    # (a harness that installs its own prefixkv.impl first relies on it).
    code = (
        "import sys, prefixkv.spec; print('prefixkv.impl' in sys.modules); "
        "from prefixkv import PrefixCacheManager; print('prefixkv.impl' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_every_layer_error_is_a_prefixkv_error() -> None:
    from prefixkv.kernels.errors import KernelError
    from prefixkv.spec.invariants import InvariantViolation

    from prefixkv import InvalidConfig, PrefixCacheError, PrefixKVError
    from prefixkv.engine.errors import EngineError

    for root in (PrefixCacheError, KernelError, EngineError, InvariantViolation, InvalidConfig):
        assert issubclass(root, PrefixKVError), root
    assert issubclass(InvalidConfig, ValueError)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "2", None])
def test_configs_raise_invalid_config(value: object) -> None:
    from prefixkv import InvalidConfig
    from prefixkv.engine.config import EngineConfig
    from prefixkv.engine.policy import SchedulerConfig

    with pytest.raises(InvalidConfig):
        SchedulerConfig(max_num_batched_tokens=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig):
        EngineConfig(num_blocks=value)  # type: ignore[arg-type]
