"""``prefixkv prove``: prove the cache's invariants with Z3 and print one row per obligation.

Exit status: 0 when every obligation is proved (and, when asked for, every broken variant
yields a counterexample and the drift check finds no drift); 1 otherwise; 2 on bad usage.
The work is :func:`prefixkv.proofs.run.run`; this module parses flags and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import attrs

from prefixkv.proofs.driver import DriftError
from prefixkv.proofs.kv.model import Bounds
from prefixkv.proofs.kv.obligations import DEFAULT_RLIMIT
from prefixkv.proofs.run import InvalidSelection, ProveOptions, run

from .support import int_in

__all__ = ["add_arguments", "setup"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the proof command's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--seqs",
        type=int_in(2, 16),
        default=Bounds.seqs,
        help="live sequence slots of the model (default %(default)s)",
    )
    parser.add_argument(
        "--table",
        type=int_in(1, 64),
        default=Bounds.table,
        help="blocks per block table in the model (default %(default)s)",
    )
    parser.add_argument(
        "--rlimit",
        type=int_in(1, 2**32 - 1),
        default=DEFAULT_RLIMIT,
        help="Z3 resource limit per solver call (default %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int_in(0, 2**32 - 1), default=0, help="Z3 random seed (default 0)"
    )
    parser.add_argument(
        "--invariants",
        default=None,
        help="comma-separated invariant ids to prove (default: all)",
    )
    parser.add_argument(
        "--operations",
        default=None,
        help="comma-separated operations to prove (default: all)",
    )
    parser.add_argument(
        "--no-kernels", action="store_true", help="skip the kernel index-arithmetic proofs"
    )
    parser.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="skip the INV-CKPT checkpoint-lifecycle proofs",
    )
    parser.add_argument(
        "--no-spans",
        action="store_true",
        help="skip the multimodal-span proofs (INV-LIMIT/INV-MATCH with spans)",
    )
    parser.add_argument(
        "--no-joint",
        action="store_true",
        help="skip the joint KV + checkpoint model (restore safety, routed experts)",
    )
    parser.add_argument(
        "--no-witnesses", action="store_true", help="skip the non-vacuity (satisfiability) checks"
    )
    parser.add_argument(
        "--broken",
        action="store_true",
        help="also check that every deliberately broken variant fails",
    )
    parser.add_argument(
        "--drift",
        type=int_in(0, 100_000),
        default=0,
        metavar="N",
        help="also run N model-vs-spec drift checks and the seeded drifts",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="also report which invariants are not inductive on their own",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print counterexamples and non-vacuity witnesses",
    )


def setup(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Add the ``prove`` flags to ``parser``; returns the runner."""
    add_arguments(parser)

    def prove(args: argparse.Namespace) -> int:
        for flag in ("invariants", "operations"):
            value = getattr(args, flag)
            # NOTE: an empty list is not "all": a script that builds the list and gets
            # none would otherwise prove everything and report success for what it asked.
            if value is not None and not any(part.strip() for part in value.split(",")):
                parser.error(f"--{flag} names none (omit --{flag} for all)")
            setattr(args, flag, value or "")
        fields = attrs.fields_dict(ProveOptions)
        opts = ProveOptions(**{k: v for k, v in vars(args).items() if k in fields})
        out = sys.stdout

        def emit(line: str) -> None:
            print(line, file=out, flush=True)

        try:
            report = run(opts, None if args.json else emit)
        except InvalidSelection as e:
            parser.error(str(e))
        except DriftError as e:
            print(f"drift between the model and the spec:\n{e}", file=sys.stderr)
            return 1
        if args.json:
            json.dump(report.doc, out, indent=2)
            out.write("\n")
        else:
            print(f"\n{'ALL PROVED' if report.ok else 'FAILED'} in {report.seconds:.1f}s", file=out)
        return 0 if report.ok else 1

    return prove
