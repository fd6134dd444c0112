"""``prefixkv audit-events`` over ZeroMQ: a clean publisher passes, a buggy one exits 1 with
the check that names its bug, a gap without replay is reported, and the run always ends."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from prefixkv.impl import PrefixCacheManager  # noqa: E402
from prefixkv.spec import AllBlocksCleared, BlockStored, KVEvent, Namespace, Request  # noqa: E402

from prefixkv import cli  # noqa: E402
from prefixkv.events.transport import EventPublisher  # noqa: E402
from prefixkv.events.wire import WireFormat, encode_batch  # noqa: E402
from tests.events.event_bugs import BuggyEvents  # noqa: E402

NUM_BLOCKS = 16


def batches(cache: Any, steps: int = 120) -> list[list[KVEvent]]:
    rng = random.Random(0)
    out: list[list[KVEvent]] = []
    live: list[str] = []
    for step in range(steps):
        if rng.random() < 0.6:
            tokens = [rng.choice((1, 2, 3)) for _ in range(rng.randrange(4, 14))]
            try:
                adm = cache.admit(Request(f"s{step}", tokens, Namespace("m@1")), len(tokens))
            except Exception:  # OutOfBlocks: the pool is full this step
                pass
            else:
                cache.commit(f"s{step}", adm.num_scheduled_tokens, [1])
                live.append(f"s{step}")
        elif live:
            cache.free([live.pop(rng.randrange(len(live)))])
        events = cache.take_events()
        if events:
            out.append(events)
    return out


ERR: list[str] = []


def audit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["audit-events", *argv, "--json"])
    captured = capsys.readouterr()
    ERR[:] = [captured.err]
    return code, json.loads(captured.out)


def publish_later(pub: EventPublisher, stream: list[list[KVEvent]]) -> threading.Thread:
    """A third of the stream now, before the auditor joins, the rest once it has."""
    early = len(stream) // 3
    for events in stream[:early]:
        pub.publish(events)

    def run() -> None:
        time.sleep(0.5)  # let the auditor subscribe; what it missed comes by replay
        for events in stream[early:]:
            pub.publish(events)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_a_clean_publisher_passes(
    fmt: WireFormat, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stream = batches(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True))
    pub = EventPublisher(wire_format=fmt)
    try:
        thread = publish_later(pub, stream)
        path = tmp_path / "audit.json"
        code, report = audit(
            [pub.endpoint, "--replay", pub.replay_endpoint, "--topic", "kv-events",
             "--max-batches", str(len(stream)), "--duration", "30",
             "--num-blocks", str(NUM_BLOCKS), "--report", str(path)],
            capsys,
        )  # fmt: skip
        thread.join()
    finally:
        pub.close()
    assert code == 0 and report["ok"], report["violations"]
    assert report["batches"] == len(stream) and report["last_seq"] == len(stream) - 1
    # It joined late: the batches sent before came by replay, so nothing is unverified.
    assert report["replays"] >= 1 and report["replayed_batches"] >= len(stream) // 3
    assert report["joined_at"] is None and report["unverified_since"] is None
    assert json.loads(path.read_text())["violations_by_check"] == report["violations_by_check"]


def test_a_buggy_publisher_exits_1_naming_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    cache = BuggyEvents(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), "duplicate_store")
    stream = batches(cache)
    pub = EventPublisher()
    try:
        thread = publish_later(pub, stream)
        code, report = audit(
            [pub.endpoint, "--replay", pub.replay_endpoint, "--max-batches", str(len(stream)),
             "--duration", "30"],
            capsys,
        )  # fmt: skip
        thread.join()
    finally:
        pub.close()
    assert code == 1 and not report["ok"]
    assert {k for k, n in report["violations_by_check"].items() if n} == {"single-store"}
    assert "invariants broken: single-store" in ERR[0]


def _raw_stream(endpoint: str, payloads: dict[int, bytes], stop: threading.Event) -> None:
    """Batch 0 until the auditor has surely joined, then the rest: batch 1 is never sent."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    try:
        for _ in range(10):  # the auditor skips the repeats as duplicates
            sock.send_multipart([b"kv", (0).to_bytes(8, "big"), payloads[0]])
            time.sleep(0.05)
        for seq in sorted(payloads)[1:]:
            sock.send_multipart([b"kv", seq.to_bytes(8, "big"), payloads[seq]])
        stop.wait(30)
    finally:
        sock.close()


@pytest.mark.parametrize("replay", [False, True])
def test_a_gap_without_replay_is_reported(replay: bool, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)  # a replay endpoint that never answers
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    probe = ctx.socket(zmq.PUB)
    pub_port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close()
    endpoint = f"tcp://127.0.0.1:{pub_port}"
    stored = BlockStored((7,), None, (1, 2), 2, "m@1", None, None, ((),))
    payloads = {0: encode_batch([AllBlocksCleared()]), 2: encode_batch([stored])}
    stop = threading.Event()
    thread = threading.Thread(target=_raw_stream, args=(endpoint, payloads, stop), daemon=True)
    time.sleep(0.1)  # the probe's port is free again
    thread.start()
    try:
        extra = ["--replay", f"tcp://127.0.0.1:{port}", "--replay-timeout", "0.2"] if replay else []
        code, report = audit([endpoint, "--max-batches", "2", "--duration", "20", *extra], capsys)
    finally:
        stop.set()
        thread.join()
        router.close()
    assert code == 1
    assert {k for k, n in report["violations_by_check"].items() if n} == {"no-gap"}
    why = "no replay within 0.2 s" if replay else "no replay endpoint given"
    assert report["violations"][0]["message"] == f"batches 1..1 lost: {why}"
    assert report["batches"] == 2 and report["unverified_since"] == 2


def test_silence_ends_at_the_duration(capsys: pytest.CaptureFixture[str]) -> None:
    ctx = zmq.Context.instance()
    probe = ctx.socket(zmq.PUB)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close()
    code, report = audit([f"tcp://127.0.0.1:{port}", "--duration", "0.3"], capsys)
    assert code == 0 and report["batches"] == 0


def test_an_unbounded_audit_without_a_terminal_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report = audit(["tcp://127.0.0.1:5557"], capsys)
    assert code == 1 and "--duration or --max-batches" in report["error"]


def test_a_bad_endpoint_is_a_typed_failure(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = audit(["not-an-endpoint", "--duration", "0.1"], capsys)
    assert code == 1 and "cannot subscribe to not-an-endpoint" in report["error"]


# --- vLLM's own publisher, where a wheel is named ----------------------------------------------


def _vllm_recorder(fmt: WireFormat) -> Any:
    """The corpus script's recorder over vLLM's own code, from the wheel the env names."""
    import importlib.util
    import os

    wheel = os.environ.get("PREFIXKV_VLLM_WHEEL_" + fmt.name[5:].replace("_", ""))
    if not wheel:
        pytest.skip("no vLLM wheel named (PREFIXKV_VLLM_WHEEL_033 / _020)")
    script = Path(__file__).parents[2] / "scripts" / "vllm_kv_events_corpus.py"
    spec = importlib.util.spec_from_file_location("vllm_kv_events_corpus", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.Recorder(*mod.load_vllm(Path(wheel)))


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("seeded", [False, True])
def test_vllm_own_publisher_live(
    fmt: WireFormat, seeded: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    mod, rec = _vllm_recorder(fmt)
    steps = [s["vllm"] for s in rec.steps()]
    if seeded:  # every BlockStored sent twice, by vLLM's own structs and publisher
        steps = [[x for e in s for x in ([e, e] if type(e).__name__ == "BlockStored" else [e])]
                 for s in steps]  # fmt: skip
    port, replay_port = mod._free_port(), mod._free_port()
    pub = rec.ev.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{port}",
        replay_endpoint=f"tcp://*:{replay_port}",
        topic="kv-events",
    )
    early = len(steps) // 3
    for i, events in enumerate(steps[:early]):  # before the auditor joins: replayed
        pub.publish(rec.ev.KVEventBatch(ts=1000.0 + i, events=events))

    def rest() -> None:
        time.sleep(0.5)
        for i, events in enumerate(steps[early:], early):
            pub.publish(rec.ev.KVEventBatch(ts=1000.0 + i, events=events))

    thread = threading.Thread(target=rest, daemon=True)
    thread.start()
    try:
        code, report = audit(
            [f"tcp://127.0.0.1:{port}", "--replay", f"tcp://127.0.0.1:{replay_port}",
             "--max-batches", str(len(steps)), "--duration", "30"],
            capsys,
        )  # fmt: skip
        thread.join()
    finally:
        pub.shutdown()
    print(f"vLLM {rec.version}: {report['batches']} batches, {report['replayed_batches']} "
          f"replayed, violations {report['violations_by_check']}")  # fmt: skip
    assert report["batches"] == len(steps) and report["replayed_batches"] >= early
    if seeded:
        assert code == 1
        assert {k for k, n in report["violations_by_check"].items() if n} == {"single-store"}
        assert {v["cause"] for v in report["violations"]} == {"repeated"}
    else:
        assert code == 0 and report["ok"], report["violations"]
