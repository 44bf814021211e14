"""The parity levels: the one registry of them (SPEC section 3), and the
protocol a level implements to be in it.

A level is one module. It builds a :class:`LevelSpec` (its name, the kinds of
item it compares, the port methods that enable it, and, per kind, how the
items are planned from a suite, how both sides are asked and compared, what
a row holds) and hands it to :func:`register_level`, as a pytest plugin hands
its hooks to the plugin manager. Everything that names a level or a kind (the
planner, the runners' dispatch, the port protocol and the external one, the
served oracle's hello, the reproduce lines, the command line's choices, the
summary's and the night's tables) reads this registry; nothing else lists them.

The built-in levels live in :mod:`harness.levels` and are loaded on the first
question asked of the registry, by module name (as pytest loads its default
plugins), so this module, the lowest layer, imports none of them. A level
from elsewhere (a test's, a team's) is registered by importing its module,
or by naming the module in ``PARITY_PLUGINS`` (comma-separated module
paths, as ``PYTEST_PLUGINS``; a plug-in module may declare case fields too:
:mod:`harness.model.case_fields`): every process the harness starts (``--jobs``
workers, DCP ranks, a reproduce line in a fresh shell) loads those too.

Invariants: levels are in registration order, which is suite order (the order
items are planned, run and reported in: the built-ins' first, so their items
keep their indices); each kind belongs to exactly one level; a level's name
and its kinds' names are unique across the registry; the views below
(:data:`LEVELS`, :data:`KINDS` ...) are read afresh on every use, so a level
registered later is in them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, overload


class TextEnum(StrEnum):
    """A StrEnum that shows as its text everywhere, ``repr`` included (argparse's
    "choose from" and ``{kind!r}`` in messages print what a user types)."""

    def __repr__(self) -> str:
        return repr(self.value)


class Level(TextEnum):
    """The built-in levels' names (each is registered by its module in
    :mod:`harness.levels`; a plug-in level's name is plain text)."""

    LAYOUT = "layout"
    MERGE = "merge"
    PREFILL = "prefill"
    SPARSE_LAYOUT = "sparse-layout"
    SPARSE_MASK = "sparse-mask"
    SPARSE_PREFILL = "sparse-prefill"


class Kind(TextEnum):
    """The built-in kinds of item: each level's items, and the workspace sizes
    compared at the layout levels (a plug-in level's kinds are plain text)."""

    LAYOUT = "layout"
    WORKSPACE = "workspace"
    MERGE = "merge"
    PREFILL = "prefill"
    SPARSE_LAYOUT = "sparse-layout"
    SPARSE_WORKSPACE = "sparse-workspace"
    SPARSE_MASK = "sparse-mask"
    SPARSE_PREFILL = "sparse-prefill"


# -- the protocol ------------------------------------------------------------------------------
#
# The hooks take and return the upper layers' types (a Suite, an ItemCall, a
# CaseResult, a Port): this layer imports none of them, so they are typed Any
# here and precisely in each level's module.


@dataclass(frozen=True)
class KindSpec:
    """One kind of item a level compares.

    ``plan(suite)`` gives the suite's items of this kind in their fixed order;
    ``holds(item)`` says whether an item (a case loaded from a file, say) is one
    (``parity diff`` asks); ``run(call)`` compares one item on both sides and
    returns its ``CaseResult`` (:class:`harness.sides.runner.ItemCall` holds the
    sides, the item and how to run it), marking a side that raises its error
    and never raising for a port's fault; ``row(result)`` gives the columns a
    row of this kind adds to the common ones; ``cost_s`` is the estimated
    seconds of one item, for sizing ``--jobs`` work; ``inputs(item, device)``
    materialises the tensors both sides are handed (None: host work);
    ``release_asked(release, item, kernels, device)`` asks a served release the
    same question, for the drift report (None: nothing to ask);
    ``drift(drift, result, pinned, release, item)`` fills a divergent or not-run
    item's drift row (what changed, and why); ``show(item, result, context)``
    is the text ``parity diff`` prints for one item (None: the common
    rendering of its divergence and tensors) and ``record(result)`` what its
    ``--json`` record adds (None: a float level's tensors); ``noun(item)``
    names such an item in a message ("a merge case"); ``caused_by`` is the
    kind of the same case whose divergence is the likely cause of this one's
    (a prefill's layout: it runs over the port's chunks), named first in the
    summary (and whose layout the port must have run it on, where it says);
    ``shrinks`` says ``parity shrink`` and the kill matrix can shrink a
    divergent item of it to a smaller case, in at most ``shrink_budget``
    evaluations when a gate shrinks it; ``real_ranks`` that its DCP items run
    on one process per rank when the run asks; ``count_key`` names its count
    in the summary's JSON (default ``<kind>_items``) and ``plural`` how its
    printed items line counts them (default ``<kind> items``); ``slim(result)`` is the
    result a worker sends when no report writes the answers in full (None:
    as it is); ``plan_figures`` says its rows' chunk figures are the plan it
    compared, which the summary's per-side chunk totals sum; ``strategy()``
    is the hypothesis strategy ``parity explore`` draws its items from (None:
    not explored), with ``explore_share`` of its level's time; ``explore_note()``
    what ``parity explore`` notes of that strategy (fields it leaves at their
    defaults), or None."""

    name: str
    plan: Callable[[Any], Iterable[Any]]
    run: Callable[[Any], Any]
    holds: Callable[[Any], bool]
    cost_s: float
    row: Callable[[Any], dict[str, Any]] = lambda result: {}
    inputs: Callable[[Any, str], Any] | None = None
    release_asked: Callable[[Any, Any, Any, str], Any] | None = None
    drift: Callable[[Any, Any, Any, Any, Any], None] | None = None
    show: Callable[[Any, Any, Any], str] | None = None
    record: Callable[[Any], dict[str, Any]] | None = None
    noun: Callable[[Any], str] = lambda item: "an item"
    caused_by: str | None = None
    shrinks: bool = False
    shrink_budget: int = 600
    real_ranks: bool = False
    count_key: str = ""
    plural: str = ""
    slim: Callable[[Any], Any] | None = None
    plan_figures: bool = False
    strategy: Callable[[], Any] | None = None
    explore_share: float = 1.0
    explore_note: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class CoverageHook:
    """What ``parity coverage`` measures of a level's items (:mod:`harness.search.coverage`).

    ``features()`` gives its features (:class:`harness.search.coverage_feature.Feature`;
    ids unique across levels, held to the targets file's rows as every
    feature is), ``refusals`` those of them that count inputs the oracle
    refused (any above zero fails the verdict), and ``measure(tally, suite,
    oracle)`` tallies them over the suite's items as the oracle planned,
    sized or materialised them, never as a port did. ``held``: each of its
    features needs a row in the targets file (the built-in levels'); a
    plug-in level, whose features the project's targets file cannot know,
    sets False, and a feature of it without a row is shown, not judged (its
    refusals are judged all the same)."""

    features: Callable[[], tuple[Any, ...]]
    measure: Callable[[Any, Any, Any], None]
    refusals: tuple[str, ...] = ()
    held: bool = True


@dataclass(frozen=True)
class LevelSpec:
    """A parity level: what a level module registers.

    ``port_methods`` are the methods that make a port implement it (all of
    them, callable); ``host`` says its answers are host values (layouts,
    sizes: a run of host levels alone never loads torch) and ``floats`` that
    they are floats, judged bit for bit and measured in ULPs; ``sparse`` puts
    it on the sparse path (SPEC 1d). ``external`` adapts each port method to
    the external protocol (``fn(external_port, *args)``: the request it sends
    and how its reply is read); a built-in level's methods are
    :class:`harness.protocol.external.ExternalPort`'s own. ``title`` is its
    one-line description in the docs' and the CLI's tables, ``heading`` its
    name in reports' tables. ``compares`` says what its items compare of a port
    that runs in the harness's process and ``compares_over_protocol`` of an
    external one (None: the same; the L3 levels differ: a ``cmd:`` port is
    sent the partials). ``transcribed`` says its oracle answers stand on the
    pin's transcription of upstream code (:data:`oracle.pin.TRANSCRIBED`), so
    the drift report names that code beside the level. ``served`` answers the
    external protocol's ops for this level in a served side (``python -m
    oracle.serve``, a release as the oracle): ``fn(side, request)`` calls the
    side's method and returns the reply's fields; a served oracle answers these
    ops, every level's, and no others (:func:`served_op`). ``coverage`` is
    what ``parity coverage`` measures of its items (None: nothing)."""

    name: str
    title: str
    kinds: tuple[KindSpec, ...]
    port_methods: tuple[str, ...]
    host: bool
    floats: bool
    sparse: bool = False
    external: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    heading: str = ""
    compares: str | None = None
    compares_over_protocol: str | None = None
    transcribed: bool = False
    served: Mapping[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    coverage: CoverageHook | None = None


# -- the registry ------------------------------------------------------------------------------

# The built-in levels' modules, in suite order: loaded by name on first use.
BUILTIN_LEVEL_MODULES = "harness.levels"
PLUGINS_VARIABLE = "PARITY_PLUGINS"

_levels: dict[str, LevelSpec] = {}
_kinds: dict[str, tuple[KindSpec, LevelSpec]] = {}
_loaded = False


class LevelRegistryError(ValueError):
    """A level that cannot be registered (a name taken, no kinds)."""


def register_level(spec: LevelSpec) -> LevelSpec:
    """Add ``spec`` after every level registered so far (the built-in ones
    first, whichever module registers first: their items keep their indices);
    registering the same spec again is a no-op (a module imported twice),
    another with a taken name an error. A level needs kinds with names of
    their own and at least one port method (a level no method enables would
    count every port as implementing it)."""
    load_plugins()
    known = _levels.get(spec.name)
    if known is spec:
        return spec
    if known is not None:
        raise LevelRegistryError(f"level {spec.name!r} is registered already")
    if not spec.kinds:
        raise LevelRegistryError(f"level {spec.name!r} has no kinds of item")
    if not spec.port_methods:
        raise LevelRegistryError(f"level {spec.name!r} names no port method (every port would implement it)")
    names = [k.name for k in spec.kinds]
    repeated = [name for i, name in enumerate(names) if name in names[:i]]
    if repeated:
        raise LevelRegistryError(f"level {spec.name!r}: kind {repeated[0]!r} is declared twice")
    taken = [name for name in names if name in _kinds]
    if taken:
        raise LevelRegistryError(f"level {spec.name!r}: kind {taken[0]!r} belongs to another level")
    keys = [count_key(k) for k in spec.kinds]
    clash = [key for i, key in enumerate(keys) if key in keys[:i] or key in {count_key(k) for k, _ in _kinds.values()}]
    bad = [key for key in keys if not key.endswith(COUNT_SUFFIXES)]
    if clash or bad:
        raise LevelRegistryError(
            f"level {spec.name!r}: count key {(clash or bad)[0]!r} is taken or does not end in "
            f"{' or '.join(COUNT_SUFFIXES)} (the summary's other keys are its own)"
        )
    ops = [op for other in _levels.values() for op in other.served]
    taken_ops = [op for op in spec.served if op in ops or op == "hello"]
    if taken_ops:
        raise LevelRegistryError(f"level {spec.name!r}: served op {taken_ops[0]!r} is another level's")
    _levels[spec.name] = spec
    for kind in spec.kinds:
        _kinds[kind.name] = (kind, spec)
    return spec


# A kind's count in the summary ends so (its other keys, verdict and items among them, are the summary's own).
COUNT_SUFFIXES = ("_cases", "_configs", "_items")


def count_key(kind: KindSpec) -> str:
    """The key of ``kind``'s count in the summary's JSON."""
    return kind.count_key or f"{kind.name.replace('-', '_')}_items"


def counted_as(kind: KindSpec) -> str:
    """How the printed summary counts ``kind``'s items ("layout cases")."""
    return kind.plural or f"{kind.name} items"


def unregister_level(name: str) -> None:
    """Take a level out again (a test's toy level, at the test's end)."""
    spec = _levels.pop(name, None)
    for kind in spec.kinds if spec else ():
        _kinds.pop(kind.name, None)


def load_plugins() -> None:
    """The built-in levels, then the plug-in modules ``PARITY_PLUGINS`` names,
    once. A module that cannot be imported is an error here and on every later
    question (never a registry quietly missing a level)."""
    global _loaded
    if _loaded:
        return
    # Set first: the modules imported here register, and registering asks for this.
    _loaded = True
    try:
        builtins = importlib.import_module(BUILTIN_LEVEL_MODULES)
        if not getattr(builtins, "LOADED", False):
            # Asked while the built-in levels are still being imported (one of their
            # modules imported first): the plug-ins wait until every one is in.
            _loaded = False
            return
        for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_VARIABLE, "").split(","))):
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise LevelRegistryError(
                    f"{PLUGINS_VARIABLE}: cannot import plug-in module {module!r} ({exc})"
                ) from None
    except BaseException:
        _loaded = False
        raise


def registered_levels() -> tuple[LevelSpec, ...]:
    """Every level, in suite order."""
    load_plugins()
    return tuple(_levels.values())


def kind_specs() -> tuple[KindSpec, ...]:
    """Every kind, in suite order."""
    return tuple(kind for spec in registered_levels() for kind in spec.kinds)


def level_spec(name: str) -> LevelSpec:
    """The level called ``name``; an unknown name is a :class:`KeyError` naming the known ones."""
    load_plugins()
    try:
        return _levels[name]
    except KeyError:
        raise KeyError(f"no level {name!r} (the levels: {', '.join(_levels)})") from None


def kind_spec(kind: str) -> tuple[KindSpec, LevelSpec]:
    """The kind called ``kind`` and its level; an unknown kind is the harness's
    error (:class:`ValueError` naming the known ones), never another kind's."""
    load_plugins()
    try:
        return _kinds[kind]
    except KeyError:
        raise ValueError(f"no runner for item kind {kind!r} (the kinds: {', '.join(_kinds)})") from None


def served_op(op: str) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    """The level's answer to the served op ``op`` (:attr:`LevelSpec.served`); an
    unknown op is a :class:`ValueError` naming it."""
    for spec in registered_levels():
        answer = spec.served.get(op)
        if answer is not None:
            return answer
    raise ValueError(f"unknown op {op!r}")


def served_ops() -> list[str]:
    """Every op a served side answers, level by level in suite order."""
    return [op for spec in registered_levels() for op in spec.served]


def is_kind(kind: str) -> bool:
    load_plugins()
    return kind in _kinds


class Names(Sequence[str]):
    """A view of names read from the registry on every use (so a level
    registered after import is in it); compares equal to a tuple of the same."""

    def __init__(self, names: Callable[[], Iterable[str]]) -> None:
        self._names = names

    def _now(self) -> tuple[str, ...]:
        return tuple(self._names())

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._now()[index]

    def __len__(self) -> int:
        return len(self._now())

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __contains__(self, name: object) -> bool:
        return name in self._now()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and self._now() == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._now())


def _level_names(keep: Callable[[LevelSpec], bool] = lambda spec: True) -> Names:
    return Names(lambda: (spec.name for spec in registered_levels() if keep(spec)))


def _kind_names(keep: Callable[[LevelSpec], bool] = lambda spec: True) -> Names:
    return Names(lambda: (kind.name for spec in registered_levels() if keep(spec) for kind in spec.kinds))


# Every level, in suite order.
LEVELS = _level_names()
# Every kind, in suite order.
KINDS = _kind_names()
# The levels whose items are host work (layouts and workspace sizes): a run of
# these alone never loads torch (harness.engine.device.select_host).
HOST_LEVELS = _level_names(lambda spec: spec.host)
# The levels whose answers are floats, judged bit for bit and measured in ULPs.
FLOAT_LEVELS = _level_names(lambda spec: spec.floats)
# The kinds of the host levels (answers are layouts and sizes) and of the others
# (their inputs are tensors the harness materialises).
HOST_KINDS = _kind_names(lambda spec: spec.host)
TENSOR_KINDS = _kind_names(lambda spec: not spec.host)
# The kinds of the sparse path (SPEC 1d).
SPARSE_KINDS = _kind_names(lambda spec: spec.sparse)


def kinds_of(item: Any) -> list[str]:
    """The kinds an item is, in suite order (each kind's ``holds``): a case its
    layout and, with a numeric section, its prefill; a merge case its merge."""
    return [kind.name for spec in registered_levels() for kind in spec.kinds if kind.holds(item)]


def level_of(kind: str) -> str:
    """The level an item of ``kind`` belongs to (a text that names no kind is
    its own level: the callers refuse it with their own message)."""
    return kind_spec(kind)[1].name if is_kind(kind) else kind


def shrinking_kind(level: str) -> str | None:
    """The kind of ``level`` whose divergent items shrink to smaller cases
    (:attr:`KindSpec.shrinks`), or None."""
    return next((kind.name for kind in level_spec(level).kinds if kind.shrinks), None)


SHRINKING_LEVELS = _level_names(lambda spec: any(kind.shrinks for kind in spec.kinds))


def levels_where(keep: Callable[[LevelSpec], bool]) -> list[str]:
    """The levels (in suite order) ``keep`` holds for."""
    return [spec.name for spec in registered_levels() if keep(spec)]


def kinds_where(keep: Callable[[KindSpec, LevelSpec], bool]) -> list[str]:
    """The kinds (in suite order) whose spec and level ``keep`` holds for."""
    return [kind.name for spec in registered_levels() for kind in spec.kinds if keep(kind, spec)]


def levels_table() -> list[tuple[str, str, str, str]]:
    """(level, kinds, port methods, what it compares) for each level: the docs'
    and ``parity levels``' table."""
    return [
        (spec.name, ", ".join(k.name for k in spec.kinds), ", ".join(spec.port_methods), spec.title)
        for spec in registered_levels()
    ]
