"""prefixkv: a reference prefix cache for LLM serving engines, backed by a formal model.

The public surface in one import::

    from prefixkv import Namespace, PrefixCacheManager, Request

* the two cache managers (:class:`PrefixCacheManager`, :class:`HybridPrefixCacheManager`);
* what a request is made of (:class:`Request`, :class:`Namespace`, :class:`MultimodalSpan`);
* the errors, all under :class:`PrefixKVError`;
* the runtime invariant checker (:func:`checked`, :func:`check`) and the invariant ids
  (:class:`InvariantId`).

The layers stay importable on their own: ``prefixkv.spec`` (the executable model),
``prefixkv.impl`` (the managers), ``prefixkv.kernels`` (Triton), ``prefixkv.proofs``
(Z3), ``prefixkv.engine`` (the reference scheduler and engine) and
``prefixkv.conformance`` (the kit). Importing this package pulls in neither torch nor z3.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .errors import InvalidConfig, PrefixKVError
from .spec import (
    CacheBusy,
    CheckedCache,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    InvariantId,
    InvariantViolation,
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    OutOfStateSlots,
    PrefixCacheError,
    Request,
    UnknownSequence,
    WrongSlotRole,
    check,
    checked,
)

if TYPE_CHECKING:
    from .impl import HybridPrefixCacheManager, PrefixCacheManager

#: NOTE: the managers are exported lazily (PEP 562). ``prefixkv.impl`` imports
#: ``prefixkv.spec``, which runs this module first; an eager import of ``.impl`` here would
#: make every ``import prefixkv.spec`` load the managers too, and would break tools that
#: install their own ``prefixkv.impl`` before the package (the mutation harness does).
_LAZY = {"PrefixCacheManager": "prefixkv.impl", "HybridPrefixCacheManager": "prefixkv.impl"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prefixkv' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy managers among them (``dir(prefixkv)`` shows them)."""
    return sorted({*__all__, *_LAZY, "__version__"})


try:
    __version__ = version("prefixkv")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "CacheBusy",
    "CheckedCache",
    "DuplicateSequence",
    "HybridPrefixCacheManager",
    "InvalidConfig",
    "InvalidOperation",
    "InvalidRequest",
    "InvariantId",
    "InvariantViolation",
    "MultimodalSpan",
    "Namespace",
    "OutOfBlocks",
    "OutOfStateSlots",
    "PrefixCacheError",
    "PrefixCacheManager",
    "PrefixKVError",
    "Request",
    "UnknownSequence",
    "WrongSlotRole",
    "__version__",
    "check",
    "checked",
]
