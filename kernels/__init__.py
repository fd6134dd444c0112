"""prefixkv.kernels: Triton kernels over the paged KV cache, their torch references, and
the batch metadata they read.

The names below are loaded lazily (PEP 562), so ``import prefixkv.kernels.index_math``
(what the Z3 proofs use) does not import torch or triton.

Data movement (exact):  write_kv, gather_kv, copy_blocks, copy_state_slots,
                        save_state_checkpoints, restore_state_checkpoints, update_conv_state
Attention:              prefill_attention, decode_attention
Metadata:               BlockTable, BatchMetadata, build_batch_metadata, compute_slot_mapping,
                        cu_seqlens, to_kernel_pages, to_flashinfer_csr, FlashInferCsr,
                        plan_state_copy, StateCopyPlan
Errors:                 KernelError and subclasses (see ``prefixkv.kernels.errors``)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "write_kv": "cache_ops",
    "gather_kv": "cache_ops",
    "copy_blocks": "cache_ops",
    "copy_state_slots": "state_ops",
    "save_state_checkpoints": "state_ops",
    "restore_state_checkpoints": "state_ops",
    "update_conv_state": "state_ops",
    "plan_state_copy": "state_ops",
    "StateCopyPlan": "state_ops",
    "prefill_attention": "attention",
    "decode_attention": "attention",
    "BlockTable": "metadata",
    "BatchMetadata": "metadata",
    "FlashInferCsr": "metadata",
    "build_batch_metadata": "metadata",
    "compute_slot_mapping": "metadata",
    "cu_seqlens": "metadata",
    "to_kernel_pages": "metadata",
    "to_flashinfer_csr": "metadata",
    "KernelError": "errors",
    "KernelInputError": "errors",
    "KernelDtypeError": "errors",
    "KernelIndexError": "errors",
    "PageSizeError": "errors",
    "BlockTableAlreadyConvertedError": "errors",
}

__all__ = [
    "BatchMetadata",
    "BlockTable",
    "BlockTableAlreadyConvertedError",
    "FlashInferCsr",
    "KernelDtypeError",
    "KernelError",
    "KernelIndexError",
    "KernelInputError",
    "PageSizeError",
    "StateCopyPlan",
    "build_batch_metadata",
    "compute_slot_mapping",
    "copy_blocks",
    "copy_state_slots",
    "cu_seqlens",
    "decode_attention",
    "gather_kv",
    "plan_state_copy",
    "prefill_attention",
    "restore_state_checkpoints",
    "save_state_checkpoints",
    "to_flashinfer_csr",
    "to_kernel_pages",
    "update_conv_state",
    "write_kv",
]

if TYPE_CHECKING:
    from .attention import decode_attention, prefill_attention
    from .cache_ops import copy_blocks, gather_kv, write_kv
    from .errors import (
        BlockTableAlreadyConvertedError,
        KernelDtypeError,
        KernelError,
        KernelIndexError,
        KernelInputError,
        PageSizeError,
    )
    from .metadata import (
        BatchMetadata,
        BlockTable,
        FlashInferCsr,
        build_batch_metadata,
        compute_slot_mapping,
        cu_seqlens,
        to_flashinfer_csr,
        to_kernel_pages,
    )
    from .state_ops import (
        StateCopyPlan,
        copy_state_slots,
        plan_state_copy,
        restore_state_checkpoints,
        save_state_checkpoints,
        update_conv_state,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
