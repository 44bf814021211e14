"""Seeded mutant ports: per_request with one realistic bug each.

A gate is only as good as the bugs it catches. Each mutant here is the
per_request port with exactly one fault injected, the way a hand port of
b38e111d3e could get it wrong; ``parity mutants`` runs them all and reports
which parity level catches each (the kill matrix). A mutant the suites do not
kill is a hole in the suites, not in the mutant.

Mutants inject their fault by swapping one function of the per_request port
for the duration of a call (:class:`Mutant`), or by rewriting one field of its
output, so the rest of each mutant is the real port. One mutant,
``equal-share-no-neutralise``, is the legacy equal_share port instead, with its
neutralisation of rows without keys swapped out (seeds/003): its grid diverges
from the oracle anyway, so the kill that counts for it is an L3 item on which
equal_share itself is bit-exact (see its docstring).

The mutants of issue 12 are each aimed at an input class a suite must produce:
integer widths (a value stored in int8/uint8/int16/int32 wraps past it),
arithmetic right only for powers of two (block sizes such as 528, DCP worlds
of 3 or 6), merge numerics (a weight of exactly 0, the LSE gap band where the
weaker side is partly visible, transposed LSE views, no token with context)
and requests in three or more pieces. Each names its class and the level that
sees it in ``aimed_at``; ``tests/test_mutants.py`` holds one small item of each
class on which per_request is exact and the mutant is not.
"""

from __future__ import annotations

from ports.mutants.catalogue import DENSE_MUTANTS, Mutant
from ports.mutants.reach import ReachProbe, fault_probe
from ports.mutants.sparse import SPARSE_MUTANTS

# Every mutant by name: the dense path's (catalogue), then the sparse path's.
MUTANTS: dict[str, type[Mutant]] = {**DENSE_MUTANTS, **{m.name: m for m in SPARSE_MUTANTS}}

__all__ = ["MUTANTS", "Mutant", "ReachProbe", "fault_probe"]
