"""Resident memory over a million distinct namespaces (one salt per user).

A server that isolates users with a per-user salt sees a new namespace for every user. This
prints the process's resident set size as the namespaces go by; it must stay flat once the
namespace digest memo is full (``NS_DIGEST_CACHE_SIZE`` entries). ::

    python -m tests.spec.namespace_memory                      # digests only, 10^6 salts
    python -m tests.spec.namespace_memory --manager spec --every 10
    python -m tests.spec.namespace_memory --manager impl --every 10

With ``--manager``, every ``--every``-th namespace is also matched against a small cache of
that kind (a hit on a prefix cached under the first user's salt would be a bug; the prompt is
cached under that one salt only).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefixkv.spec import Namespace, Request, SpecCache
from prefixkv.spec.identity import ns_digest


def rss_mib() -> float:
    """Resident set size now (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * 4096 / 2**20


def _memo_entries() -> int:
    info = getattr(ns_digest, "cache_info", None)
    if info is not None:
        return int(info().currsize)
    from prefixkv.spec import identity  # an unbounded memo, as it once was

    return len(getattr(identity, "_NS_DIGESTS", ()))


def run(count: int, manager: str | None, every: int) -> dict[str, Any]:
    cache: Any = None
    if manager == "spec":
        cache = SpecCache(64, 4)
    elif manager == "impl":
        from prefixkv.impl import PrefixCacheManager

        cache = PrefixCacheManager(64, 4)
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    if cache is not None:
        cache.admit(Request("warm", prompt, Namespace("llm@1", salt=b"user-0")))
        cache.commit("warm", len(prompt), (1,))
        cache.free(["warm"])
    samples: list[tuple[int, float]] = [(0, round(rss_mib(), 1))]
    step = max(1, count // 10)
    for i in range(1, count + 1):
        ns = Namespace("llm@1", salt=b"user-%d" % i)
        ns_digest(ns.key())
        if cache is not None and i % every == 0:
            assert cache.match(Request("probe", prompt, ns)).num_cached_tokens == 0
        if i % step == 0:
            samples.append((i, round(rss_mib(), 1)))
    return {
        "namespaces": count,
        "manager": manager,
        "rss_mib": samples,
        "growth_mib": round(samples[-1][1] - samples[0][1], 1),
        "growth_after_first_tenth_mib": round(samples[-1][1] - samples[1][1], 1),
        "memo_entries": _memo_entries(),
        # the impl's own per-manager memo of namespace keys (bounded the same way)
        "manager_memo_entries": len(cache._keys) if manager == "impl" else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--manager", choices=("spec", "impl"), default=None)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.count, args.manager, args.every)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
