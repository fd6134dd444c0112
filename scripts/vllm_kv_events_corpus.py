"""Record a corpus of KV-event messages produced by vLLM's own code, for prefixkv's tests.

Usage::

    pip download --no-deps vllm==0.33.0 -d wheels/
    python scripts/vllm_kv_events_corpus.py wheels/vllm-0.33.0-*.whl

The wheel is never installed: this script reads two modules out of it,
``vllm/distributed/kv_events.py`` (the event structs and ``ZmqEventPublisher``) and
``vllm/v1/core/kv_cache_utils.py`` (``generate_block_hash_extra_keys``, which builds the
per-block ``extra_keys``), and runs them with every other ``vllm.*`` import replaced by an
inert stub (logging, configuration classes, tensor helpers, none of which these code paths
call). It then:

1. serves a few requests on a prefixkv ``SpecCache`` (salt ``None`` and set, a LoRA adapter,
   an image, all three together, a hybrid model's stream) and records prefixkv's events;
2. builds, for each of prefixkv's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``,
   the event that vLLM's block pool builds for the same request (same tokens, block hashes,
   adapter, salt and images), with vLLM's own extra-key code and structs, field by field as
   ``BlockPool.cache_full_blocks`` / ``_emit_block_removed_events`` / ``reset_prefix_cache``
   do in that release, plus one event of a second KV cache group (a hybrid model);
3. publishes them through vLLM's ``ZmqEventPublisher`` over loopback, one batch per step,
   and records every frame a subscriber receives, then every frame of a replay from 0;
4. records the event structs' layout (msgspec config, fields, defaults) as vLLM defines them.

The corpus is written to ``tests/events/data/vllm-<version>.json``. Nothing from vLLM's
source goes into it: only messages its code produced, and the names of its fields.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import logging
import socket
import sys
import time
import types
import zipfile
from pathlib import Path
from typing import Any

import msgspec
import zmq
from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MultimodalSpan,
    Namespace,
    Request,
    SpecCache,
)

from prefixkv.events.wire import mm_identifier, salt_key

REAL = ("vllm.distributed.kv_events", "vllm.v1.core.kv_cache_utils")
TOPIC = "kv-events"
BLOCK_SIZE = 4
OUT = Path(__file__).resolve().parent.parent / "tests" / "events" / "data"


# --- loading two modules of the wheel, everything else of vLLM stubbed ---------------------


class _Stub:
    """Stands for any vLLM class these code paths import but never call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "init_logger":
            return logging.getLogger
        stub = type(name, (_Stub,), {})
        setattr(self, name, stub)
        return stub


class _WheelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self.wheel = wheel

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "vllm" and not name.startswith("vllm."):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=name not in REAL)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name) if spec.name in REAL else _StubModule(spec.name)
        if spec.name not in REAL:
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ in REAL:
            path = module.__name__.replace(".", "/") + ".py"
            code = compile(self.wheel.read(path), f"{self.wheel.filename}!{path}", "exec")
            exec(code, module.__dict__)


def load_vllm(wheel_path: Path) -> tuple[str, types.ModuleType, types.ModuleType]:
    wheel = zipfile.ZipFile(wheel_path)
    version_src = wheel.read("vllm/_version.py").decode()
    scope: dict[str, Any] = {}
    exec(compile(version_src, "vllm/_version.py", "exec"), scope)
    # Another wheel loaded before (tests load both releases) must not answer for this one.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_WheelFinder"]
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _WheelFinder(wheel))
    import vllm.distributed.kv_events as kv_events
    import vllm.v1.core.kv_cache_utils as kv_cache_utils

    return str(scope["__version__"]), kv_events, kv_cache_utils


# --- the requests, served by prefixkv ---------------------------------------------------------

MODEL = "tiny-llm@1"
IMAGE = MultimodalSpan(start=2, end=7, modality="image", content_hash=b"\x07" * 32)
SCENARIOS: list[tuple[str, Namespace, tuple[int, ...], tuple[MultimodalSpan, ...]]] = [
    ("salt-none", Namespace(MODEL), tuple(range(1, 10)), ()),
    ("salt-set", Namespace(MODEL, salt=b"tenant-7"), tuple(range(1, 10)), ()),
    ("salt-binary", Namespace(MODEL, salt=b"\xff\x00t"), tuple(range(1, 10)), ()),
    ("adapter", Namespace(MODEL, adapter="lora-a"), tuple(range(1, 10)), ()),
    ("image", Namespace(MODEL), (1, 2) + (99,) * 5 + (3, 4, 5), (IMAGE,)),
    (
        "adapter-salt-image",
        Namespace(MODEL, adapter="lora-a", salt=b"tenant-7"),
        (1, 2) + (99,) * 5 + (3, 4, 5),
        (IMAGE,),
    ),
]


def _lora(ns: Namespace) -> Any:
    if ns.adapter is None:
        return None
    return types.SimpleNamespace(
        lora_name=ns.adapter, name=ns.adapter, lora_path=f"/adapters/{ns.adapter}", adapter_id=1
    )


def _vllm_request(ns: Namespace, tokens: tuple[int, ...], spans: tuple[MultimodalSpan, ...]) -> Any:
    """What vLLM's block pool reads of a request: tokens, LoRA, salt, multimodal features."""
    features = [
        types.SimpleNamespace(
            identifier=mm_identifier(s.key()),
            mm_position=types.SimpleNamespace(offset=s.start, length=s.length),
        )
        for s in spans
    ]
    return types.SimpleNamespace(
        all_token_ids=list(tokens),
        lora_request=_lora(ns),
        # A salt that is not text has no vLLM counterpart: the request's salt is the text
        # prefixkv renders it as (salt_key), the one vLLM consumers will read.
        cache_salt=None if ns.salt is None else salt_key(ns.salt),
        mm_features=features,
        prompt_embeds=None,
        _prompt_embeds_per_block_hashes={},
        session_id=None,
    )


def _jsonable(event: Any) -> Any:
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "model": event.model,
            "adapter": event.adapter,
            "salt": None if event.salt is None else event.salt.hex(),
            "extra_keys": [[[off, c.hex()] for off, c in keys] for keys in event.extra_keys],
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes)}
    return {"type": type(event).__name__}


class Recorder:
    def __init__(self, version: str, kv_events: Any, kv_cache_utils: Any) -> None:
        self.version = version
        self.ev = kv_events
        self.utils = kv_cache_utils
        self.new = tuple(int(p) for p in version.split(".")[:2]) >= (0, 33)

    def extra_keys(self, request: Any, start_block: int, n: int) -> Any:
        keys_list: list[Any] = []
        mm_idx = 0
        for i in range(start_block, start_block + n):
            keys, mm_idx = self.utils.generate_block_hash_extra_keys(
                request, i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE, mm_idx
            )
            keys_list.append(keys)
        if self.new:
            return self.utils.to_event_extra_keys(keys_list)
        return keys_list if keys_list else None

    def stored(self, event: BlockStored, request: Any, start_block: int, group: int = 0) -> Any:
        lora = request.lora_request
        fields: dict[str, Any] = {
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": request.all_token_ids[
                start_block * BLOCK_SIZE : (start_block + len(event.block_hashes)) * BLOCK_SIZE
            ],
            "block_size": BLOCK_SIZE,
            "lora_id": lora.adapter_id if lora else None,
            "medium": self.ev.MEDIUM_GPU,
            "lora_name": lora.name if lora else None,
            "extra_keys": self.extra_keys(request, start_block, len(event.block_hashes)),
            "group_idx": group,
        }
        if self.new:
            fields["session_id"] = request.session_id
            fields["lookahead_token_ids"] = None
        return self.ev.BlockStored(**fields)

    def removed(self, event: BlockRemoved) -> list[Any]:
        return [
            self.ev.BlockRemoved(block_hashes=[h], medium=self.ev.MEDIUM_GPU, group_idx=0)
            for h in event.block_hashes
        ]

    def steps(self) -> list[dict[str, Any]]:
        """Each step: a name, prefixkv's events and vLLM's events for the same operation."""
        out: list[dict[str, Any]] = []
        for name, ns, tokens, spans in SCENARIOS:
            cache = SpecCache(num_blocks=16, block_size=BLOCK_SIZE, record_events=True)
            adm = cache.admit(Request("r", tokens, ns, spans=spans), len(tokens))
            cache.commit("r", adm.num_scheduled_tokens, ())
            mine = cache.take_events()
            request = _vllm_request(ns, tokens, spans)
            theirs: list[Any] = []
            block = 0
            for e in mine:
                assert isinstance(e, BlockStored)
                theirs.append(self.stored(e, request, block))
                block += len(e.block_hashes)
            out.append({"name": f"store/{name}", "prefixkv": mine, "vllm": theirs})
            if name == "adapter-salt-image":
                # A hybrid model: vLLM publishes each KV cache group's blocks apart, under
                # group_idx (here the same blocks in a second group).
                hybrid = [self.stored(e, request, i, group=1) for i, e in enumerate(mine)]
                out.append({"name": "store/hybrid-group-1", "prefixkv": None, "vllm": hybrid})
            cache.free(["r"])
            cache.evict(1)
            mine = cache.take_events()
            theirs = [r for e in mine if isinstance(e, BlockRemoved) for r in self.removed(e)]
            out.append({"name": f"evict/{name}", "prefixkv": mine, "vllm": theirs})
            cache.reset(preserve_cache=False)
            mine = cache.take_events()
            assert mine == [AllBlocksCleared()]
            out.append(
                {"name": f"clear/{name}", "prefixkv": mine, "vllm": [self.ev.AllBlocksCleared()]}
            )
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def publish(rec: Recorder, steps: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """vLLM's ZmqEventPublisher sends the steps; returns the PUB and the replay frames."""
    port, replay_port = _free_port(), _free_port()
    pub = rec.ev.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{port}",
        replay_endpoint=f"tcp://*:{replay_port}",
        topic=TOPIC,
    )
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)  # the slow joiner: the replay below checks nothing was lost anyway
    for i, step in enumerate(steps):
        pub.publish(rec.ev.KVEventBatch(ts=1000.0 + i, events=step["vllm"]))
    frames: list[Any] = []
    while len(frames) < len(steps) and sub.poll(5000):
        frames.append(sub.recv_multipart())
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replay: list[Any] = []
    while dealer.poll(5000):
        reply = dealer.recv_multipart()
        replay.append(reply)
        if reply[-2] == (-1).to_bytes(8, "big", signed=True):
            break
    pub.shutdown()
    sub.close(0)
    dealer.close(0)
    if len(frames) != len(steps) or len(replay) != len(steps) + 1:
        raise SystemExit(f"lost messages: {len(frames)} published, {len(replay)} replayed")
    return frames, replay


def layout(rec: Recorder) -> dict[str, Any]:
    """The msgspec layout of vLLM's event structs, read off the classes."""
    out: dict[str, Any] = {}
    for cls in (
        rec.ev.EventBatch,
        rec.ev.BlockStored,
        rec.ev.BlockRemoved,
        rec.ev.AllBlocksCleared,
    ):
        cfg = cls.__struct_config__
        fields = msgspec.structs.fields(cls)
        out[cls.__name__] = {
            "array_like": cfg.array_like,
            "omit_defaults": cfg.omit_defaults,
            "tag_field": cfg.tag_field,
            "tag": cfg.tag,
            "forbid_unknown_fields": cfg.forbid_unknown_fields,
            "fields": [
                {
                    "name": f.encode_name,
                    "required": f.required,
                    "default": None if f.required else f.default,
                }
                for f in fields
            ],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a vllm wheel (pip download --no-deps)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    version, kv_events, kv_cache_utils = load_vllm(args.wheel)
    rec = Recorder(version, kv_events, kv_cache_utils)
    steps = rec.steps()
    frames, replay = publish(rec, steps)
    corpus = {
        "vllm_version": version,
        "wheel": args.wheel.name,
        "made_by": "scripts/vllm_kv_events_corpus.py",
        "topic": TOPIC,
        "block_size": BLOCK_SIZE,
        "layout": layout(rec),
        "steps": [
            {
                "name": s["name"],
                "prefixkv": None
                if s["prefixkv"] is None
                else [_jsonable(e) for e in s["prefixkv"]],
                "frames": [f.hex() for f in frames[i]],
            }
            for i, s in enumerate(steps)
        ],
        "replay": [[f.hex() for f in r] for r in replay],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"vllm-{version}.json"
    path.write_text(json.dumps(corpus, indent=1) + "\n")
    print(f"{path}: {len(steps)} batches from vLLM {version}")


if __name__ == "__main__":
    main()
