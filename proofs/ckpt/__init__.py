"""INV-CKPT in Z3: the recurrent-state checkpoint lifecycle of ``HybridSpecCache``."""
