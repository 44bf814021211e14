"""The interface every side of a comparison implements: the levels, the methods
that enable each, and the checks on what a port returns.

A port is any object with a ``name`` and the two methods of :class:`Port`. The
harness names built-in ports by short name (``per_request``, ``equal_share``)
and a user's port by import path (``package.module:attr``, where ``attr`` is a
port object, or a class or factory that takes no arguments and returns one).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, runtime_checkable

from harness.model import Case, Chunk, Layout, WorkspaceConfig
from harness.model.levels import LEVELS, level_spec, registered_levels


@runtime_checkable
class Port(Protocol):
    """What the harness asks of a side.

    ``plan_layout`` must be a pure function of the case: the same case gives the
    same layout. It may raise for a case it cannot plan; the harness reports that
    case as ``port-error`` and goes on.
    """

    name: str

    def plan_layout(self, case: Case) -> Layout: ...

    def workspace_size(self, config: WorkspaceConfig) -> int: ...


# Every level a side can be compared at (SPEC section 3), in suite order: the registry's.
ALL_LEVELS = LEVELS


def level_methods(level: str) -> tuple[str, ...]:
    """The methods that make a port implement ``level`` (its registered ``port_methods``)."""
    return level_spec(level).port_methods


def port_levels(port: Any) -> tuple[str, ...]:
    """The levels ``port`` implements.

    A port may declare them (``levels``, a tuple of level names: an external
    ``cmd:`` port lists them in its hello). Otherwise they follow from its
    methods: a level's registered ``port_methods``, all callable
    (:func:`level_methods`; ``layout`` always, by the protocol's two methods).
    Items at any other level are ``not-run`` for it, never silently dropped.
    """
    declared = getattr(port, "levels", None)
    if declared is not None:
        check_declared_levels(declared)
        return tuple(lv for lv in ALL_LEVELS if lv in declared)
    return tuple(lv for lv in ALL_LEVELS if all(callable(getattr(port, method, None)) for method in level_methods(lv)))


def check_declared_levels(declared: Any) -> None:
    """A port's ``levels`` is a tuple or list of level names; anything else is
    a port that cannot be run (:class:`PortLoadError`, exit 2)."""
    if not isinstance(declared, tuple | list) or not all(isinstance(lv, str) for lv in declared):
        raise PortLoadError(f"port levels must be a tuple of level names, got {_type_name(declared)} {declared!r:.60}")
    unknown = [lv for lv in declared if lv not in ALL_LEVELS]
    if unknown:
        raise PortLoadError(f"port declares unknown level {unknown[0]!r} (levels: {', '.join(ALL_LEVELS)})")


# -- the one rule for the values a port returns ------------------------------------------
#
# A port's values are checked by type before they are compared, with no
# coercion: an integer is a Python ``int`` (not ``bool``, not a float, not a
# numpy scalar), a flag is a Python ``bool``, a sequence is a ``tuple`` of those,
# a layout is a :class:`~harness.model.Layout` of :class:`~harness.model.Chunk`
# objects, and a tensor is a ``torch.Tensor``. ``3.0 == 3`` and ``True == 1``
# hold in Python; neither is parity. A value that breaks the rule makes the item
# ``port-error`` with the offending field named.


class PortValueError(TypeError):
    """A port returned a value of the wrong type; the message names the field."""


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def check_int(value: Any, where: str) -> int:
    if type(value) is not int:
        raise PortValueError(f"{where}: {_type_name(value)} {value!s:.40}, not int")
    return value


def _check_ints(value: Any, where: str) -> None:
    if type(value) is not tuple:
        raise PortValueError(f"{where}: {_type_name(value)}, not a tuple of int")
    # One pass in C over what can be 65,536 row indices; the element loop only
    # runs to name the first offender.
    if not set(map(type, value)) <= {int}:
        for i, item in enumerate(value):
            check_int(item, f"{where}[{i}]")


@functools.cache
def _chunk_field_kinds() -> tuple[tuple[str, str, bool], ...]:
    """Each chunk field with the rule it follows (bool, int, ints or ranks) and
    whether it may be None (DCP)."""
    sequences, optional = set(Chunk.sequence_field_names()), set(Chunk.optional_field_names())
    kinds = []
    for name in Chunk.field_names():
        if name == "is_continuation":
            kind = "bool"
        elif name == "local_context_lens_allranks":
            kind = "ranks"
        else:
            kind = "ints" if name in sequences else "int"
        kinds.append((name, kind, name in optional))
    return tuple(kinds)


def check_chunk(chunk: Any, where: str, built: frozenset[str] = frozenset()) -> None:
    """Every field of one chunk, by the rule above (DCP fields may be None).
    A field named in ``built`` is a tuple whose elements the caller made ints
    itself (the oracle cache expands its row maps from checked runs): only its
    type is checked, not each of its elements."""
    if type(chunk) is not Chunk:
        raise PortValueError(f"{where}: {_type_name(chunk)}, not a harness.model.Chunk")
    for name, field_type, optional in _chunk_field_kinds():
        value = getattr(chunk, name)
        if value is None and optional:
            continue
        # Runs for every chunk of every layout: the location string is built
        # only to name an offender.
        if field_type == "ints":
            if type(value) is not tuple or (name not in built and not set(map(type, value)) <= {int}):
                _check_ints(value, f"{where}.{name}")
        elif field_type == "int":
            if type(value) is not int:
                check_int(value, f"{where}.{name}")
        elif field_type == "bool":
            if type(value) is not bool:
                raise PortValueError(f"{where}.{name}: {_type_name(value)} {value!s:.40}, not bool")
        else:
            if type(value) is not tuple:
                raise PortValueError(f"{where}.{name}: {_type_name(value)}, not a tuple of tuples of int")
            for i, ranks in enumerate(value):
                _check_ints(ranks, f"{where}.{name}[{i}]")


def check_layout(layout: Any, built: frozenset[str] = frozenset()) -> Layout:
    """``layout`` as returned by ``plan_layout``, checked field by field
    (``built``: as :func:`check_chunk`'s; a port's layout is checked whole)."""
    where = "plan_layout"
    if type(layout) is not Layout:
        raise PortValueError(f"{where} returned {_type_name(layout)}, not a Layout")
    if type(layout.chunks) is not tuple:
        raise PortValueError(f"{where}: chunks: {_type_name(layout.chunks)}, not a tuple of Chunk")
    for i, chunk in enumerate(layout.chunks):
        check_chunk(chunk, f"{where}: chunks[{i}]", built)
    slices = layout.empty_token_slices
    if type(slices) is not tuple:
        raise PortValueError(f"{where}: empty_token_slices: {_type_name(slices)}, not a tuple of (int, int)")
    for i, pair in enumerate(slices):
        _check_ints(pair, f"{where}: empty_token_slices[{i}]")
        if len(pair) != 2:
            raise PortValueError(f"{where}: empty_token_slices[{i}]: {len(pair)} values, not (start, stop)")
    return layout


def check_tensor(value: Any, where: str, device: Any = None) -> Any:
    """A plain ``torch.Tensor`` (no subclass) on ``device`` (the oracle's, when
    given): a port that computes L2/L3 elsewhere has not run where it was asked."""
    import torch

    if type(value) is not torch.Tensor:
        raise PortValueError(f"{where}: {_type_name(value)}, not a torch.Tensor")
    if device is not None and value.device != device:
        raise PortValueError(f"{where}: on {value.device}, but the run is on {device}")
    return value


# Seconds one port call may take unless the caller says otherwise (the CLI's --timeout).
DEFAULT_PORT_TIMEOUT_S = 300.0


def l3_compares(port: object) -> dict[str, str]:
    """What the items of ``port`` compare at each level that says
    (:attr:`harness.model.levels.LevelSpec.compares`: the L3 levels), as the
    outputs say it; a port run over the external protocol (``over_protocol``
    true: harness/protocol/external.py) is sent the partials and compares less."""
    external = getattr(port, "over_protocol", False) is True
    compares = {}
    for spec in registered_levels():
        what = (spec.compares_over_protocol or spec.compares) if external else spec.compares
        if what is not None:
            compares[spec.name] = what
    return compares


class HarnessFault(Exception):
    """The harness's own work inside a port call failed (an external port's chunk
    partials, computed here on the port's layout, ran out of memory): the item
    is not run, never blamed on the port."""


class PortLoadError(Exception):
    """A port name that cannot be resolved; the message is one line."""
