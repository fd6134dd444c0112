"""Example block managers written the way engines write theirs, each with an adapter factory
for the conformance kit and classic bugs as subclasses (``BUGS``). They share no code with
prefixkv's caches; their tests live in ``tests/conformance/``."""
