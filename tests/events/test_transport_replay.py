"""Gap-proof replay: a hole in a replay is never applied, and the replay endpoint holds up
against floods, oversized frames and huge batches."""

from __future__ import annotations

import random
import threading
import time

import pytest

pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from prefixkv.spec import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    EventMirror,
    EventStreamError,
    KVEvent,
    Namespace,
    OutOfBlocks,
    Request,
    SpecCache,
    check_events,
)

from prefixkv.events.transport import (  # noqa: E402
    MAX_REQUEST_BYTES,
    EventPublisher,
    EventSubscriber,
    ReplayConfigError,
    ReplayGap,
)
from prefixkv.events.wire import encode_batch  # noqa: E402

TOPIC = b"kv-events"


def stored(h: int, parent: int | None, token: int) -> BlockStored:
    return BlockStored((h,), parent, (token, token), 2, "m@1", None, None, ((),))


#: Batch 2 removes hash 11: a mirror that skips it keeps a block the cache no longer holds.
BATCHES: list[list[KVEvent]] = [
    [stored(10, None, 1)],
    [stored(11, 10, 2)],
    [BlockRemoved((11,))],
    [stored(12, 10, 3)],
]


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


class HoleyEndpoint:
    """A replay endpoint (vLLM 0.33 frames) that answers its k-th request with the batches
    in ``answers[k]`` (the last for every later one) from the request's start on, then the
    end marker."""

    def __init__(self, *answers: list[int]) -> None:
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.answers = answers
        self.requests: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big", signed=True))
            answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
            for s in answer:
                if s >= self.requests[-1]:
                    payload = encode_batch(BATCHES[s])
                    self.router.send_multipart([client, b"", TOPIC, _seq(s), payload])
            self.router.send_multipart([client, b"", b"", _seq(-1), b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.router.close()


def test_a_hole_in_a_replay_is_never_applied() -> None:
    """The endpoint answers 0, 1 and 3: batch 2 (the removal of hash 11) is missing."""
    fake = HoleyEndpoint([0, 1, 3])
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    sub = EventSubscriber(pub.getsockopt_string(zmq.LAST_ENDPOINT), fake.endpoint)
    try:
        with pytest.raises(ReplayGap, match=r"batches 2\.\.2 are missing"):
            sub.catch_up()
        # Batches 0 and 1 are exact and stay; nothing after the hole is applied.
        assert sub.stale and sub.last_seq == 1 and sub.holes == 3
        assert fake.requests == [0, 2, 2]  # asked again from the missing batch
        assert sorted(sub.mirror.blocks) == [10, 11]
        # A stale subscriber refuses every later batch, replays included ...
        with pytest.raises(ReplayGap):
            sub.handle([TOPIC, _seq(4), encode_batch([stored(13, 10, 4)])])
        with pytest.raises(ReplayGap):
            sub.catch_up()
        assert sorted(sub.mirror.blocks) == [10, 11]
        # ... until a batch that clears the cache brings it back in sync.
        sub.handle([TOPIC, _seq(5), encode_batch([AllBlocksCleared(), stored(20, None, 5)])])
        assert not sub.stale and sub.resyncs == 1 and sub.last_seq == 5
        assert sorted(sub.mirror.blocks) == [20]
    finally:
        sub.close()
        pub.close()
        fake.close()


def test_a_stale_subscriber_resyncs_at_a_clear_inside_a_batch() -> None:
    """The clear need not open the batch: what comes before it is dropped with it (it may
    name blocks the stale mirror lacks), and the batch applies from the clear on."""
    fake = HoleyEndpoint([0, 1, 3])
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    seen: list[list[KVEvent]] = []
    sub = EventSubscriber(
        pub.getsockopt_string(zmq.LAST_ENDPOINT),
        fake.endpoint,
        on_batch=lambda _, events: seen.append(events),
    )
    try:
        with pytest.raises(ReplayGap):
            sub.catch_up()
        seen.clear()
        # 12 was stored in the lost batch 2: the stale mirror never saw it.
        batch: list[KVEvent] = [
            BlockRemoved((12,)),
            AllBlocksCleared(),
            stored(20, None, 5),
            stored(21, 20, 6),
        ]
        sub.handle([TOPIC, _seq(5), encode_batch(batch)])
        assert not sub.stale and sub.resyncs == 1 and sub.last_seq == 5
        assert sorted(sub.mirror.blocks) == [20, 21]
        assert seen == [batch[1:]]  # the router's index gets the clear and what follows
    finally:
        sub.close()
        pub.close()
        fake.close()


def test_a_replay_that_closes_its_hole_when_asked_again() -> None:
    """A batch lost on the way (not from the buffer) is found by the second replay."""
    fake = HoleyEndpoint([0, 1, 3], [0, 1, 2, 3])
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    sub = EventSubscriber(pub.getsockopt_string(zmq.LAST_ENDPOINT), fake.endpoint)
    try:
        sub.catch_up()
        assert fake.requests == [0, 2]
        assert not sub.stale and sub.last_seq == 3 and sub.holes == 1
        assert sorted(sub.mirror.blocks) == [10, 12]
    finally:
        sub.close()
        pub.close()
        fake.close()


def _batches(n: int, seed: int) -> list[list[KVEvent]]:
    cache = SpecCache(64, 2, record_events=True)
    rng = random.Random(seed)
    out: list[list[KVEvent]] = []
    step = 0
    live: list[str] = []
    while len(out) < n:
        step += 1
        if rng.random() < 0.6 or not live:
            tokens = tuple(rng.randrange(6) for _ in range(rng.randrange(2, 9)))
            try:
                adm = cache.admit(Request(f"s{step}", tokens, Namespace("m@1")), len(tokens))
            except OutOfBlocks:
                cache.evict(4)
                continue
            cache.commit(f"s{step}", adm.num_scheduled_tokens, ())
            live.append(f"s{step}")
        else:
            cache.free([live.pop(rng.randrange(len(live)))])
            cache.evict(rng.randrange(0, 3))
        batch = cache.take_events()
        if batch:
            out.append(batch)
    cache.free(live)
    return out


def _flood(endpoint: str, stop: threading.Event) -> int:
    """Another client asking for the whole buffer, as fast as it can, reading nothing."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(endpoint)
    sent = 0
    while not stop.is_set():
        for _ in range(50):  # bursts, so that this thread leaves the others the GIL
            dealer.send_multipart([b"", _seq(0)])
        sent += 50
        time.sleep(0.001)
    dealer.close()
    return sent


def _churn(n: int, block_size: int = 256) -> list[list[KVEvent]]:
    """``n`` batches of one event: blocks stored and removed in turn, so a lost one shows."""
    out: list[list[KVEvent]] = []
    for i in range(n):
        tokens = (i,) * block_size
        block = BlockStored((i,), None, tokens, block_size, "m@1", None, None, ((),))
        out += [[block], [BlockRemoved((i,))]] if i % 3 else [[block]]
    return out[:n]


def test_a_replay_flood_never_makes_a_silent_hole() -> None:
    """An honest replay of 1,500 batches of ~6 KB (more than the ROUTER's high-water mark,
    and more bytes than loopback TCP buffers) while another client floods the endpoint
    with replay-all requests, 20 times: every honest replay is whole, and its mirror
    equals the reference. (Before flow control and one replay per client, honest replays
    timed out behind the flood's, or lost batches.)"""
    batches = _churn(1500, block_size=2048)
    reference = EventMirror()
    for b in batches:
        reference.apply_all(b)
    pub = EventPublisher()
    try:
        for b in batches:
            pub.publish(b)
        stop = threading.Event()
        flooder = threading.Thread(target=_flood, args=(pub.replay_endpoint, stop), daemon=True)
        flooder.start()
        try:
            for _ in range(20):
                sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
                try:
                    sub.catch_up()
                    assert not sub.stale and sub.holes == 0
                    assert sub.last_seq == len(batches) - 1
                    assert sub.mirror.blocks == reference.blocks
                finally:
                    sub.close()
        finally:
            stop.set()
            flooder.join()
        # The flooder was served one replay at a time: its requests were refused while
        # its own replay waited for it to read.
        assert pub.refused > 0
    finally:
        pub.close()


def test_a_slow_reader_holds_up_neither_the_live_stream_nor_other_replays() -> None:
    """A client that asks for a replay and never reads: its pipe fills and its replay
    waits; live batches and another client's replay go on, and it loses nothing."""
    batches = _churn(2500, block_size=2048)  # 2000 batches of ~6 KB: more than TCP holds
    pub = EventPublisher()
    ctx = zmq.Context.instance()
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 10)
    slow.connect(pub.replay_endpoint)
    try:
        for b in batches[:2000]:
            pub.publish(b)
        slow.send_multipart([b"", _seq(0)])
        time.sleep(0.05)
        honest = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        honest.catch_up()
        assert honest.last_seq == 1999
        for b in batches[2000:]:
            pub.publish(b)
        honest.catch_up()
        assert honest.last_seq == len(batches) - 1 and honest.holes == 0
        honest.close()
        # The slow client, reading at last, gets every batch of its replay, in order.
        seqs = []
        while True:
            assert slow.poll(5000)
            frames = slow.recv_multipart()
            n = int.from_bytes(frames[-2], "big", signed=True)
            if n == -1:
                break
            seqs.append(n)
        assert seqs == list(range(2000))
    finally:
        slow.close()
        pub.close()


def test_an_oversized_request_frame_is_not_read() -> None:
    """A request frame over MAX_REQUEST_BYTES disconnects its peer; others are served."""
    pub = EventPublisher()
    ctx = zmq.Context.instance()
    big = ctx.socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(pub.replay_endpoint)
    try:
        pub.publish([stored(10, None, 1)])
        big.send_multipart([b"", b"\0" * (8 * 2**20)])  # 8 MiB, where 8 bytes are due
        assert not big.poll(300)  # no answer
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        sub.catch_up()
        assert sub.last_seq == 0 and 10 in sub.mirror
        sub.close()
        # A well-sized but malformed request is refused and counted.
        small = ctx.socket(zmq.DEALER)
        small.setsockopt(zmq.LINGER, 0)
        small.connect(pub.replay_endpoint)
        small.send_multipart([b"", b"\0" * MAX_REQUEST_BYTES])
        time.sleep(0.1)
        assert pub.refused == 1 and not small.poll(100)
        small.close()
    finally:
        big.close()
        pub.close()


def test_the_buffer_is_bounded_in_bytes() -> None:
    """A huge batch: the buffer keeps at most buffer_bytes, and a batch over the bound
    is sent live but not kept, so a subscriber that lost it is told (ReplayGap)."""
    tokens = tuple(range(2 * 1024))
    big: list[KVEvent] = [
        AllBlocksCleared(),
        BlockStored((1,), None, tokens, 2048, "m@1", None, None, ((),)),
    ]
    size = len(encode_batch(big))
    pub = EventPublisher(buffer_bytes=3 * size)
    try:
        for _ in range(10):
            pub.publish(big)
        batches, nbytes = pub.buffered
        assert batches == 3 and nbytes <= 3 * size
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        with pytest.raises(ReplayGap):
            sub.catch_up()  # batches 0..6 left the buffer
        sub.close()
        huge = [BlockStored((2,), None, tokens * 4, 8192, "m@1", None, None, ((),))]
        pub.publish([AllBlocksCleared(), *huge])
        assert pub.buffered == (0, 0) and pub.unbuffered == 1
    finally:
        pub.close()
    with pytest.raises(ReplayConfigError):
        EventPublisher(buffer_bytes=0)


def test_replay_feeds_a_checked_mirror() -> None:
    """A replay through the real publisher equals the cache (INV-EVENTS)."""
    cache = SpecCache(32, 2, record_events=True)
    pub = EventPublisher()
    try:
        for i in range(30):
            tokens = (i % 3, i % 5, 1, 2)
            adm = cache.admit(Request(f"r{i}", tokens, Namespace("m@1")), 4)
            cache.commit(f"r{i}", adm.num_scheduled_tokens, ())
            cache.free([f"r{i}"])
            pub.publish(cache.take_events())
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        sub.catch_up()
        check_events(sub.mirror, cache.snapshot())
        sub.close()
    finally:
        pub.close()


def test_a_bad_batch_changes_nothing_in_the_mirror() -> None:
    """All or nothing without a copy: a batch whose last event is bad undoes the others
    (stores, removals, a clear, checkpoints), and leaves the mirror equal to before."""
    mirror = EventMirror()
    mirror.apply_all([stored(10, None, 1), stored(11, 10, 2), stored(12, 10, 3)])
    mirror.apply_all([stored(11, 10, 2), CheckpointStored((11,))])
    # Another identity under 11: a removal of 11 cannot say which left (unresolved).
    mirror.apply_all([stored(11, 10, 5), BlockRemoved((11,))])
    assert mirror.unresolved == {11: 1} and mirror.held(11) == 2
    before = (
        {h: list(e) for h, e in mirror.blocks.items()},
        dict(mirror.checkpoints),
        dict(mirror.unresolved),
        mirror.block_size,
        mirror.num_events,
    )
    bad_tails: list[KVEvent] = [BlockRemoved((99,)), stored(5, 77, 1), CheckpointRemoved((12,))]
    for tail in bad_tails:
        batch: list[KVEvent] = [
            BlockRemoved((11,)),
            CheckpointRemoved((11,)),
            stored(13, 12, 4),
            CheckpointStored((13,)),
            BlockRemoved((13, 12)),
            AllBlocksCleared(),
            stored(20, None, 9),
            tail,
        ]
        with pytest.raises(EventStreamError):
            mirror.apply_all(batch)
        after = (
            mirror.blocks,
            mirror.checkpoints,
            mirror.unresolved,
            mirror.block_size,
            mirror.num_events,
        )
        assert after == before
    mirror.apply_all([BlockRemoved((11,))])  # and the mirror still works
    assert mirror.unresolved == {11: 2} and mirror.held(11) == 1 and len(mirror) == 3
    mirror.apply_all([BlockRemoved((11,))])  # the last block under 11 left: resolved
    assert 11 not in mirror and not mirror.unresolved and len(mirror) == 2


def test_clients_that_never_read_cannot_take_every_place() -> None:
    """With one place (max_replays=1), a client that asks and never reads is abandoned
    after replay_stall_s, and an honest client is served after it."""
    pub = EventPublisher(max_replays=1, replay_stall_s=0.3)
    ctx = zmq.Context.instance()
    idle = ctx.socket(zmq.DEALER)
    idle.setsockopt(zmq.LINGER, 0)
    idle.setsockopt(zmq.RCVHWM, 10)
    idle.connect(pub.replay_endpoint)
    try:
        for b in _churn(2000, block_size=2048):
            pub.publish(b)
        idle.send_multipart([b"", _seq(0)])
        time.sleep(0.1)
        honest = EventSubscriber(pub.endpoint, pub.replay_endpoint, replay_timeout_ms=3000)
        honest.catch_up()  # refused while the idle client holds the place: asked again
        assert honest.last_seq == 1999 and not honest.stale
        assert pub.stalled == 1
        honest.close()
    finally:
        idle.close()
        pub.close()
    with pytest.raises(ReplayConfigError):
        EventPublisher(replay_stall_s=0)
