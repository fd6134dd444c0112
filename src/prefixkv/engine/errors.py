"""Typed errors of the reference engine."""

from __future__ import annotations

from prefixkv.errors import PrefixKVError

__all__ = ["BackendUnavailable", "EngineError", "EqualityMismatch"]


class EngineError(PrefixKVError):
    """Base class of every error the reference engine raises on purpose."""


class BackendUnavailable(EngineError, RuntimeError):
    """The requested compute backend cannot run here (no CUDA, no Triton interpreter)."""


class EqualityMismatch(EngineError, AssertionError):
    """Cache on and cache off disagree: different tokens, or logits beyond tolerance.

    Subclasses ``AssertionError`` so that a test using the check fails as an assertion.
    """
