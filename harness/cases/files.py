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
a workspace configuration ``{"kind": "workspace", "max_model_len": ...}``
(``parity explore`` writes its finds in these three forms), or a sparse item
(:mod:`harness.cases.sparse_inputs`: kinds ``sparse``, ``sparse-workspace``,
``topk-mask``, or recognised by its fields). :func:`item_kind` tells them apart.

``--cases`` files (:func:`load_run_files`, what ``run``, ``gate`` and ``diff
--cases`` read) are read each by its kind: case files and the sparse items
make a suite; a merge case or a workspace configuration is refused in one line
naming the file, its kind and the command that reads it (``parity diff FILE``).
Every file is read through :func:`harness.cases.json_input.read_json`: a syntax
error names the file, the line and the column.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases.fields import LIMITS, CaseError, fields_from_json
from harness.cases.json_input import read_json
from harness.cases.sparse_inputs import (
    sparse_case_from_json,
    sparse_workspace_config_from_json,
    topk_mask_case_from_json,
)
from harness.model import (
    Case,
    MergeCase,
    WorkspaceConfig,
)
from harness.model.levels import Kind
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase

# Read beside a case's declared fields (harness.model.Case): a note for people, kept nowhere.
_CASE_NOTES = ("description",)


def case_from_json(data: Any, source: str) -> Case:
    """Validate one case object, each field by its declaration
    (:class:`harness.model.Case`), then what the fields must hold together;
    ``source`` names where it came from in errors."""
    values, extras = fields_from_json(Case, data, source, "a case", accepted=_CASE_NOTES)
    context_lens, query_lens = values["context_lens"], values["query_lens"]
    if len(context_lens) != len(query_lens):
        raise CaseError(source, "query_lens", f"has {len(query_lens)} entries but context_lens has {len(context_lens)}")
    if sum(context_lens) > LIMITS["total_context"]:
        raise CaseError(
            source, "context_lens", f"total context {sum(context_lens)} exceeds {LIMITS['total_context']} rows"
        )
    case = Case(**values, extras=extras)
    if case.workspace_size < case.alignment:
        raise CaseError(
            source, "workspace_size", f"{case.workspace_size} rows is below one alignment unit ({case.alignment} rows)"
        )
    if not isinstance(data.get("description", ""), str):
        raise CaseError(source, "description", "must be a string")
    numeric = case.numeric
    if numeric is not None:
        elements = sum(query_lens) * numeric.num_heads * max(numeric.qk_head_dim, numeric.kv_lora_rank)
        if elements + sum(context_lens) * numeric.latent_dim > LIMITS["numeric_elements"]:
            raise CaseError(source, "numeric", "tensors too large (refused before allocating)")
    return case


def load_case_file(path: Path) -> list[Case]:
    """All cases in one file, validated; a bad file raises :class:`CaseError`
    (a file holding another kind of item names its kind and the command that
    reads it)."""
    source = str(path)
    data = read_json(path, source)
    kind = item_kind(data, source)
    if not is_case_file(kind):
        raise CaseError(source, None, f"is {ITEM_KINDS[kind]}, not a case file ({reader_of(kind, source)})")
    return _cases_of(data, source)


def _cases_of(data: Any, source: str) -> list[Case]:
    if isinstance(data, dict) and "cases" in data:
        items = data["cases"]
        if not isinstance(items, list):
            raise CaseError(source, "cases", "must be a list of case objects")
        for i, item in enumerate(items):
            kind = item_kind(item, f"{source}#cases[{i}]")
            if not is_case_file(kind):
                raise CaseError(
                    f"{source}#cases[{i}]",
                    None,
                    f"is {ITEM_KINDS[kind]}: a case list holds layout cases only (give it a file of its own)",
                )
        return [case_from_json(item, f"{source}#cases[{i}]") for i, item in enumerate(items)]
    return [case_from_json(data, source)]


def _json_files(paths: list[Path]) -> Iterator[Path]:
    """The files ``--cases`` names: each file, and a folder's ``*.json`` sorted by path."""
    for path in paths:
        if path.is_dir():
            files = sorted(path.rglob("*.json"))
            if not files:
                raise CaseError(str(path), None, "folder holds no *.json case files")
        elif path.exists():
            files = [path]
        else:
            raise CaseError(str(path), None, "no such file or folder")
        yield from files


def load_cases(paths: list[Path]) -> list[Case]:
    """Cases from files and folders (``*.json`` inside, sorted by path), names unique."""
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for file in _json_files(paths):
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


def workspace_config_from_json(data: dict[str, Any], source: str) -> WorkspaceConfig:
    """A workspace configuration, each field by its declaration (:class:`WorkspaceConfig`)."""
    values, _ = fields_from_json(WorkspaceConfig, data, source, "a workspace-config", ("kind", "name", "description"))
    return WorkspaceConfig(**values)


def merge_case_from_json(data: dict[str, Any], source: str) -> MergeCase:
    """A merge case as :meth:`MergeCase.to_json` writes it, each field by its declaration."""
    values, _ = fields_from_json(MergeCase, data, source, "a merge-case", ("description",))
    return MergeCase(**values)


# -- what an input file holds ---------------------------------------------------------------


@dataclass(frozen=True)
class ItemFile:
    """One kind of item an input file can hold: its item kind, in words, the
    value of its file's ``"kind"`` field (None: told by its fields,
    :func:`item_kind`), how the one item of such a file is read (None: a case
    file, read by :func:`_cases_of`), and the :class:`RunFiles` group a
    ``parity run --cases`` puts it in (None: only ``parity diff`` reads it)."""

    kind: Kind
    words: str
    field_value: str | None
    read: Callable[[dict[str, Any], str], Any] | None
    run_group: str | None


# Every kind of item file, declared once: the tables below are read from it.
ITEM_FILES = (
    ItemFile(Kind.LAYOUT, "a case file", None, None, "cases"),
    ItemFile(
        Kind.WORKSPACE, "a workspace configuration (kind workspace)", "workspace", workspace_config_from_json, None
    ),
    ItemFile(Kind.SPARSE_LAYOUT, "a sparse batch (kind sparse)", "sparse", sparse_case_from_json, "sparse_cases"),
    ItemFile(
        Kind.SPARSE_WORKSPACE,
        "a sparse workspace configuration (kind sparse-workspace)",
        "sparse-workspace",
        sparse_workspace_config_from_json,
        "sparse_workspace_configs",
    ),
    ItemFile(
        Kind.SPARSE_MASK, "a top-k mask case (kind topk-mask)", "topk-mask", topk_mask_case_from_json, "mask_cases"
    ),
    ItemFile(Kind.MERGE, "a merge case", None, merge_case_from_json, None),
)
_BY_KIND = {file.kind: file for file in ITEM_FILES}
# Each item kind an input file can hold, in words.
ITEM_KINDS = {file.kind: file.words for file in ITEM_FILES}
# The values of an item file's "kind" field and the item kind each names.
KIND_FIELD = {file.field_value: file.kind for file in ITEM_FILES if file.field_value is not None}
# The kinds ``parity run --cases`` (and gate) reads as a suite; ``parity diff FILE`` reads every kind.
RUN_KINDS = tuple(file.kind for file in ITEM_FILES if file.run_group is not None)
# Files the harness writes that hold no item, by a field only they have, and what reads each.
_NOT_ITEMS = (
    ("entries", "a baseline", "parity gate --baseline {} reads it"),
    ("provenance", "a run report (parity run --json)", "no command reads it back as input"),
)


def item_kind(data: Any, source: str) -> Kind:
    """The item kind (a key of :data:`ITEM_KINDS`) of an input file's JSON, by its
    ``"kind"`` or, without one, by its fields: an object with ``index_topk`` is a
    sparse item (a top-k mask case with ``seq_lens``, a sparse batch with
    ``context_lens``, else a sparse workspace configuration), one with
    ``pattern`` and ``num_tokens`` a merge case, anything else (not an object
    included) a case file, which its own checks refuse when it is none."""
    if not isinstance(data, dict):
        return Kind.LAYOUT
    if "kind" in data:
        kind = data["kind"]
        if kind not in KIND_FIELD:
            raise CaseError(source, "kind", f"must be one of {', '.join(KIND_FIELD)}, got {json.dumps(kind)}")
        return KIND_FIELD[kind]
    for field, what, reader in _NOT_ITEMS:
        if field in data:
            raise CaseError(source, None, f"is {what}, not a case or item file: {reader.format(source)}")
    if "index_topk" in data:
        if "seq_lens" in data:
            return Kind.SPARSE_MASK
        return Kind.SPARSE_LAYOUT if "context_lens" in data else Kind.SPARSE_WORKSPACE
    if "pattern" in data and "num_tokens" in data:
        return Kind.MERGE
    return Kind.LAYOUT


def is_case_file(kind: Kind) -> bool:
    """Whether a file of item kind ``kind`` is a case file: one case or a list
    of them (``{"cases": [...]}``, read by :func:`_cases_of`), not one item."""
    return _BY_KIND[kind].read is None


def reader_of(kind: str, path: str) -> str:
    """The commands that read a file of item kind ``kind``, as a user would type them."""
    if kind in RUN_KINDS:
        return f"parity run --cases {path} or parity diff {path} reads it"
    return f"parity diff {path} reads it"


def _item_from_json(kind: str, data: dict[str, Any], source: str) -> Any:
    """The one item of a single-item file of ``kind`` (not ``layout``), checked."""
    read = _BY_KIND[Kind(kind)].read
    assert read is not None, f"a {kind} file holds a list of cases, not one item"
    return read(data, source)


def load_item_file(path: Path) -> tuple[str, Any]:
    """An item file: ``("layout", cases)`` for a case file (one case or
    ``{"cases": [...]}``), else ``(kind, item)`` for the one item of another
    kind (:func:`item_kind`: merge, workspace, sparse-layout, sparse-workspace,
    sparse-mask). Anything else is a :class:`CaseError` naming the file."""
    source = str(path)
    if path.is_dir():
        raise CaseError(source, None, "is a folder, not a case or find file")
    data = read_json(path, source)
    if not isinstance(data, dict):
        raise CaseError(source, None, "must hold a JSON object (a case, a merge case or a workspace config)")
    kind = item_kind(data, source)
    if is_case_file(kind):
        if "context_lens" not in data and "cases" not in data:
            raise CaseError(source, None, "is neither a case, a sparse item, a merge case nor a workspace config")
        return Kind.LAYOUT, _cases_of(data, source)
    return kind, _item_from_json(kind, data, source)


@dataclass(frozen=True)
class RunFiles:
    """What ``--cases`` files hold for a run: layout cases (prefill cases those
    with a numeric section), sparse batches (sparse L3 cases those with one),
    sparse workspace configurations and top-k mask cases, in file order."""

    cases: tuple[Case, ...] = ()
    sparse_cases: tuple[SparseCase, ...] = ()
    sparse_workspace_configs: tuple[SparseWorkspaceConfig, ...] = ()
    mask_cases: tuple[TopkMaskCase, ...] = ()

    def items(self) -> tuple[Any, ...]:
        return (*self.cases, *self.sparse_cases, *self.sparse_workspace_configs, *self.mask_cases)


def load_run_file(path: Path) -> RunFiles:
    """One ``--cases`` file read by its kind (:func:`item_kind`); a kind a run
    cannot hold (a merge case, a workspace configuration) is refused in one
    line naming the file, the kind and the command that reads it."""
    source = str(path)
    data = read_json(path, source)
    kind = item_kind(data, source)
    if is_case_file(kind):
        return RunFiles(cases=tuple(_cases_of(data, source)))
    if kind not in RUN_KINDS:
        raise CaseError(
            source, None, f"is {ITEM_KINDS[kind]}, which parity run --cases does not read: {reader_of(kind, source)}"
        )
    group = _BY_KIND[Kind(kind)].run_group
    assert group is not None
    return RunFiles(**{group: (_item_from_json(kind, data, source),)})


def load_run_files(paths: list[Path]) -> RunFiles:
    """Every item of ``--cases`` files and folders (``*.json`` inside, sorted by
    path), each file read by its kind; item names unique across all of them."""
    files = list(_json_files(paths))
    held: list[RunFiles] = []
    seen: dict[str, str] = {}
    for file in files:
        held.append(load_run_file(file))
        for item in held[-1].items():
            if item.name in seen:
                raise CaseError(str(file), "name", f"{item.name!r} is already defined in {seen[item.name]}")
            seen[item.name] = str(file)
    fields = (f.name for f in dataclasses.fields(RunFiles))
    return RunFiles(*(tuple(itertools.chain.from_iterable(getattr(h, name) for h in held)) for name in fields))
