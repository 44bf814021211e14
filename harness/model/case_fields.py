"""Case fields declared once: each field of a case type carries its rule in
its dataclass field's metadata (:func:`rule`), and everything that reads or
writes a field follows from it: reading a file with a one-line error naming the
field (:func:`harness.cases.fields.fields_from_json`), ``to_json``
(:func:`fields_to_json`), the shrink moves (:mod:`harness.search.shrink`), the
hypothesis strategies for fields without a designed one
(:mod:`harness.search.explore_strategies`) and the docs' field tables
(:func:`harness.cases.fields.field_table`).

A field from outside the harness (a team's, a test's) is declared the same way
and registered on a case type with :func:`register_field`: it travels in the
case's ``extras`` (name, value pairs; a port reads it with ``case.extra(name)``),
is read, written, shrunk, drawn and tabled as a declared field is, and an
unknown one is still refused.

Invariants: a rule's ``minimum`` is the smallest value the field may hold and
``limit`` names the :data:`harness.cases.fields.LIMITS` entry that bounds it
(or ``maximum`` gives the bound); ``to_json`` writes a field whose value is its
default only when ``always`` (so a file from before the field existed keeps
its bytes); ``first`` fields lead the JSON object (the name, the family).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.model.levels import TextEnum


class FieldKind(TextEnum):
    """What a field holds: a name (no spaces; an item name: no brackets
    either), a text, an integer, an integer per request, a boolean, one of
    ``choices``, a numeric section, or explicit top-k indices (per request, per
    query row; read as JSON here and checked against the rest of the case by
    the case type's reader)."""

    NAME = "name"
    ITEM_NAME = "item-name"
    TEXT = "text"
    INT = "int"
    INTS = "ints"
    BOOL = "bool"
    CHOICE = "choice"
    NUMERIC = "numeric"
    INDICES = "indices"


@dataclass(frozen=True)
class FieldRule:
    """How one case field is read, written, shrunk, drawn and documented.

    ``kind`` is a :class:`FieldKind`; ``optional`` lets it hold None
    (JSON null); ``floor(case)`` is the smallest value shrinking tries (None:
    it never shrinks the field; per element for an ``ints`` field); ``doc`` is
    its line in the docs' table; ``written_with`` names the field it is
    written beside (only when that one is set). ``default_from(fields)`` is
    the value a file that leaves the field out gives it, from the fields read
    before it (a type whose fields differ from file to file, or whose
    dataclass has no default for it), ``default_doc`` that default in the
    docs' table; ``may_be_empty``: an ``ints`` field may hold no element
    (its default, an empty tuple)."""

    kind: FieldKind
    doc: str
    minimum: int | None = 0
    limit: str | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    always: bool = True
    first: bool = False
    floor: Callable[[Any], int] | None = None
    written_with: str | None = None
    default_from: Callable[[dict[str, Any]], Any] | None = None
    default_doc: str = ""
    may_be_empty: bool = False

    def __post_init__(self) -> None:
        # A kind given as its text is that member; any other text is refused here,
        # never read later as another kind's field.
        object.__setattr__(self, "kind", FieldKind(self.kind))


def rule(kind: FieldKind, doc: str, default: Any = dataclasses.MISSING, **how: Any) -> Any:
    """A dataclass field declared with its :class:`FieldRule`."""
    metadata = {"rule": FieldRule(kind, doc, **how)}
    if default is dataclasses.MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One declared field of a case type: its name, rule and default
    (:data:`dataclasses.MISSING`: required), and whether it is an extra."""

    name: str
    rule: FieldRule
    default: object
    extra: bool = False

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


_extras: dict[type, dict[str, Declared]] = {}
# The field of a case type that holds its registered extras' values, as (name, value) pairs.
EXTRAS_FIELD = "extras"


def register_field(case_type: type, name: str, field_rule: FieldRule, default: object) -> Declared:
    """Declare a field of ``case_type`` from outside the harness: it has a
    default (a file without it stays valid) and a name no field has."""
    if name in declared_names(case_type):
        raise ValueError(f"{case_type.__name__} already has a field {name!r}")
    declared = Declared(name, field_rule, default, extra=True)
    _extras.setdefault(case_type, {})[name] = declared
    return declared


def unregister_field(case_type: type, name: str) -> None:
    _extras.get(case_type, {}).pop(name, None)


def declared_fields(case_type: type) -> tuple[Declared, ...]:
    """Every declared field of ``case_type``: its own in declaration order,
    then the registered extras (the plug-in modules loaded first:
    :func:`harness.model.levels.load_plugins`)."""
    from harness.model.levels import load_plugins

    load_plugins()
    own = tuple(
        Declared(f.name, f.metadata["rule"], f.default) for f in dataclasses.fields(case_type) if "rule" in f.metadata
    )
    return own + tuple(_extras.get(case_type, {}).values())


def declared_names(case_type: type) -> tuple[str, ...]:
    return tuple(d.name for d in declared_fields(case_type))


def extra_default(case_type: type, name: str) -> object:
    """The default of a registered extra field (KeyError: no such field)."""
    from harness.model.levels import load_plugins

    load_plugins()
    return _extras[case_type][name].default


def fields_to_json(case: object) -> dict[str, Any]:
    """``case`` as its declaration writes it: ``first`` fields, then the rest
    in order, a default left out unless ``always``; a numeric section by its own
    ``to_json``; extras after the fields, each only when set."""
    declared = declared_fields(type(case))
    extras = dict(getattr(case, EXTRAS_FIELD, ()))
    out: dict[str, Any] = {}
    for d in sorted(declared, key=lambda d: not d.rule.first):
        value = extras.get(d.name, d.default) if d.extra else getattr(case, d.name)
        if (d.extra or not d.rule.always) and value == d.default:
            continue
        if d.rule.written_with is not None and getattr(case, d.rule.written_with) is None:
            continue
        if d.rule.kind is FieldKind.NUMERIC:
            if value is not None:
                out[d.name] = value.to_json()
        elif d.rule.kind is FieldKind.INDICES:
            out[d.name] = [[list(row) for row in rows] for rows in value]
        else:
            out[d.name] = list(value) if d.rule.kind is FieldKind.INTS else value
    return out
