"""The root of every error prefixkv raises on purpose, and the configuration error.

Each layer keeps its own root under :class:`PrefixKVError`: the cache's
:class:`~prefixkv.spec.PrefixCacheError`, the kernels' ``KernelError``, the engine's
``EngineError`` and the invariant checker's ``InvariantViolation``. ``except PrefixKVError``
catches them all; every concrete error also subclasses the builtin a caller would already
catch (``ValueError``, ``KeyError``, ``RuntimeError``, ...).

NOTE: this module imports nothing, so every layer (the torch-free spec included) can
depend on it without pulling in another layer.
"""

from __future__ import annotations

__all__ = ["InvalidConfig", "PrefixKVError", "require_int"]


class PrefixKVError(Exception):
    """Base class of every error prefixkv raises on purpose."""


class InvalidConfig(PrefixKVError, ValueError):
    """A constructor or configuration argument is malformed: a pool shape, a model or
    scheduler setting. Raised before anything is built, so nothing changes."""


def require_int(
    value: object,
    what: str,
    *,
    minimum: int = 0,
    error: type[ValueError] = InvalidConfig,
) -> int:
    """``value`` as an int ``>= minimum``, or ``error`` naming ``what``.

    ``bool`` is refused although it subclasses ``int``: ``True`` as a block count is a bug
    in the caller, not the number one.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise error(f"{what} must be an int >= {minimum}, got {value!r}")
    return value
