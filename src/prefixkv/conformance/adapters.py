"""The adapter contract: what the kit drives, and how a factory declares what it supports.

An *adapter* is any object with the :class:`~prefixkv.spec.PrefixCache` operations that
can render itself as a :class:`~prefixkv.spec.CacheState` (``snapshot()``), raising
prefixkv's errors (:mod:`prefixkv.spec.errors`) for bad input. An *adapter factory* builds
a fresh one for each run, and :func:`adapter` declares what it supports::

    @adapter(capabilities=Capabilities(multimodal=False, exact=False))
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> MyAdapter:
        return MyAdapter(MyBlockManager(num_blocks, block_size), record_events=record_events)

With the ``checkpoints`` capability (a hybrid model's cache) the factory also takes the
state-slot pool as keywords: ``max_num_seqs``, ``state_budget`` and
``decode_state_interval``; :func:`adapter` checks the signature when it declares it.

The kit takes any :class:`AdapterFactory` (what :func:`adapter` returns), or a plain
factory function, which then declares prefixkv's own capabilities (every feature, exact).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Generic, Protocol, TypeAlias, TypeVar, overload, runtime_checkable

from prefixkv.spec import HybridPrefixCache, Inspectable, PrefixCache

from .capabilities import Capabilities

__all__ = [
    "STATE_SLOT_KEYWORDS",
    "AdapterFactory",
    "BlockManagerAdapter",
    "DeclaredAdapter",
    "FactoryLike",
    "HybridAdapter",
    "MakeAdapter",
    "MakeHybridAdapter",
    "adapter",
    "as_factory",
]

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)

#: The keywords a ``checkpoints`` factory takes on top of the pool (the state-slot pool).
STATE_SLOT_KEYWORDS = ("max_num_seqs", "state_budget", "decode_state_interval")


@runtime_checkable
class BlockManagerAdapter(PrefixCache, Inspectable, Protocol):
    """The operations the machines drive, plus a neutral snapshot for the invariants."""


@runtime_checkable
class HybridAdapter(HybridPrefixCache, Inspectable, Protocol):
    """A ``checkpoints`` adapter: the hybrid operations, plus the snapshot."""


class MakeAdapter(Protocol[A_co]):
    """A factory function: ``make(num_blocks, block_size, *, record_events)``."""

    def __call__(self, num_blocks: int, block_size: int, *, record_events: bool) -> A_co: ...


class MakeHybridAdapter(Protocol[A_co]):
    """A ``checkpoints`` factory function: the pool, then the state-slot pool as keywords."""

    def __call__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        record_events: bool,
        max_num_seqs: int,
        state_budget: int,
        decode_state_interval: int,
    ) -> A_co: ...


@runtime_checkable
class AdapterFactory(Protocol[A_co]):
    """What the kit runs: a fresh adapter for each run's pool, and what it supports.

    ``state_slots`` are the :data:`STATE_SLOT_KEYWORDS`, given exactly when the
    capabilities declare ``checkpoints``.
    """

    @property
    def capabilities(self) -> Capabilities:
        """What the adapters it builds support, and the policy they follow."""
        ...

    def __call__(
        self, num_blocks: int, block_size: int, *, record_events: bool, **state_slots: int
    ) -> A_co: ...


#: What the kit's entry points take: a declared factory, or a plain function.
FactoryLike: TypeAlias = AdapterFactory[object] | MakeAdapter[object]


class DeclaredAdapter(Generic[A]):
    """A factory function with its capabilities: what :func:`adapter` returns.

    Calls through to the function (its name, module and docstring are the function's), so
    a test may still build an adapter by hand with ``make(8, 2, record_events=False)``.
    """

    def __init__(self, make: Callable[..., A], capabilities: Capabilities) -> None:
        """Args:
        make: the factory function (its signature is checked, see :func:`adapter`).
        capabilities: what the adapters it builds support.
        """
        _check_signature(make, capabilities)
        self._make = make
        self._capabilities = capabilities
        self.__name__: str = getattr(make, "__name__", type(make).__name__)
        self.__qualname__: str = getattr(make, "__qualname__", self.__name__)
        self.__module__ = getattr(make, "__module__", __name__)
        self.__doc__ = getattr(make, "__doc__", None)
        self.__wrapped__ = make

    @property
    def capabilities(self) -> Capabilities:
        """What the adapters it builds support (declared, read-only)."""
        return self._capabilities

    def with_capabilities(self, capabilities: Capabilities) -> DeclaredAdapter[A]:
        """The same factory function declaring ``capabilities`` instead.

        Args:
            capabilities: the new declaration.

        Returns:
            A new :class:`DeclaredAdapter`; this one is unchanged.
        """
        return DeclaredAdapter(self._make, capabilities)

    def __call__(
        self, num_blocks: int, block_size: int, *, record_events: bool, **state_slots: int
    ) -> A:
        """Build a fresh adapter on this pool.

        Args:
            num_blocks: the pool's blocks.
            block_size: tokens per block.
            record_events: whether the run records KV events.
            state_slots: the :data:`STATE_SLOT_KEYWORDS` (``checkpoints`` only).

        Returns:
            What the factory function returns.
        """
        return self._make(num_blocks, block_size, record_events=record_events, **state_slots)

    def __repr__(self) -> str:
        return f"<adapter {self.__qualname__} ({self._capabilities.describe()})>"


def _check_signature(make: Callable[..., object], caps: Capabilities) -> None:
    """A ``TypeError`` now, not mid-run, for a function the kit could not call."""
    if not callable(make):
        raise TypeError(f"an adapter factory must be callable, got {make!r}")
    try:
        sig = inspect.signature(make)
    except (TypeError, ValueError):  # a builtin or an extension: nothing to check
        return
    # NOTE: by keyword, as a replay calls it (``cache = make(num_blocks=4, block_size=1,
    # record_events=False)``): the pool's parameters must have these names.
    keywords: tuple[str, ...] = ("num_blocks", "block_size", "record_events")
    keywords += STATE_SLOT_KEYWORDS if caps.checkpoints else ()
    try:
        sig.bind(**dict.fromkeys(keywords, 0))
    except TypeError as exc:
        call = ", ".join(f"{k}=..." for k in keywords)
        raise TypeError(
            f"adapter factory {getattr(make, '__qualname__', make)!r} cannot be called as "
            f"make({call}): {exc}"
        ) from None


class _Declaration:
    """``@adapter(capabilities=...)``: applied to the factory function."""

    def __init__(self, capabilities: Capabilities) -> None:
        self.capabilities = capabilities

    @overload
    def __call__(self, make: MakeAdapter[A], /) -> DeclaredAdapter[A]: ...

    @overload
    def __call__(self, make: MakeHybridAdapter[A], /) -> DeclaredAdapter[A]: ...

    def __call__(self, make: Callable[..., A], /) -> DeclaredAdapter[A]:
        return DeclaredAdapter(make, self.capabilities)


@overload
def adapter(make: MakeAdapter[A], /) -> DeclaredAdapter[A]: ...


@overload
def adapter(*, capabilities: Capabilities | None = None) -> _Declaration: ...


def adapter(
    make: MakeAdapter[A] | None = None, /, *, capabilities: Capabilities | None = None
) -> DeclaredAdapter[A] | _Declaration:
    """Declare an adapter factory and what its adapters support.

    ``@adapter`` alone declares prefixkv's own capabilities (every feature, exact);
    ``@adapter(capabilities=Capabilities(...))`` declares others. A ``checkpoints``
    factory must take the state-slot keywords (:data:`STATE_SLOT_KEYWORDS`).

    Args:
        make: the factory function, when used as a bare ``@adapter``.
        capabilities: what the adapters support (default: prefixkv's own).

    Returns:
        A :class:`DeclaredAdapter` (an :class:`AdapterFactory`), or the decorator that
        makes one.

    Raises:
        TypeError: the function cannot be called the way the kit calls it.
    """
    caps = Capabilities() if capabilities is None else capabilities
    if make is not None:
        return DeclaredAdapter(make, caps)
    return _Declaration(caps)


def as_factory(factory: AdapterFactory[A] | MakeAdapter[A]) -> AdapterFactory[A]:
    """``factory`` as the kit runs it: a declared one as it is, a plain function with
    prefixkv's own capabilities.

    Args:
        factory: what a caller handed the kit.

    Returns:
        An :class:`AdapterFactory`.

    Raises:
        TypeError: ``factory`` is not callable, or is a plain function carrying a
            ``capabilities`` attribute (the declaration this kit no longer reads).
    """
    if isinstance(factory, DeclaredAdapter):
        return factory
    if not callable(factory):
        raise TypeError(f"an adapter factory must be callable, got {factory!r}")
    declared = getattr(factory, "capabilities", None)
    if inspect.isfunction(factory) or inspect.ismethod(factory):
        if declared is not None:
            raise TypeError(
                f"{factory.__qualname__} carries its capabilities as a function attribute; "
                "declare them with @prefixkv.conformance.adapter(capabilities=...) instead"
            )
    elif isinstance(declared, Capabilities) and isinstance(factory, AdapterFactory):
        return factory  # an object of its own that implements the protocol
    return DeclaredAdapter(factory, Capabilities())
