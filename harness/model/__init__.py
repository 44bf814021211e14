"""The data model that flows through the harness. This package: the dense
model here, the sparse one in :mod:`.sparse`, DCP's rank views in :mod:`.dcp`;
it imports nothing of the harness, and ports may import it.

A :class:`Case` goes in; each side (the oracle and the port under test) turns it
into a :class:`Layout`; :mod:`harness.compare.dense` turns two layouts into a
:class:`~harness.compare.dense.Divergence` or nothing. Everything here is plain Python
(ints and lists, no tensors) so that layouts are cheap to compare, print and
serialise, and so a port never depends on torch or vLLM to describe its chunks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any

from harness.model.case_fields import FieldKind, extra_default, fields_to_json, rule


def alignment_unit(block_size: int, dcp_world_size: int, interleave: int, align_to_block: bool = True) -> int:
    """The chunk split alignment of SPEC section 1b.

    ``block_size`` (1 when alignment is off), widened under DCP to
    ``lcm(block_size, dcp_world_size * interleave)``.
    """
    unit = block_size if align_to_block else 1
    if dcp_world_size > 1:
        unit = math.lcm(unit, dcp_world_size * interleave)
    return unit


@dataclass(frozen=True)
class Case:
    """One heterogeneous prefill batch and the workspace it is planned into.

    Invariants (enforced by :func:`harness.cases.files.validate_case`):
    ``len(context_lens) == len(query_lens) >= 1``; every context length >= 0;
    every query length >= 1 (a prefill schedules at least one new token);
    ``workspace_size`` is at least one :func:`alignment_unit`.
    """

    name: str = rule(FieldKind.NAME, "the case's name: its item ids are NAME[KIND]", first=True)
    context_lens: tuple[int, ...] = rule(
        FieldKind.INTS, "context tokens per request", minimum=0, limit="context_len", floor=lambda case: 0
    )
    query_lens: tuple[int, ...] = rule(
        FieldKind.INTS, "new tokens per request (a prefill schedules at least one)", minimum=1, limit="query_len",
        floor=lambda case: 1,
    )  # fmt: skip
    block_size: int = rule(FieldKind.INT, "KV cache block size", minimum=1, limit="block_size")
    workspace_size: int = rule(
        FieldKind.INT, "workspace rows (at least one alignment unit)", minimum=1, limit="workspace_size",
        floor=lambda case: case.alignment,
    )  # fmt: skip
    dcp_world_size: int = rule(FieldKind.INT, "decode context parallel ranks", 1, minimum=1, limit="dcp_world_size")
    cp_kv_cache_interleave_size: int = rule(
        FieldKind.INT, "tokens per rank in turn under DCP", 1, minimum=1, limit="cp_kv_cache_interleave_size"
    )
    align_to_block: bool = rule(FieldKind.BOOL, "split chunks on block boundaries", True)
    family: str = rule(
        FieldKind.TEXT, "the family it was generated in (reports group by it)", "hand-picked", first=True
    )
    # Dimensions and seed for the numeric levels (L3); None: layout only.
    numeric: NumericSpec | None = rule(FieldKind.NUMERIC, "makes it an L3 case too (below)", None)
    # Fields declared from outside the harness (harness.model.case_fields.register_field), as (name, value).
    # Keyed only when set: a case without extras keys the oracle cache as before they existed.
    extras: tuple[tuple[str, Any], ...] = field(default=(), metadata={"keyed_when_set": True})

    def extra(self, name: str) -> Any:
        """A registered extra field's value (its default when the case does not set it)."""
        return dict(self.extras).get(name, extra_default(Case, name))

    @property
    def num_requests(self) -> int:
        return len(self.context_lens)

    @property
    def query_start_loc(self) -> list[int]:
        """Prefix sums of ``query_lens``, length ``num_requests + 1``, from 0."""
        loc = [0]
        for q in self.query_lens:
            loc.append(loc[-1] + q)
        return loc

    @property
    def alignment(self) -> int:
        return alignment_unit(
            self.block_size, self.dcp_world_size, self.cp_kv_cache_interleave_size, self.align_to_block
        )

    @property
    def row_budget(self) -> int:
        """Workspace rows one chunk may occupy (per rank under DCP)."""
        return self.workspace_size // self.dcp_world_size

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)


@dataclass(frozen=True)
class WorkspaceConfig:
    """The engine settings that decide the dense MLA chunked-prefill workspace size."""

    max_model_len: int = rule(FieldKind.INT, "the longest sequence the engine admits", minimum=1)
    max_num_seqs: int = rule(FieldKind.INT, "the most sequences one step schedules", minimum=1)
    block_size: int = rule(FieldKind.INT, "KV cache block size", minimum=1)
    dcp_world_size: int = rule(FieldKind.INT, "decode context parallel ranks", 1, minimum=1)
    cp_kv_cache_interleave_size: int = rule(FieldKind.INT, "tokens per rank in turn under DCP", 1, minimum=1)

    @property
    def name(self) -> str:
        return (
            f"workspace/len{self.max_model_len}-seqs{self.max_num_seqs}-blk{self.block_size}"
            f"-dcp{self.dcp_world_size}x{self.cp_kv_cache_interleave_size}"
        )


_FIELDS: dict[type, tuple[Any, ...]] = {}


def _fields(cls: type) -> tuple[Any, ...]:
    """``dataclasses.fields`` of a model class, looked up once."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = fields(cls)
    return found


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    found = _FIELD_NAMES.get(cls)
    if found is None:
        found = _FIELD_NAMES[cls] = tuple(f.name for f in _fields(cls))
    return found


@dataclass(frozen=True)
class Chunk:
    """One workspace-sized chunk of paged context, as SPEC section 1b defines it.

    Invariants a correct planner keeps: ``request_start < request_end``; only the
    first request may start mid-context (``is_continuation == starts[0] > 0``);
    ``cu_seq_lens`` is the prefix sum of ``seq_lens`` from 0; ``token_to_seq``
    names the chunk-local request of every gathered row; ``query_start_loc`` is
    chunk-local (starts at 0). The DCP fields are ``None`` without DCP.
    """

    index: int
    request_start: int
    request_end: int
    token_start: int
    token_end: int
    continuation_token_end: int
    is_continuation: bool
    num_context_tokens: int
    query_start_loc: tuple[int, ...]
    max_query_len: int
    cu_seq_lens: tuple[int, ...]
    starts: tuple[int, ...]
    seq_lens: tuple[int, ...]
    max_seq_len: int
    token_to_seq: tuple[int, ...]
    # Decode-context-parallel only.
    local_starts: tuple[int, ...] | None = None
    padded_local_seq_lens: tuple[int, ...] | None = None
    padded_local_cu_seq_lens: tuple[int, ...] | None = None
    padded_local_token_to_seq: tuple[int, ...] | None = None
    local_context_lens_allranks: tuple[tuple[int, ...], ...] | None = None
    num_local_context_tokens: int | None = None

    # The three lists below are computed once (per-chunk loops over tens of
    # thousands of layouts call them): callers get a fresh list each time.
    @classmethod
    def field_names(cls) -> list[str]:
        return list(_field_names(cls))

    @classmethod
    def sequence_field_names(cls) -> list[str]:
        """Fields that hold a ``tuple`` of ints (``local_context_lens_allranks``,
        a tuple of such tuples, is not among them)."""
        return [f.name for f in _fields(cls) if str(f.type).startswith("tuple[int, ...]")]

    @classmethod
    def optional_field_names(cls) -> list[str]:
        """The decode-context-parallel fields: ``None`` without DCP."""
        return [f.name for f in _fields(cls) if str(f.type).endswith("| None")]

    def to_json(self) -> dict[str, Any]:
        """JSON form; the per-row ``token_to_seq`` fields are run-length encoded
        as ``[[value, count], ...]`` because they hold one entry per context row."""
        out: dict[str, Any] = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if name.endswith("token_to_seq") and value is not None:
                value = run_length(value)
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[name] = value
        return out


def _ints(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"chunk field {name!r} must be a list of integers")
    return tuple(value)


def chunk_from_json(data: Any, max_rows: int | None = None) -> Chunk:
    """The inverse of :meth:`Chunk.to_json`, checking types (for ports that speak JSON).

    ``max_rows`` bounds each run-length field's total before it is expanded: a
    reply of a few bytes must not make the harness build a tuple of 10^12 rows.
    """
    if not isinstance(data, dict):
        raise ValueError("a chunk must be a JSON object")
    missing = [n for n in Chunk.field_names() if n not in data]
    if missing:
        raise ValueError(f"chunk lacks field {missing[0]!r}")
    values: dict[str, Any] = {}
    for name in Chunk.field_names():
        value = data[name]
        if value is None:
            values[name] = None
        elif name.endswith("token_to_seq"):
            if not isinstance(value, list) or not all(isinstance(r, list) and len(r) == 2 for r in value):
                raise ValueError(f"chunk field {name!r} must be run-length pairs [[value, count], ...]")
            for run in value:
                _ints(run, name)
                if run[1] < 0:
                    raise ValueError(f"chunk field {name!r} has a negative run length {run[1]}")
            total = sum(count for _, count in value)
            if max_rows is not None and total > max_rows:
                allowed = f"more than the {max_rows} the case allows it"
                raise ValueError(f"chunk field {name!r} runs to {total} rows, {allowed}")
            values[name] = expanded_runs(value)
        elif name == "local_context_lens_allranks":
            if not isinstance(value, list):
                raise ValueError(f"chunk field {name!r} must be a list of lists")
            values[name] = tuple(_ints(ranks, name) for ranks in value)
        elif name == "is_continuation":
            if not isinstance(value, bool):
                raise ValueError("chunk field 'is_continuation' must be true or false")
            values[name] = value
        elif isinstance(value, list):
            values[name] = _ints(value, name)
        elif isinstance(value, int) and not isinstance(value, bool):
            values[name] = value
        else:
            raise ValueError(f"chunk field {name!r} has an unexpected {type(value).__name__}")
    return Chunk(**values)


def layout_from_json(data: Any, max_rows: int | None = None, max_chunks: int | None = None) -> Layout:
    """The inverse of :meth:`Layout.to_json`, checking types; ``max_rows`` bounds
    the rows of all run-length fields of all chunks together (each field's runs
    are summed before it is expanded, :func:`chunk_from_json`), ``max_chunks``
    the number of chunks, both known from the case a port was asked to plan."""
    if not isinstance(data, dict) or not isinstance(data.get("chunks"), list):
        raise ValueError("a layout must be an object with a list of chunks")
    if max_chunks is not None and len(data["chunks"]) > max_chunks:
        raise ValueError(f"a layout of {len(data['chunks'])} chunks, more than the case's {max_chunks} context rows")
    slices = data.get("empty_token_slices", [])
    if not isinstance(slices, list) or not all(isinstance(s, list) and len(s) == 2 for s in slices):
        raise ValueError("empty_token_slices must be a list of [start, stop] pairs")
    pairs = tuple((a, b) for a, b in (_ints(pair, "empty_token_slices") for pair in slices))
    chunks, rows_left = [], max_rows
    for c in data["chunks"]:
        chunk = chunk_from_json(c, rows_left)
        if rows_left is not None:
            rows_left -= len(chunk.token_to_seq) + len(chunk.padded_local_token_to_seq or ())
            if rows_left < 0:
                raise ValueError(f"the layout's token_to_seq fields run to more than the case's {max_rows} rows")
        chunks.append(chunk)
    return Layout(tuple(chunks), pairs)


def expanded_runs(runs: list[list[int]]) -> tuple[int, ...]:
    """The values :func:`run_length` encoded, in order (expanded in C: a chunk
    holds tens of thousands of row indices, a ci run millions)."""
    return tuple(itertools.chain.from_iterable(itertools.repeat(value, count) for value, count in runs))


def run_length(values: tuple[int, ...] | list[int]) -> list[list[int]]:
    """``[[value, count], ...]`` of each run of equal values, in order."""
    # groupby walks the values in C: six times the speed of a Python loop
    # on a chunk's tens of thousands of row indices.
    return [[value, len(list(run))] for value, run in itertools.groupby(values)]


@dataclass(frozen=True)
class Layout:
    """A side's whole plan for one case: its chunks and the token slices of the
    prefills without context (whose context partial is output 0, LSE -inf).

    A batch in which no request has context has no chunked-context metadata at
    all: both tuples are empty.
    """

    chunks: tuple[Chunk, ...]
    empty_token_slices: tuple[tuple[int, int], ...] = field(default=())

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    def rows_used(self) -> int:
        """Workspace rows the chunks occupy (local rows under DCP)."""
        total = 0
        for chunk in self.chunks:
            total += (
                chunk.num_local_context_tokens
                if chunk.num_local_context_tokens is not None
                else chunk.num_context_tokens
            )
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "num_chunks": self.num_chunks,
            "empty_token_slices": [list(s) for s in self.empty_token_slices],
            "chunks": [c.to_json() for c in self.chunks],
        }

    def digest(self) -> str:
        """A short hash of the whole layout (results rows record it, to tell
        within one run whether L3 ran on the layout L1 compared): two checked
        layouts (:func:`harness.protocol.port.check_layout`: plain ints, bools
        where bools belong) have the same one exactly when they are equal, up
        to the 64 bits kept of SHA-256.

        Every value is written with its kind and its length (a tuple's
        elements, a text's bytes) before it, so the bytes read back one way;
        the row maps (millions of ints in a ci run) go in as little-endian
        64-bit integers, not as text."""
        import hashlib

        hashed = hashlib.sha256()
        _hash_values(hashed, (len(self.chunks), self.empty_token_slices))
        for chunk in self.chunks:
            _hash_values(hashed, [getattr(chunk, name) for name in _field_names(Chunk)])
        return hashed.hexdigest()[:16]


def _hash_values(hashed: Any, values: Any) -> None:
    """Feed ``values`` (ints, bools, None and tuples of them, nested) to
    ``hashed``, each tagged with its kind and length (see :meth:`Layout.digest`)."""
    import array
    import sys

    for value in values:
        if value is None:
            hashed.update(b"N")
        elif type(value) is bool:
            hashed.update(b"T" if value else b"F")
        elif type(value) is int:
            hashed.update(b"i%d;" % value)
        elif type(value) is tuple and (not value or type(value[0]) is int):
            try:
                packed = array.array("q", value)
            except (OverflowError, TypeError):
                # Beyond 64 bits (or not all ints): as text, tagged apart.
                _hash_text(hashed, b"x", ",".join(map(repr, value)))
                continue
            if sys.byteorder == "big":
                packed.byteswap()
            hashed.update(b"t%d;" % len(value))
            hashed.update(packed.tobytes())
        elif type(value) is tuple:
            hashed.update(b"u%d;" % len(value))
            _hash_values(hashed, value)
        else:
            _hash_text(hashed, b"r", repr(value))


def _hash_text(hashed: Any, tag: bytes, text: str) -> None:
    encoded = text.encode()
    hashed.update(tag + b"%d;" % len(encoded) + encoded)


# -- numeric levels (L2, L3) ------------------------------------------------------------

NUMERIC_DTYPES = ("bf16", "fp16", "fp32")

# What the shared attention kernels return for a query row that sees no key
# (SPEC 1a: the legacy grid hands the backend such rows; seeds/003):
#   "neg-inf": output 0, LSE -inf, the ideal that needs no neutralising;
#   "pos-inf": output 0, LSE +inf, FlashAttention's convention;
#   "finite":  a finite LSE and undefined (garbage) output, as the backends
#              that seeds/003 neutralises against.
KEYLESS_ROWS = ("neg-inf", "pos-inf", "finite")


def _dimension(doc: str) -> Any:
    """A numeric section's model dimension: required unless a preset gives it."""
    return rule(FieldKind.INT, doc, minimum=1, maximum=4096, default_doc="(required, or a preset's)")


@dataclass(frozen=True)
class NumericSpec:
    """Model dimensions and seed for a case's L3 tensors, and the shared kernels'
    behaviour on query rows without keys (:data:`KEYLESS_ROWS`).

    ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim``; the latent cache row is
    ``kv_lora_rank + qk_rope_head_dim`` wide. ``keyless_rows`` changes no tensor
    of the case's inputs, only what the kernels report for keyless rows, and both
    sides of a comparison run under the same one.
    """

    num_heads: int = _dimension("attention heads")
    qk_nope_head_dim: int = _dimension("query/key head size without rope")
    qk_rope_head_dim: int = _dimension("query/key rope head size")
    v_head_dim: int = _dimension("value head size")
    kv_lora_rank: int = _dimension("the latent (compressed KV) width")
    dtype: str = rule(
        FieldKind.CHOICE, "the tensors' dtype", "bf16", choices=NUMERIC_DTYPES, default_doc='`"bf16"` (or a preset\'s)'
    )
    seed: int = rule(FieldKind.INT, "the seed every tensor is drawn from", 0, minimum=0, maximum=(1 << 63) - 1)
    # Written only when not the default, so cases from before it existed keep
    # byte-identical JSON (and results files).
    keyless_rows: str = rule(
        FieldKind.CHOICE, "what the kernels report for a query row without keys", KEYLESS_ROWS[0],
        choices=KEYLESS_ROWS, always=False,
    )  # fmt: skip

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)


PRESETS: dict[str, NumericSpec] = {
    # Small enough for Triton's interpreter on a 2-core CPU (about 1.6 ms per
    # (token, head) merge program), wide enough to exercise every code path.
    "tiny": NumericSpec(num_heads=2, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, kv_lora_rank=32),
    # One head and 8-wide heads: the merge's cost is per (token, head), so L3
    # batches of hundreds of requests stay affordable; v still narrower than qk.
    "narrow": NumericSpec(num_heads=1, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, kv_lora_rank=16),
    "deepseek-v2-lite": NumericSpec(
        num_heads=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=512
    ),
    "deepseek-v3": NumericSpec(
        num_heads=128, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=512
    ),
}


MERGE_PATTERNS = (
    "random",  # finite LSEs of similar size
    "neg-inf-both",  # both sides empty: output 0, LSE -inf
    "neg-inf-prefix",  # empty context: the suffix alone
    "neg-inf-suffix",
    "pos-inf",  # FA2's +inf for an empty side, against finite, +inf and -inf
    "visible-gap",  # gaps 0-18.6: the weaker side only partly visible in the output dtype
    "large-gap",  # gaps 16-88: the weaker side's weight normal in fp32 but invisible
    "underflow-gap",  # gaps 86-106 (exp(-gap) an fp32 denormal, then 0) and far beyond
    "tiny-lse",  # LSEs of -0.0, +0.0 and fp32 denormals, against tiny, finite and infinite ones
    "mixed",  # every one of the above, element by element
)

# How a merge case lays out its LSEs ``[num_heads, num_tokens]`` in memory
# (both LSEs, on both sides of a comparison):
#   "contiguous":   a tensor of its own;
#   "column-slice": columns of a wider ``[num_heads, N]`` buffer, as the context
#                   loop merges ``output_lse[:, start:stop]`` with a chunk's
#                   ``lse[:, :n]`` (head strides differ between the two LSEs);
#   "transposed":   the transpose of a contiguous ``[num_tokens, num_heads]``
#                   tensor, as a backend that reports LSEs token-major hands over.
MERGE_LSE_VIEWS = ("contiguous", "column-slice", "transposed")

# How a merge case lays out its partial outputs ``[num_tokens, num_heads, head_size]``:
#   "contiguous":     a tensor of its own;
#   "head-dim-slice": ``[..., :head_size]`` of a buffer whose heads are wider
#                     (``forward_mha`` cuts partials padded to the qk head size
#                     down to ``v_head_dim``), the prefix also rows into it.
MERGE_VALUE_VIEWS = ("contiguous", "head-dim-slice")


@dataclass(frozen=True)
class MergeCase:
    """One L2 input: two partials ``[num_tokens, num_heads, head_size]`` with
    fp32 LSEs ``[num_heads, num_tokens]``; tokens at and past
    ``prefill_tokens_with_context`` take the suffix unmerged (None: every token
    is merged). ``lse_view`` (:data:`MERGE_LSE_VIEWS`) and ``value_view``
    (:data:`MERGE_VALUE_VIEWS`) say how the inputs are laid out in memory; they
    change no value the merge reads."""

    name: str = rule(FieldKind.NAME, "the case's name", first=True)
    num_tokens: int = rule(FieldKind.INT, "tokens (rows of each partial)", minimum=1, maximum=4096)
    num_heads: int = rule(FieldKind.INT, "attention heads", minimum=1, maximum=4096)
    head_size: int = rule(FieldKind.INT, "values per head", minimum=1, maximum=4096)
    dtype: str = rule(FieldKind.CHOICE, "the partials' dtype", choices=NUMERIC_DTYPES)
    pattern: str = rule(FieldKind.CHOICE, "how the LSEs are drawn (below)", choices=MERGE_PATTERNS)
    seed: int = rule(FieldKind.INT, "the draw's seed", minimum=None)
    prefill_tokens_with_context: int | None = rule(
        FieldKind.INT, "tokens merged with the prefix (null: every token)", None, minimum=None, optional=True
    )
    family: str = rule(FieldKind.TEXT, "the family it was generated in", "merge", first=True)
    # Written only when not the default, so cases from before the views
    # existed keep byte-identical JSON (and results files).
    lse_view: str = rule(
        FieldKind.CHOICE, "the LSEs' memory layout", MERGE_LSE_VIEWS[0], choices=MERGE_LSE_VIEWS, always=False
    )
    value_view: str = rule(
        FieldKind.CHOICE, "the values' memory layout", MERGE_VALUE_VIEWS[0], choices=MERGE_VALUE_VIEWS, always=False
    )

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)
