"""The span model's invariants as formulas: SPAN-LIMIT, SPAN-CHUNK, SPAN-MATCH and
SPAN-SHAPE over one sequence's state (the module doc of :mod:`.model` states each)."""

from __future__ import annotations

import z3

from ..small import all_of
from ..terms import Term
from .model import SpanBase, SpanState

__all__ = ["SpanFormulas"]


class SpanFormulas(SpanBase):
    """The invariants of one sequence's state."""

    def invariants(self, x: SpanState) -> dict[str, Term]:
        prefilling = z3.And(x.R <= x.P, x.C < x.P)
        return {
            "SPAN-LIMIT": z3.Implies(
                z3.And(x.live, prefilling), z3.Not(self.inside(x.on, x.st, x.en, x.R))
            ),
            "SPAN-CHUNK": z3.Implies(
                z3.And(x.live, x.C < x.P, x.L > 0), z3.If(x.R < x.P, x.R, x.P) - x.C <= x.L
            ),
            "SPAN-MATCH": z3.Implies(x.live, z3.Not(self.inside(x.on, x.st, x.en, x.Ca))),
            "SPAN-SHAPE": z3.And(
                self.BS >= 1,
                z3.Implies(
                    x.live,
                    z3.And(
                        self.wf_request(x.P, x.L, x.on, x.st, x.en),
                        x.Ca >= 0,
                        x.Ca <= x.C,
                        x.C <= x.R,
                        x.C <= x.T,
                        x.P <= x.T,
                    ),
                ),
            ),
        }

    def inv(self, x: SpanState) -> Term:
        return all_of(list(self.invariants(x).values()))
