"""The checks every case field goes through, shared by the dense case files
(:mod:`harness.cases.files`) and the sparse items (:mod:`harness.cases.sparse_inputs`):
a bad value is a :class:`CaseError` naming the file, the field and the reason,
and sizes are bounded (:data:`LIMITS`) so an absurd case is refused before
anything is allocated for it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.model import PRESETS, NumericSpec
from harness.model.case_fields import Declared, FieldKind, declared_fields

LIMITS = {
    "requests": 1 << 17,
    "context_len": 1 << 24,
    "query_len": 1 << 20,
    "total_context": 1 << 26,
    "workspace_size": 1 << 22,
    "block_size": 4096,
    "dcp_world_size": 64,
    "cp_kv_cache_interleave_size": 4096,
    "numeric_elements": 1 << 31,
}


_NUMERIC_DIMS = ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


class CaseError(Exception):
    """Bad case input. ``str(error)`` is the one line the CLI prints."""

    def __init__(self, source: str, field: str | None, reason: str) -> None:
        self.source, self.field, self.reason = source, field, reason
        where = f"{source}: field '{field}'" if field else source
        super().__init__(f"{where}: {reason}")


def int_field(source: str, field: str, value: Any, minimum: int | None, maximum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaseError(source, field, f"must be an integer, got {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise CaseError(source, field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise CaseError(source, field, f"must be <= {maximum} (refused before allocating), got {value}")
    return value


def int_tuple_field(source: str, field: str, value: Any, minimum: int, maximum: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise CaseError(source, field, f"must be a list of integers, got {type(value).__name__}")
    if not value:
        raise CaseError(source, field, "must hold at least one request")
    if len(value) > LIMITS["requests"]:
        raise CaseError(source, field, f"must hold at most {LIMITS['requests']} requests, got {len(value)}")
    return tuple(int_field(source, f"{field}[{i}]", v, minimum, maximum) for i, v in enumerate(value))


def numeric_from_json(data: Any, source: str) -> NumericSpec:
    """A numeric section, each field by its declaration (:class:`NumericSpec`);
    a ``preset`` gives the dimensions and dtype a section leaves out."""
    if not isinstance(data, dict):
        raise CaseError(source, "numeric", f"must be an object, got {type(data).__name__}")
    defaults: dict[str, Any] = {}
    preset_name = data.get("preset")
    if preset_name is not None:
        if preset_name not in PRESETS:
            raise CaseError(source, "numeric.preset", f"unknown preset {preset_name!r} (known: {', '.join(PRESETS)})")
        preset = PRESETS[preset_name]
        defaults = {name: getattr(preset, name) for name in (*_NUMERIC_DIMS, "dtype")}
    values, _ = fields_from_json(
        NumericSpec,
        {k: v for k, v in data.items() if k != "preset"},
        source,
        "a numeric",
        prefix="numeric.",
        defaults=defaults,
        missing="is missing (or give a preset)",
    )
    return NumericSpec(**values)


# -- fields read as their declaration says (harness.model.case_fields) ------------------------------


def _bound(declared: Declared) -> int | None:
    """The largest value a field may hold (None: no bound)."""
    how = declared.rule
    return how.maximum if how.maximum is not None else (LIMITS[how.limit] if how.limit else None)


def field_value(declared: Declared, value: object, source: str, prefix: str = "") -> object:
    """One field's value read by its rule: the value, typed, or a
    :class:`CaseError` naming the field (after ``prefix``) and why."""
    name, how = prefix + declared.name, declared.rule
    if value is None and how.optional:
        return None
    if how.kind is FieldKind.NAME:
        if not isinstance(value, str) or not value or any(c.isspace() for c in value):
            raise CaseError(source, name, "must be a non-empty string without spaces")
        return value
    if how.kind is FieldKind.ITEM_NAME:
        if not isinstance(value, str) or not value or any(c.isspace() or c in "[]" for c in value):
            raise CaseError(
                source, name, f"must be a non-empty string without spaces or brackets, got {json.dumps(value)}"
            )
        return value
    if how.kind is FieldKind.TEXT:
        if not isinstance(value, str) or not value:
            raise CaseError(source, name, f"must be a non-empty string, got {json.dumps(value)}")
        return value
    if how.kind is FieldKind.INT:
        return int_field(source, name, value, how.minimum, _bound(declared))
    if how.kind is FieldKind.INTS:
        if how.may_be_empty and value == []:
            return ()
        bound = _bound(declared)
        assert bound is not None, f"a per-request field ({name}) is bounded: its tensors are allocated"
        return int_tuple_field(source, name, value, how.minimum or 0, bound)
    if how.kind is FieldKind.BOOL:
        if not isinstance(value, bool):
            raise CaseError(source, name, f"must be true or false, got {json.dumps(value)}")
        return value
    if how.kind is FieldKind.CHOICE:
        if value not in how.choices:
            raise CaseError(source, name, f"must be one of {', '.join(how.choices)}, got {json.dumps(value)}")
        return value
    if how.kind is FieldKind.INDICES:
        return value  # checked against the rest of the case by its type's reader
    return numeric_from_json(value, source)


def fields_from_json(
    case_type: type,
    data: Any,
    source: str,
    what: str,
    accepted: tuple[str, ...] = (),
    prefix: str = "",
    defaults: Mapping[str, Any] | None = None,
    missing: str = "is missing",
) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]]:
    """The declared fields of ``case_type`` read from ``data`` (a JSON object),
    each by its rule: (its own fields' values, the extras set). A missing
    required field, an unknown one (beyond ``accepted``, which are read
    elsewhere or not at all) or a bad value is a :class:`CaseError` naming the
    file and the field (``prefix``, a section's name, before it); ``what``
    names the object in those errors. A field left out takes its value from
    ``defaults`` when there (a preset's), else from its rule's
    ``default_from``, else its declared default (only an own field with
    neither is missing)."""
    if not isinstance(data, dict):
        raise CaseError(source, None, f"{what} must be a JSON object, got {type(data).__name__}")
    declared = declared_fields(case_type)
    given = dict(defaults or {})
    for d in declared:
        if d.required and d.name not in data and d.name not in given and d.rule.default_from is None:
            raise CaseError(source, prefix + d.name, missing)
    unknown = sorted(set(data) - {d.name for d in declared} - set(accepted))
    if unknown:
        raise CaseError(source, prefix + unknown[0], f"is not {what} field")
    own: dict[str, Any] = {}
    extras: list[tuple[str, Any]] = []
    for d in declared:
        if d.name in data:
            value = field_value(d, data[d.name], source, prefix)
        elif d.name in given:
            value = given[d.name]
        elif d.rule.default_from is not None:
            value = field_value(d, d.rule.default_from(own), source, prefix)
        else:
            continue
        if d.extra:
            extras.append((d.name, value))
        else:
            own[d.name] = value
    return own, tuple(extras)


def _int_range(declared: Declared) -> str:
    how, bound = declared.rule, _bound(declared)
    if how.minimum is None:
        return "integer" if bound is None else f"integer <= {bound}"
    return f"integer >= {how.minimum}" if bound is None else f"integer, {how.minimum} to {bound}"


def field_table(case_type: type) -> list[str]:
    """The docs' table of ``case_type``'s fields, from their declaration."""
    rows = ["| field | holds | default | what |", "|---|---|---|---|"]
    for d in declared_fields(case_type):
        how = d.rule
        holds = {
            FieldKind.NAME: "string, no spaces",
            FieldKind.ITEM_NAME: "string, no spaces or brackets",
            FieldKind.TEXT: "string",
            FieldKind.INT: _int_range(d),
            FieldKind.INTS: f"{_int_range(d).replace('integer', 'integers')}, one per request",
            FieldKind.BOOL: "true or false",
            FieldKind.CHOICE: "one of " + ", ".join(f"`{c}`" for c in how.choices),
            FieldKind.NUMERIC: "numeric section",
            FieldKind.INDICES: "per request, per query row, `index_topk` indices",
        }[how.kind] + (" or null" if how.optional else "")
        if how.default_doc:
            default = how.default_doc
        else:
            default = "(required)" if d.required else f"`{json.dumps(d.default)}`"
        rows.append(f"| `{d.name}` | {holds} | {default} | {how.doc} |")
    return rows
