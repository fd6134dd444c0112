"""Engine tests run on the CPU with the torch backend; the interpreter backend needs
``TRITON_INTERPRET=1`` before triton is imported, so it is set here when there is no GPU
(as the kernel tests do)."""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
