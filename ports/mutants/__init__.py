"""Seeded mutant ports: per_request with one realistic bug each.

A gate is only as good as the bugs it catches. Each mutant here is the
per_request port with exactly one fault injected, the way a hand port of
b38e111d3e could get it wrong; ``parity mutants`` runs them all and reports
which parity level catches each (the kill matrix). A mutant the suites do not
kill is a hole in the suites, not in the mutant.

Mutants inject their fault by swapping one function of the per_request port
for the duration of a call (:class:`Mutant`, in :mod:`ports.mutants.base`), or
by rewriting one field of its output, so the rest of each mutant is the real
port. Each family of mutants is a module, each mutant beside its description:

* :mod:`~ports.mutants.planning`: where the planner cuts chunks and requests,
  DCP padding, the workspace size;
* :mod:`~ports.mutants.metadata`: one wrong field of a planned chunk;
* :mod:`~ports.mutants.merging`: how the context loop combines partials;
* :mod:`~ports.mutants.integer_widths`: a value stored in an integer too narrow
  for it (int8/uint8/int16/int32);
* :mod:`~ports.mutants.powers_of_two`: arithmetic right only for powers of two
  (block sizes such as 528, DCP worlds of 3 or 6);
* :mod:`~ports.mutants.merge_numerics`: the merge's numerics (a weight of
  exactly 0, the LSE gap band where the weaker side is partly visible,
  transposed LSE views, no token with context);
* :mod:`~ports.mutants.three_pieces`: requests in three or more pieces;
* :mod:`~ports.mutants.dcp_steps`: the rows of a chunk's DCP step;
* :mod:`~ports.mutants.sparse`: the sparse path;
* :mod:`~ports.mutants.conditions`: one per condition of the declared planner
  decisions (MC/DC, harness/search/decisions_*.py), each killed by its
  condition's independence pair on ci.

:mod:`ports.mutants.catalogue` puts the dense families in report order. A mutant
aimed at an input class a suite must produce names that class and the level that
sees it in ``aimed_at``; ``tests/test_mutants.py`` holds one small item of each
such class on which per_request is exact and the mutant is not.
"""

from __future__ import annotations

from ports.mutants.base import Mutant
from ports.mutants.catalogue import DENSE_MUTANTS
from ports.mutants.conditions import CONDITION_MUTANTS
from ports.mutants.reach import ReachProbe, fault_probe
from ports.mutants.sparse import SPARSE_MUTANTS

# Every mutant by name: the dense path's (catalogue), the sparse path's, then one
# per condition of the declared decisions (ports/mutants/conditions.py).
MUTANTS: dict[str, type[Mutant]] = {
    **DENSE_MUTANTS,
    **{m.name: m for m in SPARSE_MUTANTS},
    **{m.name: m for m in CONDITION_MUTANTS},
}

__all__ = ["MUTANTS", "Mutant", "ReachProbe", "fault_probe"]
