"""Typed errors of the kernel layer.

Each error subclasses the builtin a caller would naturally catch (``ValueError``,
``IndexError``, ``TypeError``), so code that does not know this package still handles it,
and code that does can tell the cases apart.
"""

from __future__ import annotations

from prefixkv.errors import PrefixKVError


class KernelError(PrefixKVError):
    """Base of every error raised by ``prefixkv.kernels``."""


class KernelInputError(KernelError, ValueError):
    """An argument has the wrong shape, layout, stride pattern or device."""


class KernelDtypeError(KernelError, TypeError):
    """A tensor has a dtype the kernel does not take."""


class PageSizeError(KernelError, ValueError):
    """A block table's page size does not match the cache or the requested conversion."""


class BlockTableAlreadyConvertedError(PageSizeError):
    """A block table already in kernel pages was converted again.

    Converting twice would multiply every block id by the page ratio a second time and
    address the wrong memory, so it is refused rather than silently done.
    """


class KernelIndexError(KernelError, IndexError, ValueError):
    """Debug mode found an index outside the pool, a table or a buffer before launch."""
