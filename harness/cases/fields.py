"""The checks every case field goes through, shared by the dense case files
(:mod:`harness.cases.files`) and the sparse items (:mod:`harness.cases.sparse_inputs`):
a bad value is a :class:`CaseError` naming the file, the field and the reason,
and sizes are bounded (:data:`LIMITS`) so an absurd case is refused before
anything is allocated for it."""

from __future__ import annotations

import json
from typing import Any

from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES, PRESETS, NumericSpec
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
    if not isinstance(data, dict):
        raise CaseError(source, "numeric", f"must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"preset", "dtype", "seed", "keyless_rows", *_NUMERIC_DIMS})
    if unknown:
        raise CaseError(source, f"numeric.{unknown[0]}", "is not a numeric field")
    preset_name = data.get("preset")
    if preset_name is None:
        missing = [k for k in _NUMERIC_DIMS if k not in data]
        if missing:
            raise CaseError(source, f"numeric.{missing[0]}", "is missing (or give a preset)")
        base = None
    elif preset_name not in PRESETS:
        raise CaseError(source, "numeric.preset", f"unknown preset {preset_name!r} (known: {', '.join(PRESETS)})")
    else:
        base = PRESETS[preset_name]
    dims = {
        k: int_field(source, f"numeric.{k}", data[k], 1, 4096) if k in data else getattr(base, k) for k in _NUMERIC_DIMS
    }
    dtype = data.get("dtype", base.dtype if base else "bf16")
    if dtype not in NUMERIC_DTYPES:
        raise CaseError(source, "numeric.dtype", f"must be one of {', '.join(NUMERIC_DTYPES)}, got {dtype!r}")
    seed = int_field(source, "numeric.seed", data.get("seed", 0), 0, (1 << 63) - 1)
    keyless_rows = data.get("keyless_rows", KEYLESS_ROWS[0])
    if keyless_rows not in KEYLESS_ROWS:
        raise CaseError(
            source, "numeric.keyless_rows", f"must be one of {', '.join(KEYLESS_ROWS)}, got {json.dumps(keyless_rows)}"
        )
    return NumericSpec(**dims, dtype=dtype, seed=seed, keyless_rows=keyless_rows)


# -- fields read as their declaration says (harness.model.case_fields) ------------------------------


def _bound(declared: Declared) -> int | None:
    """The largest value a field may hold (None: no bound)."""
    how = declared.rule
    return how.maximum if how.maximum is not None else (LIMITS[how.limit] if how.limit else None)


def field_value(declared: Declared, value: object, source: str) -> object:
    """One field's value read by its rule: the value, typed, or a
    :class:`CaseError` naming the field and why."""
    name, how = declared.name, declared.rule
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
    return numeric_from_json(value, source)


def fields_from_json(
    case_type: type, data: Any, source: str, what: str, accepted: tuple[str, ...] = ()
) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]]:
    """The declared fields of ``case_type`` read from ``data`` (a JSON object),
    each by its rule: (its own fields' values, the extras set). A missing
    required field, an unknown one (beyond ``accepted``, which are read
    elsewhere or not at all) or a bad value is a :class:`CaseError` naming the
    file and the field; ``what`` names the object in those errors."""
    if not isinstance(data, dict):
        raise CaseError(source, None, f"{what} must be a JSON object, got {type(data).__name__}")
    declared = declared_fields(case_type)
    for d in declared:
        if d.required and d.name not in data:
            raise CaseError(source, d.name, "is missing")
    unknown = sorted(set(data) - {d.name for d in declared} - set(accepted))
    if unknown:
        raise CaseError(source, unknown[0], f"is not {what} field")
    own: dict[str, Any] = {}
    extras: list[tuple[str, Any]] = []
    for d in declared:
        if d.name in data:
            value = field_value(d, data[d.name], source)
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
        }[how.kind] + (" or null" if how.optional else "")
        default = "(required)" if d.required else f"`{json.dumps(d.default)}`"
        rows.append(f"| `{d.name}` | {holds} | {default} | {how.doc} |")
    return rows
