"""The parity levels and the kinds of item compared at them: the one list of
each (SPEC section 3). Everything that names a level or a kind (the runners,
the port protocol and the external one, the served oracle's hello, the
reproduce lines, the command line's choices) takes it from here.

Invariants: :data:`LEVELS` is in suite order (the order items are planned and
reported in); every :class:`Kind` has its level in :data:`KIND_LEVELS`; the
members are ``str`` (StrEnum), so rows, JSON and tables hold their plain text.
"""

from __future__ import annotations

from enum import StrEnum


class TextEnum(StrEnum):
    """A StrEnum that shows as its text everywhere, ``repr`` included (argparse's
    "choose from" and ``{kind!r}`` in messages print what a user types)."""

    def __repr__(self) -> str:
        return repr(self.value)


class Level(TextEnum):
    """A parity level (SPEC section 3)."""

    LAYOUT = "layout"
    MERGE = "merge"
    PREFILL = "prefill"
    SPARSE_LAYOUT = "sparse-layout"
    SPARSE_MASK = "sparse-mask"
    SPARSE_PREFILL = "sparse-prefill"


class Kind(TextEnum):
    """What an item is: a level's items, and the workspace sizes compared at
    the layout levels; the closed set every row's ``kind`` is one of."""

    LAYOUT = "layout"
    WORKSPACE = "workspace"
    MERGE = "merge"
    PREFILL = "prefill"
    SPARSE_LAYOUT = "sparse-layout"
    SPARSE_WORKSPACE = "sparse-workspace"
    SPARSE_MASK = "sparse-mask"
    SPARSE_PREFILL = "sparse-prefill"


# Every level, in suite order.
LEVELS: tuple[Level, ...] = tuple(Level)
# Every kind, in suite order, and the level it is compared at.
KINDS: tuple[Kind, ...] = tuple(Kind)
KIND_LEVELS: dict[Kind, Level] = {
    Kind.LAYOUT: Level.LAYOUT,
    Kind.WORKSPACE: Level.LAYOUT,
    Kind.MERGE: Level.MERGE,
    Kind.PREFILL: Level.PREFILL,
    Kind.SPARSE_LAYOUT: Level.SPARSE_LAYOUT,
    Kind.SPARSE_WORKSPACE: Level.SPARSE_LAYOUT,
    Kind.SPARSE_MASK: Level.SPARSE_MASK,
    Kind.SPARSE_PREFILL: Level.SPARSE_PREFILL,
}
# The levels whose items are host work (layouts and workspace sizes): a run of
# these alone never loads torch (harness.engine.device.select_host). Every other
# level, one added later included, compares tensors.
HOST_LEVELS: tuple[Level, ...] = (Level.LAYOUT, Level.SPARSE_LAYOUT)
# The levels whose answers are floats, judged bit for bit and measured in ULPs.
FLOAT_LEVELS: tuple[Level, ...] = (Level.MERGE, Level.PREFILL, Level.SPARSE_PREFILL)
# The kinds of the host levels (answers are layouts and sizes) and of the others
# (their inputs are tensors the harness materialises).
HOST_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if KIND_LEVELS[k] in HOST_LEVELS)
TENSOR_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if KIND_LEVELS[k] not in HOST_LEVELS)
# The kinds of the sparse path (SPEC 1d).
SPARSE_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k.startswith("sparse-"))
