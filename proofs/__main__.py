"""``python -m prefixkv.proofs``: see :mod:`prefixkv.proofs.cli`."""

import sys

from .cli import main

sys.exit(main())
