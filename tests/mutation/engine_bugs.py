# ruff: noqa: E501  (each patch is the exact source line it replaces)
"""Bugs injected into the reference scheduler and engine, to show the engine tests catch them.

Each bug is one exact source replacement; the old text must occur exactly once, so a bug
whose code moved fails loudly (``tests/engine/test_engine_bugs.py`` checks that in CI).

Run them all (sequentially, a few minutes; each patch is applied in place and always
restored)::

    python -m tests.mutation.engine_bugs            # or: ... engine_bugs 3 7  (by index)

A bug marked ``equivalent`` cannot change behaviour: it is listed to say why it is not
caught, not counted as a miss.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENGINE_BUGS", "EngineBug", "main"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class EngineBug:
    name: str
    path: str  # relative to the repository root
    old: str
    new: str
    equivalent: str = ""  # why the bug cannot change behaviour, if it cannot


ENGINE_BUGS: tuple[EngineBug, ...] = (
    EngineBug(
        "no rollback of rejected drafts",
        "impl/scheduler.py",
        "                if rejected:\n                    cache.rollback(g.request_id, rejected)\n",
        "",
    ),
    EngineBug(
        "drafts accepted without verification",
        "impl/policy.py",
        "    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:",
        "    while accepted < len(drafts):",
    ),
    EngineBug(
        "bonus token's unwritten KV committed",
        "impl/scheduler.py",
        "                cache.commit(g.request_id, len(new), new)\n                rejected = entry.num_tokens - len(new)",
        "                cache.commit(g.request_id, min(len(new) + 1, entry.num_tokens), new)\n                rejected = entry.num_tokens - min(len(new) + 1, entry.num_tokens)",
    ),
    EngineBug(
        "cache-off namespace shared",
        "impl/scheduler.py",
        "        if not self.cache_enabled:\n            ns = _off_namespace",
        "        if False:\n            ns = _off_namespace",
    ),
    EngineBug(
        "multimodal spans not passed to the cache",
        "impl/scheduler.py",
        "        return req.cache_request(ns, gen.tokens)",
        "        return req.cache_request(ns, gen.tokens, spans=False)",
    ),
    EngineBug(
        "re-admission forgets the output (prompt only)",
        "impl/scheduler.py",
        "        gen.num_prompt = gen.num_computed = 0\n        gen.preemptions += 1",
        "        gen.num_prompt = gen.num_computed = 0\n        del gen.tokens[len(gen.request.prompt):]\n        gen.preemptions += 1",
    ),
    EngineBug(
        "cached prefix recomputed into shared blocks",
        "impl/scheduler.py",
        "            g.num_computed = adm.num_cached_tokens\n",
        "            g.num_computed = 0\n",
    ),
    EngineBug(
        "chunk samples at every chunk",
        "impl/scheduler.py",
        "            sample=end == g.num_prompt,",
        "            sample=True,",
    ),
    EngineBug(
        "cancel_step does not roll back appends",
        "impl/scheduler.py",
        "            elif r.num_tokens:\n                self.cache.rollback(g.request_id, r.num_tokens)",
        "            elif False:\n                pass",
    ),
    EngineBug(
        "decode position off by one (RoPE)",
        "src/prefixkv/engine/batch.py",
        "        positions.extend(range(s.start, s.end))",
        "        positions.extend(range(s.start + (s.num_tokens == 1), s.end + (s.num_tokens == 1)))",
    ),
    EngineBug(
        "sampled row is the chunk's first, not last",
        "src/prefixkv/engine/batch.py",
        "        rows.extend(range(base + s.num_tokens - n, base + s.num_tokens))",
        "        rows.extend(range(base, base + n))",
    ),
    EngineBug(
        "multimodal override offset ignored",
        "src/prefixkv/engine/runner.py",
        "            rows = self.encoder.encode(o.item)[o.offset : o.offset + o.length]",
        "            rows = self.encoder.encode(o.item)[: o.length]",
        equivalent=(
            "a chunk never splits a span (choice 8) and a match never ends inside one (choice"
            " 5), so an item's positions always start in the step that covers its start: the "
            "offset is 0"
        ),
    ),
    EngineBug(
        "torch backend: causal mask lets a multi-token step see one key ahead",
        "src/prefixkv/engine/backend.py",
        "            visible = pos.unsqueeze(0) <= (torch.arange(new, device=q.device) + cached)[:, None]",
        "            visible = pos.unsqueeze(0) <= (torch.arange(new, device=q.device) + total - new + (new > 1))[:, None]",
    ),
    EngineBug(
        "preemption victim is the oldest",
        "impl/policy.py",
        "    for candidate in reversed(running):",
        "    for candidate in running:",
    ),
    EngineBug(
        "decode budget starves prefill (no reserve)",
        "impl/policy.py",
        "    reserve = min(min_prefill, prefill_demand)",
        "    reserve = 0",
    ),
    EngineBug(
        "kv write skipped for the last token of a step",
        "src/prefixkv/engine/backend.py",
        "        slots = meta.slot_mapping[: meta.num_tokens]\n",
        "        slots = meta.slot_mapping[: meta.num_tokens].clone()\n        slots[-1:] = slots[:1]\n",
    ),
    EngineBug(
        "hybrid: checkpoint saved with the state after the step's last token",
        "src/prefixkv/engine/engine.py",
        "                    pool.write(slot, position, out.states[row][position])",
        "                    pool.write(slot, position, out.states[row][plan.seqs[row].end])",
    ),
    EngineBug(
        "hybrid: restore copies the runtime slot onto itself (wrong source slot)",
        "src/prefixkv/engine/engine.py",
        "                pool.copy(source, slot)",
        "                pool.copy(slot, slot)",
    ),
    EngineBug(
        "hybrid: runtime state kept after rejected drafts",
        "src/prefixkv/engine/engine.py",
        "                    pool.write(slot, g.num_computed, out.states[row][g.num_computed])",
        "                    pool.write(slot, g.num_computed, out.states[row][s.end])",
    ),
    EngineBug(
        "hybrid: restore never reported to the cache",
        "src/prefixkv/engine/engine.py",
        "                hybrid.restore_issued(s.seq_id)\n",
        "",
    ),
)


def apply(bug: EngineBug) -> str:
    """Insert ``bug``; returns the original text of its file (to restore)."""
    path = ROOT / bug.path
    text = path.read_text(encoding="utf-8")
    count = text.count(bug.old)
    if count != 1:
        raise ValueError(f"{bug.name}: the patched text occurs {count} times in {bug.path}")
    path.write_text(text.replace(bug.old, bug.new), encoding="utf-8")
    return text


def main(argv: list[str]) -> int:
    chosen = [ENGINE_BUGS[int(i)] for i in argv] if argv else list(ENGINE_BUGS)
    caught = missed = 0
    for bug in chosen:
        original = apply(bug)
        try:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-n",
                    "2",
                    "-p",
                    "no:cacheprovider",
                    "tests/engine",
                    # NOTE: that file checks each patch's text is present, which an applied
                    # patch removes: with it every bug would count as caught.
                    "--ignore=tests/engine/test_engine_bugs.py",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
                env={**__import__("os").environ, "CI": "true"},
            )
        finally:
            (ROOT / bug.path).write_text(original, encoding="utf-8")
        red = proc.returncode != 0
        caught += red
        missed += not red and not bug.equivalent
        verdict = "caught" if red else ("equivalent" if bug.equivalent else "MISSED")
        tail = proc.stdout.strip().splitlines()[-1:] or [""]
        print(f"{verdict:10s} {bug.name} ({time.perf_counter() - t0:.0f} s): {tail[0]}", flush=True)
    print(f"{caught} caught, {missed} missed, of {len(chosen)}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
