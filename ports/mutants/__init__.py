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
"""

from __future__ import annotations

from ports.mutants.catalogue import MUTANTS, Mutant

__all__ = ["MUTANTS", "Mutant"]
