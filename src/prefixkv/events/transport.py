"""KV events over ZeroMQ, the way vLLM's ``ZmqEventPublisher`` sends them.

Publisher: a PUB socket sends each batch as three frames, ``[topic, seq, payload]``, where
``seq`` is an 8-byte big-endian sequence number counting batches from 0 and ``payload`` an
``EventBatch`` (:mod:`prefixkv.events.wire`). The last ``buffer_size`` batches are kept for a
ROUTER replay endpoint: a client (a DEALER) sends ``[b"", start]`` (8 bytes, big-endian) and
gets every buffered batch from ``start`` on, then an end marker whose sequence frame is -1
(8 bytes of ``0xff``). The replay frames follow the wire format's vLLM release:

* vLLM 0.33 (:attr:`~prefixkv.events.wire.WireFormat.VLLM_0_33`, the default): each batch as
  ``[b"", topic, seq, payload]``, the end as ``[b"", b"", -1, b""]``;
* vLLM 0.20: each batch as ``[b"", seq, payload]``, the end as ``[b"", -1, b""]``.

Subscriber: applies the batches in sequence order to an
:class:`~prefixkv.spec.event_mirror.EventMirror`. PUB/SUB loses messages by design (a late
join, a full queue), so the subscriber watches the sequence numbers:

* the next one: apply it;
* a gap: replay from the first missing batch, then carry on;
* one it already applied (a duplicate, or out of order behind a replay): log and skip;
* a malformed message (wrong frame count, a truncated payload, an unknown tag): log it and
  resync through the replay endpoint, which holds the batch as it was sent.

When replay cannot close a gap (the batch left the publisher's buffer), the subscriber
raises :class:`ReplayGap` and marks its mirror ``stale``: a router must then drop this
replica's entries (or wait for an ``AllBlocksCleared``), never route on a mirror that is
silently wrong. A batch the mirror cannot apply raises
:class:`~prefixkv.spec.event_mirror.EventStreamError`, and the mirror stays as it was.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import zmq

from prefixkv.spec import KVEvent, PrefixCacheError
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

__all__ = ["EventPublisher", "EventSubscriber", "ReplayGap"]

log = logging.getLogger(__name__)

_END = (-1).to_bytes(8, "big", signed=True)


class ReplayGap(PrefixCacheError, RuntimeError):
    """Batches were lost and the replay endpoint no longer holds them."""


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise WireError(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


class EventPublisher:
    """PUB ``[topic, seq, payload]`` plus a replay endpoint over the last ``buffer_size``.

    ``endpoint`` and ``replay_endpoint`` are bound; ``tcp://127.0.0.1:*`` picks a free port,
    and :attr:`endpoint` / :attr:`replay_endpoint` then name the bound addresses. The
    replay endpoint is served by a background thread, which alone touches its socket.
    ``checkpoint_events`` sends a hybrid cache's checkpoint events too (prefixkv's own
    tags, which vLLM's decoder rejects: see :mod:`prefixkv.events.wire`). ``wire_format``
    picks the vLLM release whose payload and replay frames are sent.
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:*",
        replay_endpoint: str = "tcp://127.0.0.1:*",
        *,
        topic: bytes = b"kv-events",
        buffer_size: int = 10_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        checkpoint_events: bool = False,
        wire_format: WireFormat | str = DEFAULT_FORMAT,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self.topic = topic
        self.checkpoint_events = checkpoint_events
        self.wire_format = as_format(wire_format)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(replay_endpoint)
        self.replay_endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_size)
        self._lock = threading.Lock()
        self._next_seq = 0
        self._stop = threading.Event()
        self._topic_frame = self.wire_format is WireFormat.VLLM_0_33
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def publish(self, events: list[KVEvent]) -> int:
        """Send one batch (empty batches are skipped); returns its sequence number or -1."""
        if not self.checkpoint_events:
            events = [e for e in events if not is_checkpoint_event(e)]
        if not events:
            return -1
        payload = encode_batch(
            events, checkpoints=self.checkpoint_events, wire_format=self.wire_format
        )
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            self._buffer.append((seq, payload))
        self._pub.send_multipart([self.topic, seq.to_bytes(8, "big", signed=True), payload])
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self._router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("malformed replay request (%d frames)", len(frames))
                continue
            client, start = frames[0], _seq(frames[2])
            with self._lock:
                batches = [(s, p) for s, p in self._buffer if s >= start]
            # vLLM 0.33 added the topic to each replayed batch, and an empty frame in its
            # place to the end marker, so that a replay reads like the PUB stream.
            head = [client, b""] + ([self.topic] if self._topic_frame else [])
            for s, p in batches:
                self._router.send_multipart([*head, s.to_bytes(8, "big", signed=True), p])
            end = [client, b""] + ([b""] if self._topic_frame else [])
            self._router.send_multipart([*end, _END, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._router.close()
        self._pub.close()


class EventSubscriber:
    """Applies a publisher's batches, in order, to :attr:`mirror` (see the module doc).

    ``drop`` is a test hook: a message it returns true for is lost on the way in.
    ``on_batch(seq, events)`` is called after each batch is applied to the mirror, in
    sequence order, replays included: a router feeds its own index from it.
    ``wire_format`` is the vLLM release the publisher sends (payloads and replay frames).
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
        self.replays = 0
        self.skipped = 0
        self.malformed = 0
        self._drop = drop
        self._on_batch = on_batch
        self._timeout = replay_timeout_ms
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
        """One PUB message: ``[topic, seq, payload]``."""
        if self.stale:
            raise ReplayGap("the mirror is stale: batches were lost beyond the replay buffer")
        try:
            if len(frames) != 3 or frames[0] != self.topic:
                raise WireError(f"expected [topic, seq, payload], got {len(frames)} frames")
            seq = _seq(frames[1])
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
            self.malformed += 1
            log.warning("malformed event message (%s); resyncing through replay", exc)
            self.catch_up()
            return
        self._apply(seq, events)

    def _apply(self, seq: int, events: list[KVEvent]) -> None:
        self.mirror.apply_all(events)  # all or nothing; EventStreamError leaves it as it was
        self.last_seq = seq
        if self._on_batch is not None:
            # Only after the strict mirror accepted the batch: a router index never sees a
            # batch that does not describe a cache.
            self._on_batch(seq, events)

    def catch_up(self) -> None:
        """Replay every batch after :attr:`last_seq` that the publisher still holds."""
        self.replays += 1
        start = self.last_seq + 1
        self._replay.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        first = True
        while True:
            if not self._replay.poll(self._timeout):
                raise ReplayGap(f"the replay endpoint did not answer within {self._timeout} ms")
            frames = self._replay.recv_multipart()
            if len(frames) != self._reply_frames or frames[0] != b"":
                raise WireError(
                    f"replay reply of {len(frames)} frames, expected {self._reply_frames} "
                    f"({self.wire_format.value})"
                )
            seq = _seq(frames[-2])
            if seq == -1:
                return
            if first and seq > start:
                self.stale = True
                self._drain_replay()
                raise ReplayGap(
                    f"replay starts at batch {seq}; batches {start}..{seq - 1} are lost"
                )
            first = False
            if seq <= self.last_seq:
                continue
            if self._reply_frames == 4 and frames[1] != self.topic:
                raise WireError(f"replayed batch {seq} under topic {frames[1]!r}")
            self._apply(seq, decode_batch(frames[-1], wire_format=self.wire_format))

    def _drain_replay(self) -> None:
        while self._replay.poll(self._timeout):
            frames = self._replay.recv_multipart()
            if len(frames) == self._reply_frames and frames[-2] == _END:
                return

    def close(self) -> None:
        self._sub.close()
        self._replay.close()
