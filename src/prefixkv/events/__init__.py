"""KV events off the process: vLLM's wire format, a ZeroMQ transport, and Dynamo's router.

An optional part of prefixkv (``pip install prefixkv[events]`` for the wire format and the
transport, ``prefixkv[router]`` for Dynamo's router index). The spec never imports it: the
events themselves, and the consumer-side mirror that INV-EVENTS is stated with, live in
:mod:`prefixkv.spec.events` and :mod:`prefixkv.spec.event_mirror`.

* :mod:`prefixkv.events.wire`: vLLM's ``EventBatch`` of ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared``, msgpack via ``msgspec``, in the shapes of vLLM 0.33 (tagged maps, the
  default) and vLLM 0.20 (tagged arrays), and the conversion both ways;
* :mod:`prefixkv.events.transport`: a ZeroMQ publisher (PUB with a topic and sequence
  numbers, plus a replay endpoint) and a subscriber that detects gaps and replays;
* :mod:`prefixkv.events.dynamo`: the translation into Dynamo's router events and the
  router-side hashes of a request;
* :mod:`prefixkv.events.dynamo_zmq`: Dynamo's own ZMQ consumer (``python -m dynamo.indexer``)
  as a subprocess, subscribed to prefixkv's publishers, and its answers;
* :mod:`prefixkv.events.audit`: the checks of ``prefixkv audit-events`` over any engine's
  stream (vLLM's, SGLang's, prefixkv's; both event shapes), without sockets;
* :mod:`prefixkv.events.router`: a KV-aware router's per-replica index (Dynamo's
  ``RadixTree`` or prefixkv's mirror) and its placement policies;
* :mod:`prefixkv.events.replicas` and :mod:`prefixkv.events.cluster`: engine replicas as
  processes publishing their events, served behind that router (``serve-sim --replicas``).
"""
