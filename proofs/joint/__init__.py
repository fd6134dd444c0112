"""The KV and checkpoint models composed: restore safety and routed experts."""
