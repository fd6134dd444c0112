"""The benchmark drivers: what the cache manager and the reference engine cost, measured.

Library code only: each driver returns its results as data, and :mod:`prefixkv.outputs`
writes them (the generated section of a docs page, a figure, a JSON file). The command
line that runs them lives in :mod:`prefixkv.commands` (``prefixkv bench``,
``prefixkv bench-engine``, ``prefixkv bench-kernels``).

* :mod:`.cache`: ``prefixkv bench``'s driver: the engine life cycle, memory per cached
  block and crafted collisions, timed by pyperf in fresh processes;
* :mod:`.lifecycle`: the engine life cycle it times, in three call shapes;
* :mod:`.memory`: host memory per cached block (a process of its own per probe);
* :mod:`.collisions`: lookups against prompts crafted to share one bucket of the index;
* :mod:`.worker`: the pyperf script that times one case per process;
* :mod:`.soak`: a long run of the hybrid manager, its resident set size sampled;
* :mod:`.engine`: prefill time against the cached fraction of the prompt;
* :mod:`.kernels`: the report of the kernel benchmark (:mod:`prefixkv.kernels.bench`).
"""
