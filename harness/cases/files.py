"""Case files: the JSON format, its validation, and loading from files and folders.

A case file holds one case object, or ``{"cases": [case, ...]}``. A case object::

    {
      "name": "skew-worst-case",            # required, unique within a suite
      "family": "skew",                     # optional, default "hand-picked"
      "context_lens": [60000, 16, ...],     # required, ints >= 0
      "query_lens": [513, 513, ...],        # required, ints >= 1, same length
      "block_size": 16,                     # required, int >= 1
      "workspace_size": 65536,              # required, rows, >= one alignment unit
      "dcp_world_size": 1,                  # optional, default 1
      "cp_kv_cache_interleave_size": 1,     # optional, default 1
      "align_to_block": true,               # optional, default true
      "description": "...",                 # optional, free text
      "numeric": {"preset": "tiny", "seed": 7}   # optional: enables L3 (see below)
    }

``numeric`` takes a ``preset`` (tiny, deepseek-v2-lite, deepseek-v3) and/or any
of num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank,
dtype (bf16, fp16, fp32) and seed, each overriding the preset, and
``keyless_rows`` (neg-inf, the default; pos-inf; finite): what the shared
attention kernels report for a query row without keys (``harness.model.KEYLESS_ROWS``).
A DCP case with ``numeric`` runs L3 on per-rank caches (see harness/model/dcp.py).

Anything wrong is a :class:`CaseError` whose message is one line naming the
file, the field and the reason. Sizes are bounded (:data:`LIMITS`) so that an
absurd case is refused before anything is allocated for it.

An *item file* (:func:`load_item_file`, what ``parity diff FILE`` reads) is a
case file, a merge case as :meth:`~harness.model.MergeCase.to_json` writes it,
or a workspace configuration ``{"kind": "workspace", "max_model_len": ...}``;
``parity explore`` writes its finds in these three forms.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from harness.cases.fields import LIMITS, CaseError, int_field, int_tuple_field, numeric_from_json
from harness.cases.sparse_inputs import sparse_item_from_json
from harness.model import (
    MERGE_LSE_VIEWS,
    MERGE_PATTERNS,
    MERGE_VALUE_VIEWS,
    NUMERIC_DTYPES,
    Case,
    MergeCase,
    WorkspaceConfig,
    alignment_unit,
)

_REQUIRED = ("name", "context_lens", "query_lens", "block_size", "workspace_size")
_OPTIONAL = (
    "family",
    "dcp_world_size",
    "cp_kv_cache_interleave_size",
    "align_to_block",
    "description",
    "numeric",
)


def case_from_json(data: Any, source: str) -> Case:
    """Validate one case object; ``source`` names where it came from in errors."""
    if not isinstance(data, dict):
        raise CaseError(source, None, f"a case must be a JSON object, got {type(data).__name__}")
    for key in _REQUIRED:
        if key not in data:
            raise CaseError(source, key, "is missing")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise CaseError(source, unknown[0], "is not a case field")
    name = data["name"]
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise CaseError(source, "name", "must be a non-empty string without spaces")
    family = data.get("family", "hand-picked")
    if not isinstance(family, str) or not family:
        raise CaseError(source, "family", "must be a non-empty string")
    context_lens = int_tuple_field(source, "context_lens", data["context_lens"], 0, LIMITS["context_len"])
    query_lens = int_tuple_field(source, "query_lens", data["query_lens"], 1, LIMITS["query_len"])
    if len(context_lens) != len(query_lens):
        raise CaseError(source, "query_lens", f"has {len(query_lens)} entries but context_lens has {len(context_lens)}")
    if sum(context_lens) > LIMITS["total_context"]:
        raise CaseError(
            source, "context_lens", f"total context {sum(context_lens)} exceeds {LIMITS['total_context']} rows"
        )
    block_size = int_field(source, "block_size", data["block_size"], 1, LIMITS["block_size"])
    workspace_size = int_field(source, "workspace_size", data["workspace_size"], 1, LIMITS["workspace_size"])
    world = int_field(source, "dcp_world_size", data.get("dcp_world_size", 1), 1, LIMITS["dcp_world_size"])
    interleave = int_field(
        source,
        "cp_kv_cache_interleave_size",
        data.get("cp_kv_cache_interleave_size", 1),
        1,
        LIMITS["cp_kv_cache_interleave_size"],
    )
    align = data.get("align_to_block", True)
    if not isinstance(align, bool):
        raise CaseError(source, "align_to_block", f"must be true or false, got {json.dumps(align)}")
    unit = alignment_unit(block_size, world, interleave, align)
    if workspace_size < unit:
        raise CaseError(source, "workspace_size", f"{workspace_size} rows is below one alignment unit ({unit} rows)")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CaseError(source, "description", "must be a string")
    numeric = numeric_from_json(data["numeric"], source) if "numeric" in data else None
    if numeric is not None:
        elements = sum(query_lens) * numeric.num_heads * max(numeric.qk_head_dim, numeric.kv_lora_rank)
        if elements + sum(context_lens) * numeric.latent_dim > LIMITS["numeric_elements"]:
            raise CaseError(source, "numeric", "tensors too large (refused before allocating)")
    return Case(
        name=name,
        family=family,
        context_lens=context_lens,
        query_lens=query_lens,
        block_size=block_size,
        workspace_size=workspace_size,
        dcp_world_size=world,
        cp_kv_cache_interleave_size=interleave,
        align_to_block=align,
        numeric=numeric,
    )


def load_case_file(path: Path) -> list[Case]:
    """All cases in one file, validated; a bad file raises :class:`CaseError`."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CaseError(source, None, f"cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise CaseError(source, None, "is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseError(source, None, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if isinstance(data, dict) and "cases" in data:
        items = data["cases"]
        if not isinstance(items, list):
            raise CaseError(source, "cases", "must be a list of case objects")
        return [case_from_json(item, f"{source}#cases[{i}]") for i, item in enumerate(items)]
    return [case_from_json(data, source)]


def load_cases(paths: list[Path]) -> list[Case]:
    """Cases from files and folders (``*.json`` inside, sorted by path), names unique."""
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for path in paths:
        if path.is_dir():
            files = sorted(path.rglob("*.json"))
            if not files:
                raise CaseError(str(path), None, "folder holds no *.json case files")
        elif path.exists():
            files = [path]
        else:
            raise CaseError(str(path), None, "no such file or folder")
        for file in files:
            for case in load_case_file(file):
                if case.name in seen:
                    raise CaseError(str(file), "name", f"{case.name!r} is already defined in {seen[case.name]}")
                seen[case.name] = str(file)
                cases.append(case)
    return cases


def write_case_file(case: Case, path: Path, description: str = "") -> None:
    data = case.to_json()
    if description:
        data["description"] = description
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# -- item files: a case, a merge case or a workspace configuration ------------------------

# The values each string field of a merge case may take.
MERGE_CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": NUMERIC_DTYPES,
    "pattern": MERGE_PATTERNS,
    "lse_view": MERGE_LSE_VIEWS,
    "value_view": MERGE_VALUE_VIEWS,
}


def _typed(data: dict[str, Any], name: str, kind: type, source: str) -> Any:
    value = data[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CaseError(source, name, f"must be an integer, got {json.dumps(value)}")
    if kind is str and not isinstance(value, str):
        raise CaseError(source, name, f"must be a string, got {json.dumps(value)}")
    return value


def workspace_config_from_json(data: dict[str, Any], source: str) -> WorkspaceConfig:
    names = [f.name for f in dataclasses.fields(WorkspaceConfig)]
    unknown = sorted(set(data) - {*names, "kind", "name", "description"})
    if unknown:
        raise CaseError(source, unknown[0], "is not a workspace-config field")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(WorkspaceConfig):
        if f.name in data:
            values[f.name] = _typed(data, f.name, int, source)
            if values[f.name] < 1:
                raise CaseError(source, f.name, f"must be >= 1, got {values[f.name]}")
        elif f.default is dataclasses.MISSING:
            raise CaseError(source, f.name, "is missing")
    return WorkspaceConfig(**values)


def merge_case_from_json(data: dict[str, Any], source: str) -> MergeCase:
    """A merge case as :meth:`MergeCase.to_json` writes it, checked by type."""
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(MergeCase)} - {"description"})
    if unknown:
        raise CaseError(source, unknown[0], "is not a merge-case field")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(MergeCase):
        if f.name not in data:
            if f.default is dataclasses.MISSING:
                raise CaseError(source, f.name, "is missing")
            continue
        value = data[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, str) or f.name in ("name", "dtype", "pattern"):
            value = _typed(data, f.name, str, source)
        elif value is not None or default is not None:
            value = _typed(data, f.name, int, source)
        values[f.name] = value
    for name, choices in MERGE_CHOICES.items():
        if name in values and values[name] not in choices:
            raise CaseError(source, name, f"must be one of {', '.join(choices)}, got {json.dumps(values[name])}")
    for name in ("num_tokens", "num_heads", "head_size"):
        if not 1 <= values[name] <= 4096:
            raise CaseError(source, name, f"must be in 1..4096, got {values[name]}")
    return MergeCase(**values)


def load_item_file(path: Path) -> tuple[str, Any]:
    """An item file: ``("layout", cases)`` for a case file (one case or
    ``{"cases": [...]}``), ``("merge", merge_case)`` or ``("workspace", config)``.
    Anything else is a :class:`CaseError` naming the file."""
    source = str(path)
    if path.is_dir():
        raise CaseError(source, None, "is a folder, not a case or find file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(source, None, f"cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseError(source, None, f"is not a JSON case or find file ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise CaseError(source, None, "must hold a JSON object (a case, a merge case or a workspace config)")
    if data.get("kind") == "workspace":
        return "workspace", workspace_config_from_json(data, source)
    if data.get("kind") in ("sparse", "sparse-workspace", "topk-mask"):
        return sparse_item_from_json(data, source)
    if "context_lens" in data or "cases" in data:
        return "layout", load_case_file(path)
    if "pattern" in data and "num_tokens" in data:
        return "merge", merge_case_from_json(data, source)
    raise CaseError(source, None, "is neither a case, a merge case nor a workspace config")
