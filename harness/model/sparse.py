"""The sparse MLA path's data model (SPEC section 1d): what goes in, what each side returns.

Three kinds of item, each plain Python like :mod:`harness.model`:

- :class:`SparseCase` (level ``sparse-layout``): a prefill batch with its engine
  settings. Each side sizes the *sparse* workspace from the settings, plans the
  batch's context chunks into it, and decides the batch's route (dense MHA,
  masked MHA or sparse MQA) and the shapes of its top-k masks: a
  :class:`SparseLayout`.
- :class:`SparseWorkspaceConfig` (level ``sparse-layout``, kind
  ``sparse-workspace``): the settings that decide the sparse workspace size.
- :class:`TopkMaskCase` (level ``sparse-mask``): seeded top-k indices for a few
  requests; each side builds the bit-packed mask and remaps the indices to key
  ranges. The tensors come from :func:`harness.cases.sparse_inputs.materialise_topk`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.model import Case, Layout, NumericSpec
from harness.model.case_fields import FieldKind, fields_to_json, rule
from harness.model.levels import TextEnum

# The sparse backends' names as their ``get_name()`` returns them in vllm 0.28.0;
# ``_use_masked_mha`` has thresholds for the first two only.
SPARSE_BACKENDS = (
    "FLASHMLA_SPARSE",
    "FLASHINFER_MLA_SPARSE",
    "FLASHINFER_MLA_SPARSE_SM120",
    "FLASH_ATTN_MLA_SPARSE",
    "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE",
)

# The mask workspace each release allocates when masked MHA is available, in
# int32 words: a case's ``mask_workspace_words`` of None means this one.
PINNED_MASK_WORKSPACE_WORDS = 128 * 1024 * 1024 // 4  # 0.28.0: 128 MiB
LEGACY_MASK_WORKSPACE_WORDS = 64 * 1024 * 1024 // 4  # 0.27.1: 64 MiB

# The masked-MHA threshold table (SPEC 1d, ``_use_masked_mha``) as the harness
# declares it: per (backend, tensor-parallel size), the minimum longest query
# for each longest-sequence bucket ``(..., edge]`` of :data:`SEQ_LEN_EDGES`
# (None: never in that bucket); past the last edge, never. Generators aim at it
# and the MC/DC table (harness/search/decisions_sparse.py) reads it; a test
# checks it against the oracle's function entry by entry.
SEQ_LEN_EDGES = (2048, 4096, 8192, 16384, 32768)
MASKED_MHA_THRESHOLDS: dict[tuple[str, int], tuple[int | None, ...]] = {
    ("FLASHMLA_SPARSE", 1): (1536, 4096, None, None, None),
    ("FLASHMLA_SPARSE", 2): (512, 1024, 4096, None, None),
    ("FLASHMLA_SPARSE", 4): (512, 1024, 1536, 8192, None),
    ("FLASHMLA_SPARSE", 8): (512, 512, 1024, 2048, 16384),
    ("FLASHINFER_MLA_SPARSE", 8): (512, 1024, 1024, 2048, 32768),
}
KEYS_PER_WORD = 32


def threshold_says_yes(minimums: tuple[int | None, ...], max_seq_len: int, max_query_len: int) -> bool:
    """One row of :data:`MASKED_MHA_THRESHOLDS` read for a batch: the first bucket
    whose edge is at least the longest sequence, then its minimum (None: no)."""
    bucket = next((k for k, edge in enumerate(SEQ_LEN_EDGES) if max_seq_len <= edge), None)
    if bucket is None:
        return False
    needed = minimums[bucket]
    return needed is not None and max_query_len >= needed


def edge_query(minimums: tuple[int | None, ...], bucket: int) -> int | None:
    """A longest query that the row ``minimums`` reads differently one side and
    the other of bucket edge ``bucket`` (longest sequence at the edge and one
    past it), or None where no query length can: both sides share a minimum."""
    edge = SEQ_LEN_EDGES[bucket]
    candidates = sorted({1, edge} | {m + d for m in minimums if m is not None for d in (-1, 0)})
    for query in candidates:
        if 0 < query <= edge and threshold_says_yes(minimums, edge, query) != threshold_says_yes(
            minimums, edge + 1, query
        ):
            return query
    return None


def mask_words(batch: int, max_query_len: int, max_key_len: int, key_starts_word: bool = False) -> int:
    """The int32 words of a top-k mask (SPEC 1d): ``batch`` x query rows padded
    to 128 (256 past 128) x ``ceil(keys / 32)`` words, plus one reserved word
    per row for the global mask. The harness's own arithmetic, used to aim
    items at an edge and to measure conditions: both sides still decide."""
    tile = 128 if max_query_len <= 128 else 256
    rows = -(-max_query_len // tile) * tile
    return batch * rows * (-(-max_key_len // KEYS_PER_WORD) + int(key_starts_word))


# The ways the prefill tokens of a sparse batch are attended (SPEC 1d), and the
# two masked routes upstream cannot run: masked MHA forced where it cannot run
# (no masked kernel: forward_mha asserts; a batch with context under DCP:
# _compute_context_mha raises), and a masked run whose masks do not fit the mask
# workspace (0.28.0's _run_masked_mha raises; 0.27.1's view of it fails).
class Route(TextEnum):
    DENSE_MHA = "dense-mha"
    MASKED_MHA = "masked-mha"
    MQA = "mqa"
    MASKED_MHA_UNAVAILABLE = "masked-mha-unavailable"
    MASKED_MHA_OVERFLOW = "masked-mha-overflow"


ROUTES: tuple[Route, ...] = tuple(Route)


# The forms a top-k mask is built in: one request (its own kernel), several
# requests (the batched kernel), or the global mask over whole sequences with
# its reserved key-starts word.
class MaskForm(TextEnum):
    SINGLE = "single"
    BATCHED = "batched"
    GLOBAL = "global"


MASK_FORMS: tuple[MaskForm, ...] = tuple(MaskForm)


# How an L3 case draws each new token's top-k indices into its request's
# sequence (context then new tokens), never past the token itself (an indexer
# is causal) but in "future", seeded per (seed, request, token):
#   "uniform":  distinct positions anywhere up to the token;
#   "boundary": clustered at block edges (where chunks and pieces split) and at
#               the context's end;
#   "recent":   the positions just before the token (early chunks see no key);
#   "early":    the first positions (later chunks and the suffix see none);
#   "sparse":   zero to two positions, the rest -1 (rows keyless everywhere);
#   "future":   anywhere in the sequence, past the token too (the suffix's
#               causal mask hides those);
#   "mixed":    each token one of the above.
SELECTIONS = ("uniform", "boundary", "recent", "early", "sparse", "future", "mixed")
# Top-k rows at their edges, never drawn by "mixed" (the sparse-l3-rows family names them):
#   "full":       exactly min(index_topk, token + 1) distinct positions: a full
#                 row wherever the token sees index_topk keys or more;
#   "single":     one position;
#   "empty":      none (every slot -1: the token is keyless everywhere);
#   "duplicates": a full row drawn from at most three positions, repeated.
ROW_SELECTIONS = ("full", "single", "empty", "duplicates")
# index_topk beyond this is refused before anything is allocated.
MAX_INDEX_TOPK = 1 << 16


@dataclass(frozen=True)
class SparseWorkspaceConfig:
    """The engine settings that decide the sparse chunked-prefill workspace size."""

    max_model_len: int = rule(FieldKind.INT, "the longest sequence the engine admits", minimum=1, maximum=1 << 40)
    max_num_seqs: int = rule(FieldKind.INT, "the most sequences one step schedules", minimum=1, maximum=1 << 30)
    block_size: int = rule(FieldKind.INT, "KV cache block size", minimum=1, limit="block_size")
    index_topk: int = rule(FieldKind.INT, "top-k indices per token", minimum=1, maximum=MAX_INDEX_TOPK)
    dcp_world_size: int = rule(FieldKind.INT, "decode context parallel ranks", 1, minimum=1, limit="dcp_world_size")
    cp_kv_cache_interleave_size: int = rule(
        FieldKind.INT, "tokens per rank in turn under DCP", 1, minimum=1, limit="cp_kv_cache_interleave_size"
    )

    family = "sparse-workspace-size"

    @property
    def name(self) -> str:
        return (
            f"sparse-workspace/len{self.max_model_len}-seqs{self.max_num_seqs}-blk{self.block_size}"
            f"-topk{self.index_topk}-dcp{self.dcp_world_size}x{self.cp_kv_cache_interleave_size}"
        )

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)


@dataclass(frozen=True)
class SparseCase:
    """One sparse prefill batch and every input of its route.

    Like :class:`harness.model.Case`, it is the *prefill* part of a step, after
    upstream's ``split_decodes_and_prefills``: every request here is a prefill,
    whatever its query length (which requests a scheduler's step counts as
    decodes is not part of this contract).

    Invariants (:func:`harness.cases.sparse_inputs.validate_sparse_case`): the batch
    fields as for :class:`harness.model.Case`; ``index_topk >= 1``;
    ``backend`` is one of :data:`SPARSE_BACKENDS`; ``tensor_parallel_size >= 1``;
    ``mask_workspace_words >= 0``, or None for the workspace the release itself
    allocates (0.28.0: 128 MiB, 0.27.1: 64 MiB). ``masked_kernel`` says whether the masked
    kernel exists for this model on this device (upstream's
    ``_is_masked_mha_available``: a Blackwell GPU, FlashAttention 4, the
    DeepSeek-V3.2 head shapes, an unquantised cache); without it there is no
    mask workspace at all. The three ``force_*`` flags are upstream's
    ``sparse_mla_force_dense_mha`` / ``_force_masked_mha`` / ``_force_mqa``.
    """

    name: str = rule(FieldKind.ITEM_NAME, "the batch's name: its item ids are NAME[KIND]", first=True)
    context_lens: tuple[int, ...] = rule(
        FieldKind.INTS, "context tokens per request", minimum=0, limit="context_len", floor=lambda case: 0
    )
    query_lens: tuple[int, ...] = rule(
        FieldKind.INTS, "new tokens per request", minimum=1, limit="query_len", floor=lambda case: 1
    )
    block_size: int = rule(FieldKind.INT, "KV cache block size", minimum=1, limit="block_size")
    max_model_len: int = rule(FieldKind.INT, "the longest sequence the engine admits", minimum=1, maximum=1 << 40)
    max_num_seqs: int = rule(FieldKind.INT, "the most sequences one step schedules", minimum=1, maximum=1 << 30)
    index_topk: int = rule(FieldKind.INT, "top-k indices per token", minimum=1, maximum=MAX_INDEX_TOPK)
    dcp_world_size: int = rule(FieldKind.INT, "decode context parallel ranks", 1, minimum=1, limit="dcp_world_size")
    cp_kv_cache_interleave_size: int = rule(
        FieldKind.INT, "tokens per rank in turn under DCP", 1, minimum=1, limit="cp_kv_cache_interleave_size"
    )
    align_to_block: bool = rule(FieldKind.BOOL, "split chunks on block boundaries", True)
    backend: str = rule(FieldKind.CHOICE, "the sparse attention backend", SPARSE_BACKENDS[0], choices=SPARSE_BACKENDS)
    tensor_parallel_size: int = rule(FieldKind.INT, "tensor parallel ranks", 1, minimum=1, maximum=1024)
    masked_kernel: bool = rule(FieldKind.BOOL, "the masked kernel exists for this model and device", True)
    mask_workspace_words: int | None = rule(
        FieldKind.INT, "the mask workspace in words (null: the release's own)", None, minimum=0, maximum=1 << 34,
        optional=True,
    )  # fmt: skip
    force_dense_mha: bool = rule(FieldKind.BOOL, "upstream's sparse_mla_force_dense_mha", False)
    force_masked_mha: bool = rule(FieldKind.BOOL, "upstream's sparse_mla_force_masked_mha", False)
    force_mqa: bool = rule(FieldKind.BOOL, "upstream's sparse_mla_force_mqa", False)
    family: str = rule(FieldKind.TEXT, "the family it was generated in", "sparse", first=True)
    # L3 (level sparse-prefill): the tensors' dimensions and seed, and how each
    # token's top-k indices are drawn (:data:`SELECTIONS`); None: L1 only.
    numeric: NumericSpec | None = rule(FieldKind.NUMERIC, "makes it a sparse L3 batch too", None, optional=True)
    # Written only for L3 cases, so L1 cases keep their JSON.
    selection: str = rule(
        FieldKind.CHOICE, "how each token's top-k indices are drawn (L3)", "mixed",
        choices=SELECTIONS + ROW_SELECTIONS, written_with="numeric",
    )  # fmt: skip

    @property
    def workspace_config(self) -> SparseWorkspaceConfig:
        return SparseWorkspaceConfig(
            self.max_model_len,
            self.max_num_seqs,
            self.block_size,
            self.index_topk,
            self.dcp_world_size,
            self.cp_kv_cache_interleave_size,
        )

    def planned_case(self, workspace_size: int) -> Case:
        """The dense planner's input: this batch in a ``workspace_size``-row workspace."""
        return Case(
            name=self.name,
            context_lens=self.context_lens,
            query_lens=self.query_lens,
            block_size=self.block_size,
            workspace_size=workspace_size,
            dcp_world_size=self.dcp_world_size,
            cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
            align_to_block=self.align_to_block,
            family=self.family,
            numeric=self.numeric,
        )

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(c + q for c, q in zip(self.context_lens, self.query_lens, strict=True))

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)


Shape = tuple[int, int, int]


@dataclass(frozen=True)
class SparseLayout:
    """A side's whole sparse plan for one :class:`SparseCase`.

    Field meanings (SPEC 1d), in the order they are compared:

    - ``workspace_size``: the sparse workspace the chunks are planned into;
    - ``layout``: the chunks and empty token slices, as the dense planner's;
    - ``prefill_max_query_len`` / ``prefill_max_seq_len``: the batch maxima the
      route reads (a sequence is context plus new tokens);
    - ``use_dense_mha``: the builder's flag (``max_seq_len <= index_topk`` and
      MQA not forced);
    - ``masked_threshold``: ``_use_masked_mha``'s verdict (backend, TP size,
      query length against the sequence-length bucket's minimum);
    - ``masks_fit``: whether the suffix and per-chunk masks fit the mask
      workspace; ``None`` for a release without that check (0.27.1);
    - ``use_masked_mha``: the whole masked condition (kernel available, no DCP,
      threshold, fit);
    - ``route``: one of :data:`ROUTES` (``masked-mha-overflow``: the masked
      route chosen, but a per-range mask it would build does not fit);
    - ``global_mask_shape`` / ``global_mask_fits``: the global mask over whole
      sequences (one reserved word per row); ``None`` for a batch without
      context, for which none is ever built;
    - ``suffix_mask_shape``: the mask the suffix attention reads (the global one
      when it fits);
    - ``chunk_mask_shapes``: per chunk, the mask its attention reads when the
      global mask does not fit.
    """

    workspace_size: int
    layout: Layout
    prefill_max_query_len: int
    prefill_max_seq_len: int
    use_dense_mha: bool
    masked_threshold: bool
    masks_fit: bool | None
    use_masked_mha: bool
    route: str
    global_mask_shape: Shape | None
    global_mask_fits: bool | None
    suffix_mask_shape: Shape
    chunk_mask_shapes: tuple[Shape, ...] = field(default=())

    # The route's fields, in comparison order (after workspace_size and layout).
    ROUTE_FIELDS = (
        "prefill_max_query_len",
        "prefill_max_seq_len",
        "use_dense_mha",
        "masked_threshold",
        "masks_fit",
        "use_masked_mha",
        "route",
        "global_mask_shape",
        "global_mask_fits",
        "suffix_mask_shape",
        "chunk_mask_shapes",
    )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workspace_size": self.workspace_size}
        for name in self.ROUTE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[name] = value
        out["layout"] = self.layout.to_json()
        return out


# How a mask case draws each query row's top-k indices (every index in
# ``[0, sequence length)`` or -1, as an indexer produces them):
#   "uniform":    distinct positions anywhere in the sequence;
#   "boundary":   clustered at the case's boundaries (0, len-1, each range's
#                 first and last row and the row after);
#   "duplicates": the same position several times in a row;
#   "padding":    few selections, the rest -1 (short sequences);
#   "mixed":      each row one of the above.
TOPK_PATTERNS = ("uniform", "boundary", "duplicates", "padding", "mixed")
# Rows at the edges of a top-k row, never drawn by "mixed" (it keeps the
# patterns above, so existing cases keep their indices): named by the cases
# aimed at them (the topk-mask-rows family):
#   "full":   every row exactly index_topk distinct valid indices (as many as
#             the sequence holds when it is shorter);
#   "single": one valid index per row, the rest -1;
#   "empty":  every slot -1.
ROW_PATTERNS = ("full", "single", "empty")


@dataclass(frozen=True)
class TopkMaskCase:
    """One L2 input of the sparse path: seeded top-k indices for each request.

    Request ``i`` has ``query_lens[i]`` query rows, each with ``index_topk``
    indices into its sequence of ``seq_lens[i]`` keys (``-1`` pads). The mask is
    built over keys ``[0, max(seq_lens))`` in ``form`` (:data:`MASK_FORMS`); the
    global form reserves one word per row and writes ``key_starts`` (one per
    request) into row 0's reserved word. The remap keeps, per request, the
    indices in ``[range_starts[i], range_starts[i] + range_lens[i])``.
    """

    name: str = rule(FieldKind.ITEM_NAME, "the case's name: its item id is NAME[sparse-mask]", first=True)
    query_lens: tuple[int, ...] = rule(FieldKind.INTS, "query rows per request", minimum=1, limit="query_len")
    seq_lens: tuple[int, ...] = rule(FieldKind.INTS, "keys per request's sequence", minimum=1, limit="context_len")
    index_topk: int = rule(FieldKind.INT, "indices per query row", minimum=1, maximum=MAX_INDEX_TOPK)
    form: str = rule(FieldKind.CHOICE, "the mask's form", choices=MASK_FORMS)
    pattern: str = rule(
        FieldKind.CHOICE, "how the indices are drawn", choices=TOPK_PATTERNS + ROW_PATTERNS,
        default_from=lambda fields: "uniform", default_doc='`"uniform"`',
    )  # fmt: skip
    seed: int = rule(
        FieldKind.INT, "the seed the indices are drawn from", minimum=0, maximum=(1 << 63) - 1,
        default_from=lambda fields: 0, default_doc="`0`",
    )  # fmt: skip
    range_starts: tuple[int, ...] = rule(
        FieldKind.INTS, "per request, the first index the remap keeps", minimum=0, limit="context_len",
        default_from=lambda fields: [0] * len(fields["query_lens"]), default_doc="`0` per request",
    )  # fmt: skip
    range_lens: tuple[int, ...] = rule(
        FieldKind.INTS, "per request, how many indices from there the remap keeps", minimum=0, limit="context_len",
        default_from=lambda fields: list(fields["seq_lens"]), default_doc="`seq_lens`",
    )  # fmt: skip
    key_starts: tuple[int, ...] = rule(
        FieldKind.INTS, "per request, its first key in the batch (the global form's reserved word); [] for none",
        (), minimum=0, limit="context_len", may_be_empty=True,
    )  # fmt: skip
    family: str = rule(FieldKind.TEXT, "the family it was generated in", "topk-mask", first=True)
    # Explicit indices (per request, per query row, index_topk ints) in place
    # of the seeded ones; None: drawn from ``seed`` by ``pattern``.
    topk: tuple[tuple[tuple[int, ...], ...], ...] | None = rule(
        FieldKind.INDICES, "explicit indices in place of the drawn ones, each -1 or a key of its sequence",
        None, optional=True, always=False,
    )  # fmt: skip

    @property
    def num_requests(self) -> int:
        return len(self.query_lens)

    def to_json(self) -> dict[str, Any]:
        return fields_to_json(self)


def _json_shape(value: Any, name: str, optional: bool = False) -> Shape | None:
    if value is None and optional:
        return None
    if not isinstance(value, list) or len(value) != 3 or not all(type(v) is int for v in value):
        raise ValueError(f"sparse layout field {name!r} must be a list of 3 integers")
    return (value[0], value[1], value[2])


def _json_flag(value: Any, name: str, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise ValueError(f"sparse layout field {name!r} must be true or false")
    return value


def _json_int(value: Any, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"sparse layout field {name!r} must be an integer")
    return value


def sparse_layout_from_json(data: Any, max_rows: int | None = None, max_chunks: int | None = None) -> SparseLayout:
    """The inverse of :meth:`SparseLayout.to_json`, checking types (for ports that
    speak JSON); ``max_rows`` and ``max_chunks`` bound the chunks as for
    :func:`harness.model.layout_from_json`."""
    from harness.model import layout_from_json

    if not isinstance(data, dict):
        raise ValueError("a sparse layout must be a JSON object")
    missing = [n for n in ("workspace_size", "layout", *SparseLayout.ROUTE_FIELDS) if n not in data]
    if missing:
        raise ValueError(f"sparse layout lacks field {missing[0]!r}")
    shapes = data["chunk_mask_shapes"]
    if not isinstance(shapes, list):
        raise ValueError("sparse layout field 'chunk_mask_shapes' must be a list")
    route = data["route"]
    if not isinstance(route, str):
        raise ValueError("sparse layout field 'route' must be a string")
    return SparseLayout(
        workspace_size=_json_int(data["workspace_size"], "workspace_size"),
        layout=layout_from_json(data["layout"], max_rows=max_rows, max_chunks=max_chunks),
        prefill_max_query_len=_json_int(data["prefill_max_query_len"], "prefill_max_query_len"),
        prefill_max_seq_len=_json_int(data["prefill_max_seq_len"], "prefill_max_seq_len"),
        use_dense_mha=bool(_json_flag(data["use_dense_mha"], "use_dense_mha")),
        masked_threshold=bool(_json_flag(data["masked_threshold"], "masked_threshold")),
        masks_fit=_json_flag(data["masks_fit"], "masks_fit", optional=True),
        use_masked_mha=bool(_json_flag(data["use_masked_mha"], "use_masked_mha")),
        route=route,
        global_mask_shape=_json_shape(data["global_mask_shape"], "global_mask_shape", optional=True),
        global_mask_fits=_json_flag(data["global_mask_fits"], "global_mask_fits", optional=True),
        suffix_mask_shape=_json_shape(data["suffix_mask_shape"], "suffix_mask_shape"),  # type: ignore[arg-type]
        chunk_mask_shapes=tuple(_json_shape(s, "chunk_mask_shapes") for s in shapes),  # type: ignore[misc]
    )
