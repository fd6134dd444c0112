"""The KV block cache in Z3: the pool, the free queue, the index and the sequences."""
