"""``python -m prefixkv`` and the ``prefixkv`` console script."""

from __future__ import annotations

import sys

from prefixkv.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
