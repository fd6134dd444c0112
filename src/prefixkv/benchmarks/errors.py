"""The error a benchmark run raises when its figures could not be trusted or measured."""

from __future__ import annotations

from prefixkv.errors import PrefixKVError

__all__ = ["BenchmarkFailed"]


class BenchmarkFailed(PrefixKVError, RuntimeError):
    """A benchmark could not produce figures worth reporting: a worker process failed, or
    two call shapes (or the spec and the impl) did different things on the same trace, so
    comparing their times would compare different work."""
