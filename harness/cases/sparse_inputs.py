"""The sparse path's inputs: checked item files and the top-k indices they stand for.

A sparse item file is a JSON object with ``"kind"``: ``"sparse"`` (a
:class:`~harness.model.sparse.SparseCase`), ``"sparse-workspace"`` (a
:class:`~harness.model.sparse.SparseWorkspaceConfig`) or ``"topk-mask"`` (a
:class:`~harness.model.sparse.TopkMaskCase`, optionally with explicit indices
``"topk"``: per request, per query row, ``index_topk`` integers); an object
without a kind is recognised by its fields as one of these when it has
``index_topk`` (:func:`harness.cases.files.item_kind`). Anything
wrong is a :class:`~harness.cases.files.CaseError` naming the file, the field and the
reason. An index outside ``[0, sequence length)`` other than ``-1`` is refused:
upstream's mask builder never checks one and would set bits past the row, so
such a case is bad input, never a parity case.

:func:`materialise_topk` turns a mask case into int32 tensors, deterministically
from its seed; both sides get their own copy of the same values.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from harness.cases.fields import LIMITS, CaseError, fields_from_json
from harness.model.sparse import (
    ROW_PATTERNS,
    TOPK_PATTERNS,
    MaskForm,
    SparseCase,
    SparseWorkspaceConfig,
    TopkMaskCase,
)

if TYPE_CHECKING:
    import torch

    from harness.kernels.draws import Draws

# A mask case's indices (rows times index_topk) and its mask's words, bounded
# likewise: the oracle interprets one Triton program per mask row.
MAX_TOPK_ELEMENTS = 1 << 24
MAX_MASK_WORDS = 1 << 22


def _missing(data: dict[str, Any], names: tuple[str, ...], source: str) -> None:
    for name in names:
        if name not in data:
            raise CaseError(source, name, "is missing")


def _family(data: dict[str, Any], default: str, source: str) -> str:
    value = data.get("family", default)
    if not isinstance(value, str) or not value:
        raise CaseError(source, "family", f"must be a non-empty string, got {json.dumps(value)}")
    return value


def _name(data: dict[str, Any], source: str) -> str:
    """A name an item id can carry (``NAME[KIND]``): no spaces, no brackets."""
    value = data["name"]
    if not isinstance(value, str) or not value or any(c.isspace() or c in "[]" for c in value):
        raise CaseError(
            source, "name", f"must be a non-empty string without spaces or brackets, got {json.dumps(value)}"
        )
    return value


def sparse_workspace_config_from_json(data: dict[str, Any], source: str) -> SparseWorkspaceConfig:
    """A sparse workspace configuration, each field by its declaration; a
    ``name`` given must be the one its fields make."""
    values, _ = fields_from_json(
        SparseWorkspaceConfig, data, source, "a sparse-workspace", accepted=("kind", "description", "name")
    )
    config = SparseWorkspaceConfig(**values)
    given_name = data.get("name")
    if given_name is not None and given_name != config.name:
        raise CaseError(source, "name", f"{json.dumps(given_name)} is not this configuration's name {config.name}")
    return config


def sparse_case_from_json(data: dict[str, Any], source: str) -> SparseCase:
    """A sparse batch, each field by its declaration (:class:`SparseCase`),
    then what the fields must hold together."""
    values, _ = fields_from_json(SparseCase, data, source, "a sparse-case", accepted=("kind", "description"))
    context, query = values["context_lens"], values["query_lens"]
    if len(context) != len(query):
        raise CaseError(source, "query_lens", f"has {len(query)} entries but context_lens has {len(context)}")
    if sum(context) > LIMITS["total_context"]:
        raise CaseError(source, "context_lens", f"total context {sum(context)} exceeds {LIMITS['total_context']}")
    case = SparseCase(**values)
    if case.numeric is not None:
        if case.dcp_world_size > 1:
            raise CaseError(source, "numeric", "a sparse L3 case runs without DCP (dcp_world_size must be 1)")
        if sum(query) * case.index_topk > MAX_TOPK_ELEMENTS:
            raise CaseError(
                source, "index_topk", f"{sum(query)} tokens x {case.index_topk} indices exceed {MAX_TOPK_ELEMENTS}"
            )
    return case


def _topk_field(value: Any, case: TopkMaskCase, source: str) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Explicit indices: per request a ``[query_len][index_topk]`` list of ints,
    each -1 or inside ``[0, sequence length)``."""
    if not isinstance(value, list) or len(value) != case.num_requests:
        raise CaseError(
            source, "topk", f"must be a list of {case.num_requests} requests' [query_len][index_topk] lists"
        )
    out = []
    for r, rows in enumerate(value):
        where = f"topk[{r}]"
        if not isinstance(rows, list) or len(rows) != case.query_lens[r]:
            raise CaseError(source, where, f"must hold {case.query_lens[r]} query rows (shape [query_len, index_topk])")
        request = []
        for q, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != case.index_topk:
                raise CaseError(source, f"{where}[{q}]", f"must hold index_topk={case.index_topk} indices")
            for k, index in enumerate(row):
                if isinstance(index, bool) or not isinstance(index, int):
                    raise CaseError(source, f"{where}[{q}][{k}]", f"must be an int32 index, got {json.dumps(index)}")
                if index != -1 and not 0 <= index < case.seq_lens[r]:
                    raise CaseError(
                        source,
                        f"{where}[{q}][{k}]",
                        f"index {index} is outside [0, {case.seq_lens[r]}) and not -1 "
                        "(upstream's mask builder would set bits past the row)",
                    )
            request.append(tuple(row))
        out.append(tuple(request))
    return tuple(out)


def topk_mask_case_from_json(data: dict[str, Any], source: str) -> TopkMaskCase:
    """A top-k mask case, each field by its declaration (:class:`TopkMaskCase`),
    then what the fields must hold together."""
    values, _ = fields_from_json(TopkMaskCase, data, source, "a topk-mask", accepted=("kind", "description"))
    query, seqs, topk, form = values["query_lens"], values["seq_lens"], values["index_topk"], values["form"]
    if len(seqs) != len(query):
        raise CaseError(source, "seq_lens", f"has {len(seqs)} entries but query_lens has {len(query)}")
    if sum(query) * topk > MAX_TOPK_ELEMENTS:
        raise CaseError(source, "index_topk", f"{sum(query)} rows x {topk} indices exceed {MAX_TOPK_ELEMENTS}")
    if form == MaskForm.SINGLE and len(query) != 1:
        raise CaseError(source, "form", f"'single' takes one request, got {len(query)}")
    if form == MaskForm.BATCHED and len(query) < 2:
        raise CaseError(source, "form", "'batched' takes two requests or more (one runs the single-request kernel)")
    tile = 128 if max(query) <= 128 else 256
    mask_words = len(query) * (-(-max(query) // tile) * tile) * (-(-max(seqs) // 32) + 1)
    if mask_words > MAX_MASK_WORDS:
        raise CaseError(source, "seq_lens", f"the mask would take {mask_words} words, more than {MAX_MASK_WORDS}")
    for field in ("range_starts", "range_lens", "key_starts"):
        per_request = values.get(field, ())
        if per_request and len(per_request) != len(query):
            raise CaseError(source, field, f"has {len(per_request)} entries for {len(query)} requests")
    case = TopkMaskCase(**{**values, "topk": None})
    if values.get("topk") is not None:
        case = dataclasses.replace(case, topk=_topk_field(values["topk"], case, source))
    return case


# -- the indices ----------------------------------------------------------------------------


def boundary_positions(case: TopkMaskCase, request: int) -> list[int]:
    """Where an off-by-one shows: 0 and len-1 of the sequence, each range's first
    and last row and the rows either side, and the key start."""
    length = case.seq_lens[request]
    start, span = case.range_starts[request], case.range_lens[request]
    spots = {0, length - 1, start - 1, start, start + 1, start + span - 1, start + span, start + span + 1}
    spots |= {31, 32, 33, 63, 64}  # word edges
    if case.key_starts:
        spots |= {case.key_starts[request] - 1, case.key_starts[request]}
    return sorted(p for p in spots if 0 <= p < length)


def _rows(case: TopkMaskCase, request: int, pattern: str, rows: int, draws: Draws) -> torch.Tensor:
    import numpy as np
    import torch

    length, k = case.seq_lens[request], case.index_topk
    if pattern in ROW_PATTERNS:
        return _edge_rows(pattern, length, k, rows, draws)
    if pattern == "uniform":
        return torch.from_numpy(draws.integers(0, length, (rows, k)).astype(np.int32))
    if pattern == "boundary":
        spots = np.array(boundary_positions(case, request), dtype=np.int32)
        chosen = spots[draws.integers(0, len(spots), (rows, k))]
        free = draws.uniform((rows, k)) < 0.25
        return torch.from_numpy(np.where(free, draws.integers(0, length, (rows, k)).astype(np.int32), chosen))
    if pattern == "duplicates":
        pool = draws.integers(0, length, (rows, 3)).astype(np.int32)
        return torch.from_numpy(np.ascontiguousarray(pool[:, draws.integers(0, 3, (k,))]))
    # padding: a random count of selections per row, the rest -1, with a few
    # -1 slots inside the selected run as well
    chosen = draws.integers(0, length, (rows, k)).astype(np.int32)
    kept = draws.integers(0, min(k, length) + 1, (rows, 1))
    slots = np.arange(k)[None, :]
    holes = draws.uniform((rows, k)) < 0.05
    return torch.from_numpy(np.where((slots < kept) & ~holes, chosen, np.int32(-1)).astype(np.int32))


def _edge_rows(pattern: str, length: int, k: int, rows: int, draws: Draws) -> torch.Tensor:
    """Rows of :data:`ROW_PATTERNS`: full (distinct indices in every slot the
    sequence can fill), single (one index at a random slot) or empty."""
    import numpy as np
    import torch

    empty = np.full((rows, k), -1, dtype=np.int32)
    if pattern == "empty" or length == 0:
        return torch.from_numpy(empty)
    if pattern == "single":
        slot = draws.integers(0, k, (rows,))
        index = draws.integers(0, length, (rows,)).astype(np.int32)
        empty[np.arange(rows), slot] = index
        return torch.from_numpy(empty)
    distinct = draws.argsort_rows(rows, length)[:, :k].astype(np.int32)
    empty[:, : distinct.shape[1]] = distinct
    return torch.from_numpy(empty)


def materialise_topk(case: TopkMaskCase) -> list[torch.Tensor]:
    """Per request, the int32 ``[query_len, index_topk]`` indices of ``case``:
    every value -1 or in ``[0, seq_len)``; a fresh tensor on every call. Drawn in
    order from the case's one stream ``topk`` (:mod:`harness.kernels.draws`)."""
    import torch

    from harness.kernels.draws import Draws

    if case.topk is not None:
        return [torch.tensor(rows, dtype=torch.int32).reshape(len(rows), case.index_topk) for rows in case.topk]
    draws = Draws(case.seed, "topk")
    out = []
    for request, rows in enumerate(case.query_lens):
        if case.pattern != "mixed":
            out.append(_rows(case, request, case.pattern, rows, draws).contiguous())
            continue
        parts = [
            _rows(case, request, TOPK_PATTERNS[int(p)], 1, draws)
            for p in draws.integers(0, len(TOPK_PATTERNS) - 1, (rows,))
        ]
        out.append(torch.cat(parts).contiguous())
    return out
