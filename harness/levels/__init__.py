"""The built-in parity levels, one module each, registered in suite order
(:mod:`harness.model.levels` loads this package on its first use; the order of
the imports below is the order items are planned, run and reported in).

A level module builds its :class:`~harness.model.levels.LevelSpec` (what it
compares, how its items are planned, asked, judged, stored in a row, shown by
``parity diff`` and read by the drift report) and registers it; nothing
outside it names the level's kinds. The comparisons themselves build on the
shared steps of :mod:`harness.sides` (both sides under one time limit, typed
answers, bits judged), so every level's verdicts follow the same rules.
"""

from harness.levels import layout, merge, prefill, sparse_layout, sparse_mask, sparse_prefill

__all__ = ["layout", "merge", "prefill", "sparse_layout", "sparse_mask", "sparse_prefill"]
