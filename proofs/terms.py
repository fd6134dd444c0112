"""The names of Z3 terms, written once for every model.

NOTE: z3-solver ships no type information, so to mypy every z3 object is ``Any``, and no
annotation here can make it more. Rather than spell ``Any`` wherever a formula flows, the
proofs say what a value is: a :data:`BoolTerm` (a formula), an :data:`IntTerm` (an integer
term), a :data:`Term` (either, or an array), an :data:`Evaluator` (a solver model's
evaluation function). Z3 itself checks sorts when a formula is built; if typed stubs for z3
appear, this is the one module to point at them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

__all__ = ["BoolTerm", "Evaluator", "IntTerm", "Term"]

Term: TypeAlias = Any  # z3.ExprRef
BoolTerm: TypeAlias = Any  # z3.BoolRef
IntTerm: TypeAlias = Any  # z3.ArithRef
Evaluator: TypeAlias = Callable[[Term], Term]
"""``lambda t: model.eval(t, model_completion=True)``: reads a term's value in a model."""
