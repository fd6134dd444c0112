"""KV events over ZeroMQ, the way vLLM's ``ZmqEventPublisher`` sends them.

Publisher: a PUB socket sends each batch as three frames, ``[topic, seq, payload]``, where
``seq`` is an 8-byte big-endian sequence number counting batches from 0 and ``payload`` an
``EventBatch`` (:mod:`prefixkv.events.wire`). The last batches are kept for a ROUTER replay
endpoint: a client (a DEALER) sends ``[b"", start]`` (8 bytes, big-endian) and gets every
buffered batch from ``start`` on (up to the last one published when it asked), then an end
marker whose sequence frame is -1 (8 bytes of ``0xff``). The replay frames follow the wire
format's vLLM release:

* vLLM 0.33 (:attr:`~prefixkv.events.wire.WireFormat.VLLM_0_33`, the default): each batch as
  ``[b"", topic, seq, payload]``, the end as ``[b"", b"", -1, b""]``;
* vLLM 0.20: each batch as ``[b"", seq, payload]``, the end as ``[b"", -1, b""]``.

The replay endpoint cannot be abused:

* a frame over :data:`MAX_REQUEST_BYTES` disconnects its peer before it is read;
* one replay per client at a time (a request from a client being served is refused), at
  most ``max_replays`` clients at once, served in turns of :data:`REPLAY_CHUNK` batches
  (up to ``max_replays`` more wait their turn, in order; beyond, requests are refused); a
  replay whose client reads nothing for ``replay_stall_s`` (10 s by default) is abandoned,
  so that clients that never read cannot take every place;
* flow control: a client whose pipe is full waits for its next turn (a ROUTER socket would
  otherwise drop the message silently), so a replay never has a hole, and a client that
  does not read holds up neither the other replays nor the live stream (the PUB socket is
  another socket, and the buffer's lock is never held for more than one batch);
* the buffer is bounded in batches (``buffer_size``) and in bytes (``buffer_bytes``, 64 MiB
  by default, :data:`DEFAULT_BUFFER_BYTES`).

Subscriber: applies the batches in sequence order to an
:class:`~prefixkv.spec.event_mirror.EventMirror`. PUB/SUB loses messages by design (a late
join, a full queue), so the subscriber checks every batch, live or replayed, for
contiguity:

* the next one: apply it;
* a gap in the live stream: replay from the first missing batch, then carry on;
* a hole inside a replay: never apply past it; ask again from the missing batch, up to
  ``replay_attempts`` times;
* one it already applied (a duplicate, or out of order behind a replay): log and skip;
* a malformed message (wrong frame count, a truncated payload, an unknown tag): log it and
  resync through the replay endpoint, which holds the batch as it was sent.

When replay cannot close a gap (the batch left the publisher's buffer), the subscriber
raises :class:`ReplayGap` and marks itself ``stale``: it applies nothing more, and a
router must not route on its mirror, until a batch that holds an ``AllBlocksCleared``
brings it back in sync (applied from the clear on). A batch the mirror cannot apply raises
:class:`~prefixkv.spec.event_mirror.EventStreamError`, and the mirror stays as it was.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs
import zmq

from prefixkv.spec import AllBlocksCleared, KVEvent, PrefixCacheError
from prefixkv.spec.event_mirror import EventMirror

from .wire import (
    DEFAULT_FORMAT,
    WireError,
    WireFormat,
    as_format,
    decode_batch,
    encode_batch,
    is_checkpoint_event,
)

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_MAX_REPLAYS",
    "DEFAULT_REPLAY_STALL_S",
    "MAX_REQUEST_BYTES",
    "EventPublisher",
    "EventSubscriber",
    "ReplayConfigError",
    "ReplayGap",
]

log = logging.getLogger(__name__)

_END = (-1).to_bytes(8, "big", signed=True)

DEFAULT_BUFFER_BYTES = 64 * 2**20
"""The replay buffer's default bound, in payload bytes (64 MiB)."""
DEFAULT_MAX_REPLAYS = 64
"""How many clients the replay endpoint serves at once, by default."""
MAX_REQUEST_BYTES = 64
"""The largest frame the replay endpoint reads (a request's frames are 0 and 8 bytes)."""
DEFAULT_REPLAY_STALL_S = 10.0
"""A replay whose client reads nothing for this long is abandoned, by default."""
REPLAY_CHUNK = 16
"""Batches sent to one client in a turn, before the next client's turn."""


class ReplayGap(PrefixCacheError, RuntimeError):
    """Batches were lost and cannot be replayed: the subscriber's mirror is stale.

    Fix: rebuild the consumer from a fresh subscriber after the publisher's cache is reset
    (its ``AllBlocksCleared`` resyncs a stale subscriber), or raise the publisher's
    ``buffer_size`` / ``buffer_bytes`` so that a replay still finds the batches.
    """


class ReplayConfigError(PrefixCacheError, ValueError):
    """A publisher or subscriber option out of range (the message names it)."""


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise WireError(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


class EventPublisher:
    """PUB ``[topic, seq, payload]`` plus a replay endpoint over the last batches.

    ``endpoint`` and ``replay_endpoint`` are bound; ``tcp://127.0.0.1:*`` picks a free port,
    and :attr:`endpoint` / :attr:`replay_endpoint` then name the bound addresses. The
    replay endpoint is served by a background thread, which alone touches its socket.
    ``checkpoint_events`` sends a hybrid cache's checkpoint events too (prefixkv's own
    tags, which vLLM's decoder rejects: see :mod:`prefixkv.events.wire`). ``wire_format``
    picks the vLLM release whose payload and replay frames are sent.

    The replay buffer keeps at most ``buffer_size`` batches and ``buffer_bytes`` bytes of
    payload (default :data:`DEFAULT_BUFFER_BYTES`, 64 MiB), the oldest leaving first; a
    batch larger than ``buffer_bytes`` on its own is sent live but not kept (a subscriber
    that loses it gets :class:`ReplayGap`). The replay endpoint is hardened (see the
    module doc): request frames over :data:`MAX_REQUEST_BYTES` disconnect their peer
    unread, each client has one replay at a time, at most ``max_replays`` clients are
    served at once, in turns of :data:`REPLAY_CHUNK` batches, and a client that does not
    read waits (flow control) rather than losing batches or holding up the others.
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:*",
        replay_endpoint: str = "tcp://127.0.0.1:*",
        *,
        topic: bytes = b"kv-events",
        buffer_size: int = 10_000,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        max_replays: int = DEFAULT_MAX_REPLAYS,
        replay_stall_s: float = DEFAULT_REPLAY_STALL_S,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        checkpoint_events: bool = False,
        wire_format: WireFormat | str = DEFAULT_FORMAT,
    ) -> None:
        for name, value in (
            ("buffer_size", buffer_size),
            ("buffer_bytes", buffer_bytes),
            ("max_replays", max_replays),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ReplayConfigError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(replay_stall_s, bool) or not (
            isinstance(replay_stall_s, int | float) and replay_stall_s > 0
        ):
            raise ReplayConfigError(f"replay_stall_s must be > 0, got {replay_stall_s!r}")
        self.replay_stall_s = float(replay_stall_s)
        self._ctx = context or zmq.Context.instance()
        self.topic = topic
        self.checkpoint_events = checkpoint_events
        self.wire_format = as_format(wire_format)
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
        self.max_replays = max_replays
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        # A frame over the limit disconnects its peer before it is read into memory.
        self._router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        # NOTE: a ROUTER socket silently drops a message to a peer whose pipe is full
        # (SNDHWM messages, 1,000 by default): a long replay lost batches in its middle.
        # Mandatory routing makes a full pipe an EAGAIN instead, and the replay of that
        # client waits until it reads: flow control, never a hole.
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.bind(replay_endpoint)
        self.replay_endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: dict[int, bytes] = {}  # seq -> payload, oldest first
        self._buffered_bytes = 0
        self._first = 0  # the oldest sequence number the buffer may hold
        self._lock = threading.Lock()
        self._next_seq = 0
        self._replays: dict[bytes, _Replay] = {}  # client -> its replay in progress
        self._waiting: dict[bytes, int] = {}  # client -> start, in the order asked
        self.refused = 0
        """Replay requests refused: malformed, from a client already served or waiting,
        or with ``max_replays`` clients already waiting."""
        self.stalled = 0
        """Replays abandoned because their client read nothing for ``replay_stall_s``."""
        self.unbuffered = 0
        """Batches larger than ``buffer_bytes``, sent live but not kept for replay."""
        self._stop = threading.Event()
        self._topic_frame = self.wire_format is WireFormat.VLLM_0_33
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def buffered(self) -> tuple[int, int]:
        """``(batches, payload bytes)`` the replay buffer holds now."""
        with self._lock:
            return len(self._buffer), self._buffered_bytes

    def publish(self, events: list[KVEvent]) -> int:
        """Send one batch (empty batches are skipped).

        Args:
            events: the batch, in order.

        Returns:
            Its sequence number, or -1 for an empty batch.
        """
        if not self.checkpoint_events:
            events = [e for e in events if not is_checkpoint_event(e)]
        if not events:
            return -1
        payload = encode_batch(
            events, checkpoints=self.checkpoint_events, wire_format=self.wire_format
        )
        with self._lock:  # O(1) amortized: a replay never holds the lock for long
            seq = self._next_seq
            self._next_seq += 1
            if len(payload) > self.buffer_bytes:
                log.warning(
                    "batch %d of %d bytes exceeds the replay buffer (%d bytes): not kept",
                    seq,
                    len(payload),
                    self.buffer_bytes,
                )
                self.unbuffered += 1
                self._buffer.clear()
                self._buffered_bytes = 0
                self._first = seq + 1
            else:
                self._buffer[seq] = payload
                self._buffered_bytes += len(payload)
                while (
                    len(self._buffer) > self.buffer_size or self._buffered_bytes > self.buffer_bytes
                ):
                    self._buffered_bytes -= len(self._buffer.pop(self._first))
                    self._first += 1
        self._pub.send_multipart([self.topic, seq.to_bytes(8, "big", signed=True), payload])
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            ready = [r for r in self._replays.values() if not r.blocked]
            # Wait for requests only when no replay can make progress; a blocked one is
            # retried every few milliseconds (its client is reading, or will be dropped).
            timeout = 0 if ready else (2 if self._replays else 50)
            if poller.poll(timeout):
                self._take_requests()
            self._admit_waiting()
            now = time.monotonic()
            for replay in list(self._replays.values()):
                replay.blocked = False
                self._send_turn(replay, now)
                if replay.blocked and now - replay.moved > self.replay_stall_s:
                    # NOTE: a client that asks and never reads would hold one of the
                    # max_replays places forever; its replay ends without an end marker,
                    # and the client, if it ever reads, times out (ReplayGap).
                    del self._replays[replay.client]
                    self.stalled += 1
                    log.warning(
                        "replay abandoned: its client read nothing in %gs", self.replay_stall_s
                    )

    def _take_requests(self) -> None:
        for _ in range(REPLAY_CHUNK * 4):  # bounded: requests never starve the sends
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                self.refused += 1
                log.warning("malformed replay request (%d frames)", len(frames))
                continue
            client, start = frames[0], _seq(frames[2])
            if client in self._replays or client in self._waiting:
                # NOTE: one replay per client at a time. Flooding requests only ever
                # costs the flooder its own turn; it never multiplies the work.
                self.refused += 1
                continue
            if len(self._waiting) >= self.max_replays:
                self.refused += 1
                log.warning("replay request refused: %d clients wait", self.max_replays)
                continue
            self._waiting[client] = max(start, 0)

    def _admit_waiting(self) -> None:
        """Start the replays that wait, in the order asked, while there are places."""
        while self._waiting and len(self._replays) < self.max_replays:
            client = next(iter(self._waiting))
            start = self._waiting.pop(client)
            # The replay covers what was published when it starts; later batches reach
            # the client on the live stream.
            with self._lock:
                end = self._next_seq
            self._replays[client] = _Replay(client, start, end, time.monotonic())

    def _send_turn(self, replay: _Replay, now: float) -> None:
        """Send up to :data:`REPLAY_CHUNK` of one client's batches, then the end marker."""
        head = [replay.client, b""] + ([self.topic] if self._topic_frame else [])
        for _ in range(REPLAY_CHUNK):
            with self._lock:
                # A batch that left the buffer while the client was slow is skipped: the
                # client sees the jump in sequence numbers and reports it (ReplayGap).
                seq = max(replay.next, self._first)
                payload = self._buffer.get(seq) if seq < replay.end else None
            if payload is None:
                # vLLM 0.33 added the topic to each replayed batch, and an empty frame in
                # its place to the end marker, so that a replay reads like the PUB stream.
                end = [replay.client, b""] + ([b""] if self._topic_frame else [])
                if self._send(replay, [*end, _END, b""]):
                    del self._replays[replay.client]
                return
            if not self._send(replay, [*head, seq.to_bytes(8, "big", signed=True), payload]):
                return
            replay.next = seq + 1
            replay.moved = now

    def _send(self, replay: _Replay, frames: list[bytes]) -> bool:
        try:
            self._router.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # the client's pipe is full: its turn waits, nothing is lost
            replay.blocked = True
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            del self._replays[replay.client]  # the client is gone
            return False
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._router.close()
        self._pub.close()


@attrs.define
class _Replay:
    """One client's replay in progress: batches ``next`` up to ``end`` (excluded) are due."""

    client: bytes
    next: int
    end: int
    moved: float
    """When a batch of it was last sent (``time.monotonic``)."""
    blocked: bool = False


class EventSubscriber:
    """Applies a publisher's batches, in order, to :attr:`mirror` (see the module doc).

    ``drop`` is a test hook: a message it returns true for is lost on the way in.
    ``on_batch(seq, events)`` is called after each batch is applied to the mirror, in
    sequence order, replays included: a router feeds its own index from it.
    ``wire_format`` is the vLLM release the publisher sends (payloads and replay frames).
    ``replay_attempts`` is how many replays a hole is asked for before the subscriber is
    :attr:`stale`; ``replay_timeout_ms`` bounds the wait for each replayed message.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        *,
        topic: bytes = b"kv-events",
        mirror: EventMirror | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        drop: Callable[[list[bytes]], bool] | None = None,
        replay_timeout_ms: int = 5000,
        replay_attempts: int = 3,
        on_batch: Callable[[int, list[KVEvent]], None] | None = None,
        wire_format: WireFormat | str = DEFAULT_FORMAT,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self.topic = topic
        self.wire_format = as_format(wire_format)
        self._reply_frames = 4 if self.wire_format is WireFormat.VLLM_0_33 else 3
        self.mirror = mirror if mirror is not None else EventMirror()
        self.last_seq = -1
        self.stale = False
        """Batches were lost for good: the mirror must not be routed on until a batch that
        holds an ``AllBlocksCleared`` brings it back in sync."""
        self.replays = 0
        """Replay requests sent."""
        self.holes = 0
        """Replays that left a hole (and were asked again)."""
        self.resyncs = 0
        """Times a stale mirror came back in sync (an ``AllBlocksCleared``)."""
        self.skipped = 0
        self.malformed = 0
        self._drop = drop
        self._on_batch = on_batch
        self._timeout = replay_timeout_ms
        if isinstance(replay_attempts, bool) or not isinstance(replay_attempts, int):
            raise ReplayConfigError(f"replay_attempts must be an int, got {replay_attempts!r}")
        if replay_attempts < 1:
            raise ReplayConfigError(f"replay_attempts must be >= 1, got {replay_attempts}")
        self._attempts = replay_attempts
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._sub.connect(endpoint)
        self._replay = self._ctx.socket(zmq.DEALER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.connect(replay_endpoint)

    def poll(self, timeout_ms: int = 0) -> int:
        """Handle every message that arrives within ``timeout_ms``; returns how many."""
        handled = 0
        while self._sub.poll(timeout_ms if handled == 0 else 0):
            frames = self._sub.recv_multipart()
            handled += 1
            if self._drop is not None and self._drop(frames):
                continue
            self.handle(frames)
        return handled

    def handle(self, frames: list[bytes]) -> None:
        """One PUB message: ``[topic, seq, payload]``.

        Args:
            frames: the message's frames.

        Raises:
            ReplayGap: the mirror is stale (see :meth:`catch_up`), and this batch holds no
                ``AllBlocksCleared`` that brings it back in sync.
            EventStreamError: the batch does not apply to the mirror (it stays as it was).
        """
        try:
            if len(frames) != 3 or frames[0] != self.topic:
                raise WireError(f"expected [topic, seq, payload], got {len(frames)} frames")
            seq = _seq(frames[1])
            if self.stale:
                self._resync(seq, decode_batch(frames[2], wire_format=self.wire_format))
                return
            if seq <= self.last_seq:
                self.skipped += 1
                log.info("skipping batch %d: batch %d is already applied", seq, self.last_seq)
                return
            if seq > self.last_seq + 1:
                log.info("gap: batch %d after %d; replaying", seq, self.last_seq)
                self.catch_up()
                return
            events = decode_batch(frames[2], wire_format=self.wire_format)
        except WireError as exc:
            if self.stale:
                raise ReplayGap(f"the mirror is stale, and a malformed batch came: {exc}") from exc
            self.malformed += 1
            log.warning("malformed event message (%s); resyncing through replay", exc)
            self.catch_up()
            return
        self._apply(seq, events)

    def _resync(self, seq: int, events: list[KVEvent]) -> None:
        """A stale mirror comes back in sync at a batch that clears the whole cache: the
        batch is applied from its first ``AllBlocksCleared`` on (the events before it
        changed blocks the clear drops, and may name blocks the stale mirror lacks)."""
        clear = next((k for k, e in enumerate(events) if isinstance(e, AllBlocksCleared)), None)
        if clear is None:
            raise ReplayGap(
                "the mirror is stale: batches were lost beyond the replay buffer; it stays "
                "stale until the publisher's cache is cleared (AllBlocksCleared)"
            )
        self._apply(seq, events[clear:])  # the clear comes first: nothing stale survives it
        self.stale = False
        self.resyncs += 1
        log.info("back in sync at batch %d (AllBlocksCleared)", seq)

    def _apply(self, seq: int, events: list[KVEvent]) -> None:
        self.mirror.apply_all(events)  # all or nothing; EventStreamError leaves it as it was
        self.last_seq = seq
        if self._on_batch is not None:
            # Only after the strict mirror accepted the batch: a router index never sees a
            # batch that does not describe a cache.
            self._on_batch(seq, events)

    def catch_up(self) -> None:
        """Replay every batch after :attr:`last_seq` that the publisher still holds.

        Every replayed batch must be the one after the last applied: a hole (a batch that
        left the publisher's buffer, or one lost on the way) is asked for again, from the
        missing sequence number, up to ``replay_attempts`` times. Batches before the hole
        stay applied (they are exact); none after it is.

        Raises:
            ReplayGap: the hole stayed: the subscriber is marked :attr:`stale`, and its
                mirror must not be routed on until it is back in sync; or the replay
                endpoint did not answer within ``replay_timeout_ms`` (the mirror is then
                behind, not wrong, and a later replay may still close the gap).
        """
        if self.stale:
            raise ReplayGap("the mirror is stale: batches were lost beyond the replay buffer")
        first = last = -1
        for _ in range(self._attempts):
            hole = self._replay_from(self.last_seq + 1)
            if hole is None:
                return
            self.holes += 1
            first, last = hole
            log.warning("replay left out batches %d..%d; asking again", first, last)
        self.stale = True
        raise ReplayGap(
            f"batches {first}..{last} are missing from {self._attempts} replays (the "
            "publisher's buffer no longer holds them): the mirror is stale"
        )

    def _replay_from(self, start: int) -> tuple[int, int] | None:
        """One replay; returns the first hole in it, or None when it had none."""
        self.replays += 1
        self._replay.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        while True:
            frames = self._recv_replay()
            seq = _seq(frames[-2])
            if seq == -1:
                return None
            if seq <= self.last_seq:
                continue  # already applied (a replay overlapping the live stream)
            if seq != self.last_seq + 1:
                # NOTE: never apply past a hole, even if the rest of the replay is whole:
                # the missing batch may remove a block, and the mirror would keep it.
                self._drain_replay()
                return self.last_seq + 1, seq - 1
            if self._reply_frames == 4 and frames[1] != self.topic:
                raise WireError(f"replayed batch {seq} under topic {frames[1]!r}")
            self._apply(seq, decode_batch(frames[-1], wire_format=self.wire_format))

    def _recv_replay(self) -> list[bytes]:
        if not self._replay.poll(self._timeout):
            raise ReplayGap(f"the replay endpoint did not answer within {self._timeout} ms")
        frames = self._replay.recv_multipart()
        if len(frames) != self._reply_frames or frames[0] != b"":
            raise WireError(
                f"replay reply of {len(frames)} frames, expected {self._reply_frames} "
                f"({self.wire_format.value})"
            )
        return frames

    def _drain_replay(self) -> None:
        """Read the rest of a replay, up to its end marker, and drop it."""
        while _seq(self._recv_replay()[-2]) != -1:
            pass

    def close(self) -> None:
        self._sub.close()
        self._replay.close()
