"""Realistic prefix-cache bugs, as exact source patches against ``impl/``.

Each bug is a list of ``(file under impl/, old text, new text)`` replacements. The old text
must occur exactly once in the current source: when the impl changes under a patch, the
harness fails loudly ("patch does not apply") instead of silently testing nothing, and the
patch must be updated to re-insert the same bug class into the new code.

The one-line descriptions name the real-world bug class each patch re-creates.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUGS", "Bug", "Patch"]

#: ``(file relative to impl/, old text, new text)``
Patch = tuple[str, str, str]


@dataclass(frozen=True)
class Bug:
    name: str
    description: str
    patches: tuple[Patch, ...]
    #: Which machines hunt it: ``"text"`` (the differential stages), ``"steps"`` (the same
    #: with the fused and batched call rules; for bugs in ``advance`` and ``advance_batch``)
    #: or ``"hybrid"`` (the hybrid-model stages; for the checkpoint and routed-expert code).
    machine: str = "text"


#: The start of the exact checks of the candidates in ``impl/_walk.py``'s ``verified``.
_VERIFY_START = "        # The first failing candidate of any part ends the match.\n"
#: The parent check there.
_VERIFY_PARENT = """        if parents[0] != NO_PARENT:
            return 0
        if parents[1:] != found[: m - 1]:
            m = 1 + _first_difference(parents[1:], found)
"""
#: The extra-keys check there (a text prompt's blocks carry none).
_VERIFY_EXTRA = """        extra = pool.extra
        if extra and not extra.keys().isdisjoint(found[:m]):
            m = next(compress(count(), map(extra.__contains__, found)))
"""
#: The exact check of a single-entry bucket on the block-by-block path (``_verified_slow``).
_VERIFY_ONE = """                if not pool.has_identity(b, mine, parent, ns, ()):
                    return j"""

#: Where a commit publishes the blocks it completed (``impl/cache.py``'s ``_apply_commit``).
_PUBLISH_ON_COMMIT = """        if new_computed // bs > computed // bs:
            self._counters.blocks_published += self._publisher.publish(
                seq,
                computed // bs,
                new_computed // bs,
"""

BUGS: tuple[Bug, ...] = (
    Bug(
        "batch_free_dedup",
        "batched free releases each block once: a block held by two freed sequences is "
        "decremented once (INV-REF)",
        (
            (
                "cache.py",
                """        for seq_id in ids:
            self._release(seqs.pop(seq_id).blocks)""",
                """        batch: list[int] = []
        for seq_id in ids:
            batch.extend(b for b in seqs.pop(seq_id).blocks if b not in batch)
        self._release(batch)""",
            ),
        ),
    ),
    Bug(
        "stale_index_on_evict",
        "eviction recycles a block but leaves its index entry behind (stale hit on reuse)",
        (
            ("cache.py", "            self._index.remove(pool.key[b], b)\n", "            pass\n"),
            (
                "cache.py",
                "            self._index.remove_all("
                "list(map(getitem, repeat(pool.key), victims)), victims)\n",
                "            pass\n",
            ),
        ),
    ),
    Bug(
        "collision_bucket_remove_last",
        "removing from a collision bucket drops the newest entry instead of the evicted one",
        (
            (
                "_index.py",
                """        entry.remove(b)
        if len(entry) == 1:""",
                """        entry.pop()
        if len(entry) == 1:""",
            ),
        ),
    ),
    Bug(
        "evict_non_leaf",
        "leaf check dropped: a cached parent is evicted while its children stay published",
        (
            (
                "_pool.py",
                """            if not children[b]:
                self._leaves.push(self, b)""",
                """            self._leaves.push(self, b)""",
            ),
            (
                "_leaves.py",
                "            if version[b] != v or ref[b] or children[b] or not depth[b]:",
                "            if version[b] != v or ref[b] or not depth[b]:",
            ),
        ),
    ),
    Bug(
        "hit_by_hash_only",
        "a hit is trusted on the hash alone, never verified against the stored identity",
        (
            ("_walk.py", _VERIFY_START, "        return m  # trusted on the hash alone\n"),
            (
                "_walk.py",
                _VERIFY_ONE,
                """                if not pool.is_published(b):
                    return j""",
            ),
        ),
    ),
    Bug(
        "hit_verified_one_token_short",
        "a run of hit blocks is compared one token short: a block that differs only in its "
        "last token is served",
        (
            (
                "_walk.py",
                "            if ptoks[c * nb : (c + stop - start) * nb]"
                " != buf[start * nb : stop * nb]:",
                "            if ptoks[c * nb : (c + stop - start) * nb - 4]"
                " != buf[start * nb : stop * nb - 4]:",
            ),
        ),
    ),
    Bug(
        "hit_ignores_parent",
        "a hit is verified on the block's own tokens only, not its parent (prefix) chain",
        (
            ("_walk.py", _VERIFY_PARENT, ""),
            (
                "_pool.py",
                """            self.tokens[start : start + self.block_nbytes] == tokens
            and self.parent[b] == parent
""",
                """            self.tokens[start : start + self.block_nbytes] == tokens
""",
            ),
        ),
    ),
    Bug(
        "namespace_keyed_by_model",
        "namespace cache keyed by model name only: LoRA adapters and tenants share KV",
        (
            (
                "_keys.py",
                """        entry = self._namespaces.get(namespace)""",
                """        entry = self._namespaces.get(namespace.model)""",
            ),
            (
                "_keys.py",
                "            entry = self._namespaces[namespace] = (",
                "            entry = self._namespaces[namespace.model] = (",
            ),
        ),
    ),
    Bug(
        "can_admit_double_counts_hits",
        "admission capacity counts matched refcount-0 cached blocks both as hits and as "
        "evictable supply",
        (
            (
                "cache.py",
                """        supply = self._pool.supply - unanchored
        if need > supply:""",
                """        supply = self._pool.supply
        if need > supply:""",
            ),
        ),
    ),
    Bug(
        "capacity_counts_pinned_cached",
        "admission capacity counts every refcount-0 cached block as evictable, even a "
        "parent pinned by a live child published under it",
        (
            (
                "_walk.py",
                "key=lambda b: not (ref[b] or anchored[b])",
                "key=lambda b: not ref[b]",
            ),
            (
                "_walk.py",
                "if first_unanchored < 0 and not pool.ref[b] and not pool.anchored_children[b]:",
                "if first_unanchored < 0 and not pool.ref[b]:",
            ),
            (
                "cache.py",
                """        supply = self._pool.supply - unanchored
        if need > supply:""",
                """        supply = self._pool.num_free + self._pool.num_cached - unanchored
        if need > supply:""",
            ),
        ),
    ),
    Bug(
        "publish_at_schedule",
        "blocks are published when scheduled (tokens known, slots reserved), before their "
        "KV is computed",
        (
            (
                "cache.py",
                _PUBLISH_ON_COMMIT,
                """        stop = min(seq.num_reserved, len(seq.tokens)) // bs
        if stop > len(seq.hashes):
            self._counters.blocks_published += self._publisher.publish(
                seq,
                len(seq.hashes),
                stop,
""",
            ),
        ),
    ),
    Bug(
        "publish_off_by_one",
        "the block completed by a commit is published one commit late",
        (
            (
                "cache.py",
                _PUBLISH_ON_COMMIT,
                """        if max(new_computed - 1, 0) // bs > len(seq.hashes):
            self._counters.blocks_published += self._publisher.publish(
                seq,
                len(seq.hashes),
                max(new_computed - 1, 0) // bs,
""",
            ),
        ),
    ),
    Bug(
        "full_prompt_cap_off_by_one",
        "a full-prompt hit is not capped: nothing is left to compute for the last token",
        (
            (
                "_walk.py",
                "        cap = (req.num_tokens - 1) // self.block_size\n",
                "        cap = req.num_tokens // self.block_size\n",
            ),
        ),
    ),
    Bug(
        "free_queue_lifo",
        "released blocks go to the front of the free queue (LIFO) instead of the back",
        (
            (
                "_pool.py",
                """            if not depth[b]:
                released.append(b)
                continue""",
                """            if not depth[b]:
                released.appendleft(b)
                continue""",
            ),
        ),
    ),
    Bug(
        "release_head_first",
        "a table is released head first, so parents age after their children",
        (
            (
                "_pool.py",
                """        freed = cached = unanchored = 0
        for b in reversed(blocks):""",
                """        freed = cached = unanchored = 0
        for b in blocks:""",
            ),
        ),
    ),
    Bug(
        "rollback_frees_computed",
        "rollback keeps floor(reserved / block_size) blocks, dropping a partly computed tail",
        (
            (
                "cache.py",
                """        keep = -(-seq.num_reserved // self._block_size)
        dropped = seq.blocks[keep:]""",
                """        keep = seq.num_reserved // self._block_size
        dropped = seq.blocks[keep:]""",
            ),
        ),
    ),
    Bug(
        "commit_mutates_before_raise",
        "commit records the accepted tokens before validating the count (INV-TXN)",
        (
            (
                "cache.py",
                """        return check_commit(
            seq.seq_id,
            seq.num_computed,
            seq.num_reserved,
            len(seq.tokens),
            num_computed,
            accepted_tokens,
        )""",
                """        accepted, _ = check_commit(
            seq.seq_id, seq.num_computed, seq.num_reserved, len(seq.tokens), 0, accepted_tokens
        )
        seq.tokens.extend(accepted)
        return check_commit(
            seq.seq_id,
            seq.num_computed,
            seq.num_reserved,
            len(seq.tokens) - len(accepted),
            num_computed,
            accepted,
        )""",
            ),
            (
                "cache.py",
                """        seq.tokens.extend(accepted)
        seq.num_computed = new_computed""",
                """        seq.num_computed = new_computed""",
            ),
        ),
    ),
    Bug(
        "append_reserves_before_check",
        "append bumps the reservation before the capacity check fails (INV-TXN)",
        (
            (
                "cache.py",
                """        supply = self._pool.supply
        if need > supply:
            raise self._out_of_blocks(need, supply)
        new, _ = self._allocate(need)
        seq.blocks.extend(new)
        seq.num_reserved = reserved""",
                """        seq.num_reserved = reserved
        supply = self._pool.supply
        if need > supply:
            raise self._out_of_blocks(need, supply)
        new, _ = self._allocate(need)
        seq.blocks.extend(new)""",
            ),
        ),
    ),
    Bug(
        "rejected_admission_counted",
        "a rejected admission (or a can_admit probe) still counts its prompt as a query",
        (
            (
                "cache.py",
                """        blocks, hashes, unanchored, window, lost, keys = self._match(req)
        if num_new_tokens is not None:""",
                """        blocks, hashes, unanchored, window, lost, keys = self._match(req)
        self._counters.queries += len(req.token_ids)
        if num_new_tokens is not None:""",
            ),
            # the query then moves from the admission to the plan
            (
                "cache.py",
                "        count_admission(self._counters, req.num_tokens, cached, lost)\n",
                "        count_admission(self._counters, req.num_tokens, cached, lost)\n"
                "        self._counters.queries -= req.num_tokens\n",
            ),
        ),
    ),
    Bug(
        "lru_tiebreak_shallow_first",
        "among leaves released together, the shallower one is evicted first",
        (
            (
                "_leaves.py",
                "heapq.heappush(self.heap, (pool.last_use[b], -pool.depth[b], b, version))",
                "heapq.heappush(self.heap, (pool.last_use[b], pool.depth[b], b, version))",
            ),
        ),
    ),
    Bug(
        "reused_block_unheld",
        "a block taken again from the free queue is handed out without its hold (INV-REF)",
        (
            (
                "_pool.py",
                """                b = popleft()
                ref[b] = 1
                taken.append(b)""",
                """                b = popleft()
                taken.append(b)""",
            ),
        ),
    ),
    Bug(
        "fresh_range_unheld",
        "never-used blocks are handed out without their hold (INV-REF)",
        (
            (
                "_pool.py",
                """            self.ref[start : start + fresh] = _ONE * fresh\n""",
                "",
            ),
        ),
    ),
    Bug(
        "last_use_not_updated",
        "a block's last use is not refreshed when it is released, so hot prefixes age out",
        (
            (
                "_pool.py",
                """            last_use[b] = clock
            cached += 1""",
                """            cached += 1""",
            ),
        ),
    ),
    Bug(
        "duplicate_overwrites_canonical",
        "a duplicate publication replaces the canonical block in the index",
        (
            (
                "_publication.py",
                """                if twin >= 0:
                    seq.canon_j, seq.canon_block, seq.canon_gen = j, twin, pool.gen[twin]
                    if wire is not None:
                        wire.append(pool.event_hash[twin])
                    continue""",
                """                if twin >= 0:
                    index.remove(h, twin)""",
            ),
        ),
    ),
    Bug(
        "parent_not_requeued",
        "a parent that becomes a leaf when its last child is evicted is never queued",
        (
            (
                "_leaves.py",
                """                push(heap, (*entry, pv))\n""",
                "",
            ),
        ),
    ),
    Bug(
        "stale_canonical_after_reuse",
        "the remembered canonical twin is not invalidated when it is evicted and reused (ABA)",
        (("_pool.py", "            gen[b] = (gen[b] + 1) & _WRAP\n", ""),),
    ),
    Bug(
        "prefill_stats_scheduled",
        "computed prefill tokens count the scheduled chunk, not the uncached prompt",
        (
            (
                "cache.py",
                "        count_admission(self._counters, req.num_tokens, cached, lost)\n",
                "        count_admission(self._counters, end, cached, lost)\n",
            ),
        ),
    ),
    Bug(
        "reset_keeps_released",
        "a full reset restarts the fresh range but keeps the released queue (blocks twice free)",
        (("_pool.py", "        self.released.clear()\n", ""),),
    ),
    # -- multimodal spans, recompute windows, chunked prefill ------------------------------
    Bug(
        "extras_not_verified",
        "a hit is verified on tokens and parent but not the multimodal extra keys: two images "
        "with the same placeholder tokens share KV after a hash collision",
        (("_pool.py", "            and self.extra.get(b, ()) == extra\n", ""),),
    ),
    Bug(
        "text_hits_multimodal_block",
        "a text-only lookup accepts a block that carries extra keys: placeholder token ids "
        "typed as text hit an image's KV",
        (("_walk.py", _VERIFY_EXTRA, ""),),
    ),
    Bug(
        "match_ends_inside_span",
        "a match is not clamped to the start of the span it ends in (half an image reused)",
        (
            (
                "cache.py",
                "        k1 = clamp_out_of_spans(m, spans, bs) if spans else m\n",
                "        k1 = m\n",
            ),
        ),
    ),
    Bug(
        "window_attached_shared",
        "the recompute window is not cut from the hit: its blocks are attached shared and "
        "written again instead of recomputed into fresh private blocks",
        (("cache.py", "        attached = k1 - window\n", "        attached = k1\n"),),
    ),
    Bug(
        "window_counted_as_hit",
        "tokens recomputed in the window are counted as cache hits",
        (
            (
                "cache.py",
                "        count_admission(self._counters, req.num_tokens, cached, lost)\n",
                "        count_admission(\n"
                "            self._counters, req.num_tokens, cached + lost.window, lost\n"
                "        )\n",
            ),
        ),
    ),
    Bug(
        "resume_ignores_limit",
        "a resumed prefill chunk ignores kv_token_limit (only the first chunk is capped)",
        (
            (
                "cache.py",
                "            seq.num_reserved, seq.prompt_len, num_new_tokens, seq.kv_token_limit, "
                "seq.spans\n",
                "            seq.num_reserved, seq.prompt_len, num_new_tokens, None, seq.spans\n",
            ),
        ),
    ),
    Bug(
        "chunk_splits_span",
        "a resumed chunk boundary is not moved off a span: an image is split across chunks",
        (
            (
                "cache.py",
                "            seq.num_reserved, seq.prompt_len, num_new_tokens, seq.kv_token_limit, "
                "seq.spans\n",
                "            seq.num_reserved, seq.prompt_len, num_new_tokens, seq.kv_token_limit, "
                "()\n",
            ),
        ),
    ),
    Bug(
        "hit_resumes_from_zero",
        "after a prefix hit, chunking restarts from position 0: the cached prefix is charged "
        "against the step's token budget",
        (
            (
                "cache.py",
                "            end = chunk_end(cached, req.num_tokens, num_new_tokens, "
                "req.kv_token_limit, req.spans)\n",
                "            end = max(cached + 1, chunk_end(0, req.num_tokens, num_new_tokens, "
                "req.kv_token_limit, req.spans))\n",
            ),
        ),
    ),
    Bug(
        "chunk_published_at_reserve",
        "a prefill chunk's full blocks are published when the chunk is reserved, so a cancel "
        "mid-chunk leaves unwritten KV matchable",
        (
            (
                "cache.py",
                "        start = seq.num_reserved\n        seq.num_reserved = end\n",
                "        start = seq.num_reserved\n        seq.num_reserved = end\n"
                "        self._counters.blocks_published += self._publisher.publish(\n"
                "            seq,\n"
                "            start // self._block_size,\n"
                "            end // self._block_size,\n"
                "            self._events if self._record_events else None,\n"
                "        )\n",
            ),
        ),
    ),
    Bug(
        "evicted_not_remembered",
        "evicted identities are not remembered: reuse lost to eviction is reported as never cached",
        (
            (
                "_record.py",
                "                    drop_oldest(False)\n            remembered[key] = serial[b]\n",
                "                    drop_oldest(False)\n",
            ),
        ),
    ),
    Bug(
        "heap_rebuild_drops_live",
        "the lazy-deletion eviction heap is rebuilt with the version test inverted: live "
        "leaves are dropped (never evicted again) and stale entries kept",
        (
            (
                "_leaves.py",
                "            self.versions[b] == entry[3]\n",
                "            self.versions[b] != entry[3]\n",
            ),
        ),
    ),
    # -- KV events and capacity checks -------------------------------------------------------
    Bug(
        "stored_event_without_parent",
        "BlockStored events carry no parent hash, so a KV-aware router cannot chain them",
        (
            (
                "_publication.py",
                "stored_event(w, parent_w, tup, bs, ns, extras)",
                "stored_event(w, None, tup, bs, ns, extras)",
            ),
        ),
    ),
    Bug(
        "evict_without_removed_event",
        "eviction emits no BlockRemoved event: routers keep sending requests to KV that is gone",
        (
            (
                "cache.py",
                "                if events is not None:\n"
                "                    events.append(BlockRemoved((wire[b],)))\n",
                "",
            ),
        ),
    ),
    Bug(
        "full_reset_without_cleared_event",
        "a full reset emits no AllBlocksCleared event",
        (
            (
                "cache.py",
                "        if self._record_events:\n"
                "            self._events.append(AllBlocksCleared())\n",
                "",
            ),
        ),
    ),
    Bug(
        "can_append_off_by_one",
        "the decode capacity check is off by one: can_append refuses the last free block",
        (
            (
                "cache.py",
                "        return need <= self._pool.supply\n",
                "        return need < self._pool.supply\n",
            ),
        ),
    ),
    # -- the decode fast paths and the fused and batched calls (machine="steps") -------------
    Bug(
        "fused_fast_path_skips_publish",
        "the fused decode fast path takes a commit that completes a block, so the block is "
        "never published (choice 1: publish after compute)",
        (
            (
                "_fused.py",
                "                    # blocks: ceil(reserved / bs), so this is "
                '"nothing to allocate"\n'
                "                    if now // bs == done // bs"
                " and grown <= len(seq.blocks) * bs:\n",
                "                    # blocks: ceil(reserved / bs), so this is "
                '"nothing to allocate"\n'
                "                    if grown <= len(seq.blocks) * bs:\n",
            ),
        ),
        machine="steps",
    ),
    Bug(
        "batched_fast_path_skips_allocate",
        "the batched decode fast path reserves past the blocks the sequence holds without "
        "allocating one (INV-LIMIT)",
        (
            (
                "_fused.py",
                "                        if now // bs == done // bs"
                " and grown <= len(seq.blocks) * bs:\n",
                "                        if now // bs == done // bs:\n",
            ),
        ),
        machine="steps",
    ),
    Bug(
        "commit_fast_path_unknown_tokens",
        "the per-call commit fast path records KV for tokens it was never given",
        (
            (
                "_fused.py",
                "            if held <= now <= seq.num_reserved"
                " and now <= len(seq.tokens) + len(accepted_tokens):\n",
                "            if held <= now <= seq.num_reserved:\n",
            ),
        ),
    ),
    # -- the publication fast paths (one block; a run of prompt blocks) ---------------------
    Bug(
        "fast_publish_under_private_parent",
        "the publication fast paths (one block, a run of prompt blocks) publish under the "
        "sequence's own parent even when that parent is a private duplicate (INV-ANCESTOR)",
        (
            (
                "_publication.py",
                "        return p if self.pool.depth[p] else MISSING\n",
                "        return p\n",
            ),
        ),
    ),
    Bug(
        "lean_step_skips_allocate",
        "the decode step that completes a block sizes its reservation by the slots it held, "
        "not the slots it grows to: it publishes but allocates no next block (INV-LIMIT)",
        (
            (
                "_fused.py",
                "        need = -(-grown // bs) - len(blocks)\n"
                "        if need > 0:\n"
                "            pool = self._pool\n",
                "        need = -(-seq.num_reserved // bs) - len(blocks)\n"
                "        if need > 0:\n"
                "            pool = self._pool\n",
            ),
        ),
        machine="steps",
    ),
    # -- recurrent-state checkpoints and routed experts (impl/_checkpoints.py) ---------------------
    Bug(
        "release_pinned_checkpoint",
        "slot pressure evicts the oldest saved checkpoint even while a restore has it pinned: "
        "the engine then restores from a slot that was handed to someone else",
        (
            (
                "_checkpoints.py",
                "                if ck.status == READY:\n",
                "                if ck.status != RESERVED:\n",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "restore_non_ready_checkpoint",
        "a hybrid hit takes any checkpoint on its node, also one pinned by another pending "
        "restore (not Ready), and re-pins it under a second owner",
        (
            (
                "_checkpoints.py",
                "                and ck.status == READY\n",
                "",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "restore_off_boundary_checkpoint",
        "off by one block: the hit ends at a boundary whose parent block has a checkpoint, so "
        "the restored state is one block short of the reused KV",
        (
            (
                "_checkpoints.py",
                "            ck = node_ckpt.get(blocks[c - 1])",
                "            ck = node_ckpt.get(blocks[max(c - 2, 0)])",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "publish_rejected_draft_state",
        "a decode checkpoint is published once its slots are reserved and the draft step ran, "
        "not once the tokens up to it are accepted: rejected drafts reach a saved state",
        (
            (
                "_checkpoints.py",
                "        if ck is not None and ck.boundary <= seq.num_computed:",
                "        if ck is not None and ck.boundary <= seq.num_reserved:",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "stale_checkpoint_kept",
        "evicting a KV node leaves its checkpoint behind: when the block is reused, a hit "
        "restores a state of another prefix",
        (
            (
                "_checkpoints.py",
                "                events.append(CheckpointRemoved((ck.block_hash,)))\n"
                "            self._drop_saved(ck)\n"
                "            self._released_stale += 1\n",
                "                events.append(CheckpointRemoved((ck.block_hash,)))\n",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "aborted_restore_stays_pinned",
        "a restore owner that aborts before issuing its restore leaves the checkpoint pinned "
        "forever: never restorable, never evictable",
        (
            (
                "_checkpoints.py",
                """            ck = self._pinned.pop(seq_id, None)
            if ck is not None:  # an aborted restore: the checkpoint is Ready again
                ck.status, ck.owner = READY, None
                self._num_ready_unpinned += 1
""",
                "",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "reservation_survives_rollback",
        "rolling back draft slots keeps a checkpoint reservation past the new tail (the engine "
        "is told to save a state at a position it will not compute)",
        (
            (
                "_checkpoints.py",
                "            if current.boundary == target:",
                "            if current.boundary >= target:",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "routed_experts_overwritten",
        "a later equal computation overwrites routed-expert data instead of only enriching "
        "blocks that have none",
        (
            (
                "_checkpoints.py",
                "            if node >= 0 and node not in self._experts:",
                "            if node >= 0:",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "routed_experts_partial_replay",
        "a hit replays routed-expert data for the blocks that have it, skipping the others, "
        "instead of replaying nothing unless every hit block has it",
        (
            (
                "_checkpoints.py",
                "            if data is None:\n                return None",
                "            if data is None:\n                continue",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "can_admit_counts_restore_source",
        "the state-slot check of can_admit counts the checkpoint the admission is about to pin "
        "as evictable, so it promises a runtime slot that admission cannot get",
        (
            (
                "_checkpoints.py",
                " + self._num_ready_unpinned - (1 if pins_a_hit else 0)",
                " + self._num_ready_unpinned",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "draft_state_kept",
        "keep_state accepts the state after any reserved token, so an engine may keep a "
        "draft's state that the rollback then drops: the runtime slot runs ahead of the tokens",
        (
            (
                "_checkpoints.py",
                "            seq_id, position, self._positions[seq_id], num_computed\n",
                "            seq_id, position, self._positions[seq_id], position\n"
                "            if type(position) is int and position >= num_computed\n"
                "            else num_computed\n",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "append_skips_the_store",
        "a decode append within the held blocks skips the checkpoint store's hook: the "
        "reservation stays at the old save point while the engine reserves past the new one",
        (
            (
                "cache.py",
                "            seq.num_reserved = reserved\n"
                "            if self._checkpoints is not None:\n"
                "                self._checkpoints.on_reserve(seq, self._event_queue())\n"
                "            return []\n",
                "            seq.num_reserved = reserved\n            return []\n",
            ),
        ),
        machine="hybrid",
    ),
    Bug(
        "restore_position_one_block_short",
        "pending_restore reports the position one block before the checkpoint's boundary, so "
        "the engine starts the forward from a position the restored state is not at",
        (
            (
                "_checkpoints.py",
                "        ck = self._pinned.get(seq_id)\n"
                "        return None if ck is None else StateRef(ck.slot, ck.boundary)\n",
                "        ck = self._pinned.get(seq_id)\n"
                "        return None if ck is None else StateRef(ck.slot, ck.boundary - 1)\n",
            ),
        ),
        machine="hybrid",
    ),
)
