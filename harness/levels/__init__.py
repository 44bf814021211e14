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

# Each import registers its level; the order is the suite order.
from harness.levels import layout as layout
from harness.levels import merge as merge
from harness.levels import prefill as prefill
from harness.levels import sparse_layout as sparse_layout
from harness.levels import sparse_mask as sparse_mask
from harness.levels import sparse_prefill as sparse_prefill

# Set last: the registry loads plug-in modules only once every built-in level is in.
LOADED = True
