"""Deterministic numeric inputs: the prefill (L3) tensors of a case and the merge
(L2) partials of a merge case.

Same spec, same bits, on any machine: every tensor is drawn from its own
stream (:mod:`harness.kernels.draws`: keyed by the case's seed and the tensor's
name, defined bit for bit independently of the CPU, its capability, the thread
count and the library versions), made in float64 by exact operations, rounded
to its dtype (:func:`harness.kernels.draws.rounded`), then moved to the target
device. The paged KV cache scatters each request's blocks through a shuffled
block table and fills every block no request owns with NaN, so a gather that
reads outside a request's context poisons the result and is flagged.
Block-table slots past a request's last block point at one of those NaN blocks
too (never at block 0, which may hold another request's rows), so a gather that
strays through an unused slot is flagged as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from harness.kernels import SharedKernels
from harness.kernels.draws import Draws, integers, normal, permutation, rounded, uniform
from harness.model import Case, MergeCase, NumericSpec
from harness.model.dcp import OneProcessRanks, RankCollective, global_positions, padded_local_len, rank_context_len

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def randn(shape: tuple[int, ...], seed: int, name: str, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return rounded(normal(shape, seed, name) * scale, dtype)


@dataclass(frozen=True)
class RankCache:
    """One DCP rank's paged cache: ``kv_cache`` holds exactly the context rows
    the rank owns (:mod:`harness.model.dcp`), at their local positions, through its
    own shuffled ``block_table``; every other row is NaN, and every slot past a
    request's owned blocks points at ``poison_block`` (all NaN). The table is
    wide enough for the padded rows a gather reads past a rank's own
    (:func:`harness.model.dcp.padded_local_len`), so those read NaN, never another
    request's data."""

    kv_cache: torch.Tensor
    block_table: torch.Tensor
    poison_block: int


@dataclass(frozen=True)
class DcpInputs:
    """The DCP form of a case's context: every rank's cache this process holds
    (``caches[r]`` is None for a rank held by another process) and the
    collective that gathers across ranks. ``rank`` is this process's."""

    world_size: int
    interleave: int
    rank: int
    caches: tuple[RankCache | None, ...]
    collective: RankCollective

    def cache(self, rank: int) -> RankCache:
        held = self.caches[rank]
        if held is None:
            raise ValueError(f"rank {rank}'s cache is held by another process (this one is rank {self.rank})")
        return held


@dataclass(frozen=True)
class PrefillInputs:
    """Materialised tensors for one case (all on one device).

    ``kv_cache``: ``[num_blocks, block_size, latent_dim]``, unowned blocks NaN.
    ``block_table``: ``[num_requests, max_blocks]`` int32, a request's blocks
    scattered over the cache (never contiguous when there are several); every
    slot past its last block holds :attr:`poison_block`.
    ``q``: ``[num_tokens, num_heads, qk_head_dim]``. ``new_kv_c``:
    ``[num_tokens, kv_lora_rank]`` and ``new_k_pe``: ``[num_tokens, 1, rope]``,
    the new tokens' latent rows (``max_query_len`` the longest request's). ``kv_b_weight``:
    ``[num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]``.

    Under DCP (``dcp`` set), ``kv_cache``/``block_table``/``poison_block`` are
    this process's rank's (:class:`RankCache`): its local rows only, so a loop
    that ignores DCP and gathers global positions from them reads the wrong
    rows or NaN. Every rank sees the same ``q`` and new-token rows.
    """

    spec: NumericSpec
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    q: torch.Tensor
    new_kv_c: torch.Tensor
    new_k_pe: torch.Tensor
    kv_b_weight: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    scale: float
    # An unowned (all-NaN) block: what every unused block-table slot points at.
    poison_block: int = -1
    dcp: DcpInputs | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])


def materialise_prefill(
    context_lens: tuple[int, ...],
    query_lens: tuple[int, ...],
    block_size: int,
    spec: NumericSpec,
    device: str = "cpu",
    dcp_world_size: int = 1,
    interleave: int = 1,
    collective: RankCollective | None = None,
) -> PrefillInputs:
    """The case's tensors; under DCP (``dcp_world_size > 1``) the context lives
    in per-rank caches (:func:`materialise_rank_caches`) and ``collective``
    (default: every rank in this process) says which ranks this process holds."""
    if dcp_world_size > 1:
        return _materialise_dcp_prefill(
            context_lens, query_lens, block_size, spec, device, dcp_world_size, interleave, collective
        )
    dtype = DTYPES[spec.dtype]
    seed = spec.seed
    blocks_per_request = [-(-c // block_size) for c in context_lens]
    owned = sum(blocks_per_request)
    # Spare blocks interleave with owned ones so a gather off the end of a
    # request's blocks lands in NaN, not in a neighbour's data.
    num_blocks = owned + max(4, owned // 2)
    order = permutation(num_blocks, seed, "block-order")
    max_blocks = max(1, *blocks_per_request)
    # Unused slots name a spare block (NaN throughout), not block 0: block 0 is
    # as likely as any to hold a request's rows, and a gather that strays
    # through an unused slot must read NaN to be flagged. There are at least 4
    # spares, and the order of the owned blocks is unchanged by this choice.
    poison_block = int(order[owned])
    block_table = torch.full((len(context_lens), max_blocks), poison_block, dtype=torch.int32)
    next_block = 0
    for request, count in enumerate(blocks_per_request):
        block_table[request, :count] = order[next_block : next_block + count].to(torch.int32)
        next_block += count
    kv_cache = torch.full((num_blocks, block_size, spec.latent_dim), float("nan"), dtype=dtype)
    values = randn((owned, block_size, spec.latent_dim), seed, "kv-cache", dtype)
    kv_cache[order[:owned]] = values
    # Rows past a request's context inside its last block are never read either.
    for request, context in enumerate(context_lens):
        tail = context % block_size
        if tail:
            kv_cache[int(block_table[request, blocks_per_request[request] - 1]), tail:] = float("nan")
    return _prefill_inputs(
        spec, query_lens, RankCache(kv_cache.to(device), block_table.to(device), poison_block), device
    )


def _prefill_inputs(
    spec: NumericSpec, query_lens: tuple[int, ...], cache: RankCache, device: str, dcp: DcpInputs | None = None
) -> PrefillInputs:
    """The inputs around ``cache`` (this process's; its tensors on ``device``)."""
    shared = {k: v.to(device) for k, v in _query_side(query_lens, spec).items()}
    return PrefillInputs(
        spec=spec,
        kv_cache=cache.kv_cache,
        block_table=cache.block_table,
        q=shared["q"],
        new_kv_c=shared["new_kv_c"],
        new_k_pe=shared["new_k_pe"],
        kv_b_weight=shared["kv_b_weight"],
        query_start_loc=shared["query_start_loc"],
        max_query_len=max(query_lens, default=0),
        scale=1.0 / math.sqrt(spec.qk_head_dim),
        poison_block=cache.poison_block,
        dcp=dcp,
    )


def _query_side(query_lens: tuple[int, ...], spec: NumericSpec) -> dict[str, torch.Tensor]:
    """The tensors every rank shares: queries, new latent rows, weights, offsets (CPU)."""
    dtype, seed = DTYPES[spec.dtype], spec.seed
    num_tokens = sum(query_lens)
    qsl = [0]
    for length in query_lens:
        qsl.append(qsl[-1] + length)
    weight_scale = 1.0 / math.sqrt(spec.kv_lora_rank)
    return {
        "q": randn((num_tokens, spec.num_heads, spec.qk_head_dim), seed, "q", dtype),
        "new_kv_c": randn((num_tokens, spec.kv_lora_rank), seed, "new-kv-c", dtype),
        "new_k_pe": randn((num_tokens, 1, spec.qk_rope_head_dim), seed, "new-k-pe", dtype),
        "kv_b_weight": randn(
            (spec.num_heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank),
            seed,
            "kv-b-weight",
            dtype,
            weight_scale,
        ),
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32),
    }


def materialise_rank_caches(
    context_lens: tuple[int, ...], block_size: int, spec: NumericSpec, world_size: int, interleave: int
) -> list[RankCache]:
    """Every rank's paged cache (CPU). The context's values are drawn once per
    case, by global position, and dealt out: the same case under any world size
    holds the same context. Each rank shuffles its own blocks."""
    dtype, seed = DTYPES[spec.dtype], spec.seed
    total = sum(context_lens)
    values = randn((total, spec.latent_dim), seed, "dcp-context", dtype)
    request_base = [0]
    for context in context_lens:
        request_base.append(request_base[-1] + context)
    width = max(1, *(-(-padded_local_len(c, world_size, interleave) // block_size) for c in context_lens))
    caches = []
    for rank in range(world_size):
        local_lens = [rank_context_len(c, world_size, interleave, rank) for c in context_lens]
        blocks_per_request = [-(-n // block_size) for n in local_lens]
        owned = sum(blocks_per_request)
        num_blocks = owned + max(4, owned // 2)
        order = permutation(num_blocks, seed, f"dcp-block-order-rank{rank}")
        poison_block = int(order[owned])
        block_table = torch.full((len(context_lens), width), poison_block, dtype=torch.int32)
        kv_cache = torch.full((num_blocks, block_size, spec.latent_dim), float("nan"), dtype=dtype)
        next_block = 0
        for request, (count, local_len) in enumerate(zip(blocks_per_request, local_lens, strict=True)):
            blocks = order[next_block : next_block + count]
            block_table[request, :count] = blocks.to(torch.int32)
            next_block += count
            if local_len:
                rows = values[request_base[request] + global_positions(local_len, world_size, interleave, rank)]
                local = torch.arange(local_len)
                kv_cache[blocks[local // block_size], local % block_size] = rows
        caches.append(RankCache(kv_cache, block_table, poison_block))
    return caches


def _materialise_dcp_prefill(
    context_lens: tuple[int, ...],
    query_lens: tuple[int, ...],
    block_size: int,
    spec: NumericSpec,
    device: str,
    world_size: int,
    interleave: int,
    collective: RankCollective | None,
) -> PrefillInputs:
    ranks = collective if collective is not None else OneProcessRanks(world_size)
    if ranks.world_size != world_size:
        raise ValueError(f"the collective spans {ranks.world_size} ranks, the case {world_size}")
    caches = tuple(
        RankCache(c.kv_cache.to(device), c.block_table.to(device), c.poison_block) if ranks.holds(r) else None
        for r, c in enumerate(materialise_rank_caches(context_lens, block_size, spec, world_size, interleave))
    )
    own = caches[ranks.rank]
    assert own is not None
    return _prefill_inputs(spec, query_lens, own, device, DcpInputs(world_size, interleave, ranks.rank, caches, ranks))


def case_prefill_inputs(case: Case, device: str = "cpu", collective: RankCollective | None = None) -> PrefillInputs:
    """:func:`materialise_prefill` for a numeric case (its DCP geometry included)."""
    assert case.numeric is not None, f"case {case.name} has no numeric section"
    return materialise_prefill(
        case.context_lens,
        case.query_lens,
        case.block_size,
        case.numeric,
        device,
        case.dcp_world_size,
        case.cp_kv_cache_interleave_size,
        collective,
    )


def new_token_kv(inputs: PrefillInputs, kernels: SharedKernels) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' keys ``[tokens, heads, qk]`` and values ``[tokens, heads,
    v]``, up-projected from their latent rows on the shared kernels."""
    spec = inputs.spec
    kv = kernels.kv_b_proj(inputs.kv_b_weight, inputs.new_kv_c)
    k_nope, v = torch.split(
        kv.view(-1, spec.num_heads, spec.qk_nope_head_dim + spec.v_head_dim),
        [spec.qk_nope_head_dim, spec.v_head_dim],
        dim=-1,
    )
    return torch.cat([k_nope, inputs.new_k_pe.expand(-1, spec.num_heads, -1)], dim=-1), v


def new_token_partial(inputs: PrefillInputs, kernels: SharedKernels) -> tuple[torch.Tensor, torch.Tensor]:
    """The suffix partial of SPEC 1c on the shared kernels: the new tokens' causal
    attention over themselves, their keys and values up-projected from the new
    latent rows. Both sides call this one function."""
    k, v = new_token_kv(inputs, kernels)
    qsl, longest = inputs.query_start_loc, inputs.max_query_len
    return kernels.attention(inputs.q, k, v, qsl, qsl, True, inputs.scale, longest, longest)


# -- L2: merge partials ------------------------------------------------------------------------

MANTISSA_BITS = {"bf16": 7, "fp16": 10, "fp32": 23}
# ln 2 correctly rounded, written out: a drawn value never goes through a
# library logarithm or exponential, whose last bit may differ between machines.
LN_2 = float.fromhex("0x1.62e42fefa39efp-1")

# exp(-gap) in fp32 is a denormal from a gap of 126 ln 2 (87.34) and rounds to 0
# past 150 ln 2 (103.97): the band where a merge that treats small weights
# specially (flushes denormals, skips or thresholds a side) parts from the reference.
FP32_EXP_DENORMAL_GAP = 126 * LN_2
FP32_EXP_ZERO_GAP = 150 * LN_2

# The tiny-LSE kind's pairings (tiny forms times the other side's kinds), and
# fp32's smallest normal.
_TINY_CELLS = 4 * 6
_FLT_MIN = float.fromhex("0x1p-126")

# LSE kinds, per (head, token) element; a pattern picks one, "mixed" any.
_RANDOM, _NEG_INF_BOTH, _NEG_INF_PREFIX, _NEG_INF_SUFFIX, _POS_INF = 0, 1, 2, 3, 4
_VISIBLE_GAP, _LARGE_GAP, _UNDERFLOW_GAP, _TINY_LSE = 5, 6, 7, 8
_KIND_OF_PATTERN = {
    "random": _RANDOM,
    "neg-inf-both": _NEG_INF_BOTH,
    "neg-inf-prefix": _NEG_INF_PREFIX,
    "neg-inf-suffix": _NEG_INF_SUFFIX,
    "pos-inf": _POS_INF,
    "visible-gap": _VISIBLE_GAP,
    "large-gap": _LARGE_GAP,
    "underflow-gap": _UNDERFLOW_GAP,
    "tiny-lse": _TINY_LSE,
}
_NUM_KINDS = len(_KIND_OF_PATTERN)

# Extra columns around a "column-slice" LSE and rows before a "head-dim-slice"
# prefix (at most this many), and how much wider than head_size the heads of a
# "head-dim-slice" buffer are (a 64-wide rope part, as a 192-wide qk head holds
# a 128-wide v).
_MAX_VIEW_MARGIN = 3
_HEAD_DIM_PAD = 64


def partly_visible_gap(dtype: str) -> float:
    """The LSE gap below which the weaker side can still change a merged value
    stored in ``dtype``: its weight ``exp(-gap)`` is at least half an ULP of 1,
    ``2^-(mantissa_bits + 1)``; about 5.5 (bf16), 7.6 (fp16) and 16.6 (fp32)."""
    return (MANTISSA_BITS[dtype] + 1) * LN_2


@dataclass(frozen=True)
class MergeInputs:
    """Materialised L2 inputs: partials ``[num_tokens, num_heads, head_size]``
    and fp32 LSEs ``[num_heads, num_tokens]``.

    The tensors may be views (:attr:`MergeCase.lse_view`, ``value_view``) into
    buffers whose other elements are NaN: a merge indexes them by their strides
    and storage offsets, as upstream's kernel does. Prefix values and LSEs of
    tokens at or past ``prefill_tokens_with_context`` are NaN too (never read).
    """

    prefix_output: torch.Tensor
    prefix_lse: torch.Tensor
    suffix_output: torch.Tensor
    suffix_lse: torch.Tensor
    prefill_tokens_with_context: int | None


def _uniform(shape: tuple[int, ...], seed: int, name: str, low: float, high: float) -> torch.Tensor:
    """Uniform on ``[low, high)`` in float64: what is derived from it rounds once, when cast to its dtype."""
    return low + (high - low) * uniform(shape, seed, name)


def _tiny(shape: tuple[int, ...], seed: int, name: str, dtype: torch.dtype) -> torch.Tensor:
    """Signed zeros, denormals (smallest, largest, in between) and the smallest
    normal of ``dtype``, each exactly representable there (returned as float64)."""
    info = torch.finfo(dtype)
    smallest = info.tiny * info.eps
    pick = integers(0, 6, shape, seed, f"{name}:pick")
    steps = integers(1, round(1 / info.eps), shape, seed, f"{name}:steps")
    magnitude = torch.zeros(shape, dtype=torch.float64)
    magnitude = torch.where(pick == 2, smallest, magnitude)
    magnitude = torch.where(pick == 3, steps.to(torch.float64) * smallest, magnitude)
    magnitude = torch.where(pick == 4, info.tiny - smallest, magnitude)
    magnitude = torch.where(pick == 5, info.tiny, magnitude)
    negative = uniform(shape, seed, f"{name}:sign") < 0.5
    # copysign keeps the sign of a zero: picks 0 and 1 give -0.0 as often as +0.0.
    return torch.copysign(magnitude, torch.where(negative, -1.0, 1.0).to(torch.float64))


def _finite_lses(shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    """Finite LSEs (float64): mostly moderate, some past exp's fp32 range on
    either side (|lse| > 88: a merge that exponentiates LSEs before subtracting
    the larger overflows or underflows there), some signed zeros and denormals."""
    share = uniform(shape, seed, f"{name}:share")
    moderate = 3.0 * normal(shape, seed, f"{name}:moderate")
    wide = _uniform(shape, seed, f"{name}:wide", -150.0, 150.0)
    tiny = _tiny(shape, seed, f"{name}:tiny", torch.float32)
    return torch.where(share < 0.6, moderate, torch.where(share < 0.9, wide, tiny))


def _gaps(shape: tuple[int, ...], seed: int, dtype: str) -> dict[int, torch.Tensor]:
    """LSE gaps (float64) for the gap kinds, continuous from 0 past 10^5.

    Visible: an eighth exactly 0, half within the band where ``dtype`` still
    shows the weaker side (:func:`partly_visible_gap`), an eighth within 1 of
    that band's edge (where a cut-off that is a little off shows), a quarter up
    to 2 past fp32's band, whatever the dtype. Large: 16 to 88. Underflow: the
    fp32 exp-denormal band and past the gap where the weight is 0 (86 to 106),
    a quarter about log-uniform from 128 to 10^6.
    """
    band = partly_visible_gap(dtype)
    share = uniform(shape, seed, "gap-share")
    in_band = _uniform(shape, seed, "gap-in-band", 0.0, band)
    band_edge = _uniform(shape, seed, "gap-band-edge", band - 1.0, band + 1.0)
    past_fp32 = _uniform(shape, seed, "gap-past-fp32", 0.0, partly_visible_gap("fp32") + 2.0)
    visible = torch.where(
        share < 1 / 8,
        0.0,
        torch.where(share < 5 / 8, in_band, torch.where(share < 6 / 8, band_edge, past_fp32)),
    )
    large = _uniform(shape, seed, "gap-large", 16.0, 88.0)
    denormal = _uniform(shape, seed, "gap-denormal", 86.0, 106.0)
    # Log-uniform in steps: a power of two from 2^7 to 2^19 times one plus a
    # uniform fraction (exact), up to 10^6.
    octave = Draws(seed, "gap-beyond-octave").integers(7, 20, shape)
    fraction = 1.0 + Draws(seed, "gap-beyond").uniform(shape)
    beyond = torch.from_numpy(np.minimum(np.ldexp(fraction, octave), 1e6))
    underflow = torch.where(share < 3 / 4, denormal, beyond)
    return {_VISIBLE_GAP: visible, _LARGE_GAP: large, _UNDERFLOW_GAP: underflow}


def merge_lses(case: MergeCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The case's prefix and suffix LSEs as values, fp32 ``[num_heads, num_tokens]``
    (contiguous, no poison): every (head, token) element is drawn after its kind,
    the case's pattern or, under "mixed", one at random."""
    shape = (case.num_heads, case.num_tokens)
    seed = case.seed
    if case.pattern == "mixed":
        kinds = integers(0, _NUM_KINDS, shape, seed, "mixed")
    else:
        kinds = torch.full(shape, _KIND_OF_PATTERN[case.pattern])
    neg, pos = torch.tensor(float("-inf"), dtype=torch.float64), torch.tensor(float("inf"), dtype=torch.float64)

    # random: both finite, of similar size.
    prefix = 3.0 * normal(shape, seed, "prefix-lse")
    suffix = 3.0 * normal(shape, seed, "suffix-lse")
    finite_p, finite_s = _finite_lses(shape, seed, "finite-prefix"), _finite_lses(shape, seed, "finite-suffix")

    def pick(kind: int, p: torch.Tensor, s: torch.Tensor) -> None:
        nonlocal prefix, suffix
        prefix, suffix = torch.where(kinds == kind, p, prefix), torch.where(kinds == kind, s, suffix)

    pick(_NEG_INF_BOTH, neg.expand(shape), neg.expand(shape))
    pick(_NEG_INF_PREFIX, neg.expand(shape), finite_s)
    pick(_NEG_INF_SUFFIX, finite_p, neg.expand(shape))
    # +inf (FA2's empty side) against finite, +inf and -inf, on either side.
    pairs = integers(0, 5, shape, seed, "pos-inf-pair")
    pos_p = torch.where((pairs == 0) | (pairs == 2) | (pairs == 3), pos, torch.where(pairs == 4, neg, finite_p))
    pos_s = torch.where((pairs == 1) | (pairs == 2) | (pairs == 4), pos, torch.where(pairs == 3, neg, finite_s))
    pick(_POS_INF, pos_p, pos_s)
    # The gap kinds: one side at a finite base, the other `gap` below it.
    base = finite_p
    prefix_higher = uniform(shape, seed, "gap-side") < 0.5
    for kind, gap in _gaps(shape, seed, case.dtype).items():
        pick(kind, torch.where(prefix_higher, base, base - gap), torch.where(prefix_higher, base - gap, base))
    # Tiny: a signed zero, denormal or FLT_MIN against another, or against a
    # moderate, +inf or -inf LSE (a merge with -inf gives max + log(1): +0.0 for -0.0).
    # The tiny side's form (-0.0, +0.0, a denormal, FLT_MIN) and the other side's
    # kind (three tiny, -inf, +inf, moderate) take every pairing in turn along the
    # elements, from a drawn offset: coverage by construction, not by chance.
    cell = (torch.arange(math.prod(shape)) + integers(0, _TINY_CELLS, (1,), seed, "tiny-lse-grid")) % _TINY_CELLS
    form, other_kind = (cell % 4).reshape(shape), (cell // 4).reshape(shape)
    drawn = _tiny(shape, seed, "tiny-lse", torch.float32)
    tiny = torch.where(form == 0, -0.0, torch.where(form == 1, 0.0, drawn))
    tiny = torch.where((form == 2) & ((drawn == 0) | (drawn.abs() == _FLT_MIN)), _FLT_MIN * 2.0**-23, tiny)
    tiny = torch.where(form == 3, torch.copysign(torch.tensor(_FLT_MIN, dtype=torch.float64), drawn), tiny)
    other_tiny = _tiny(shape, seed, "tiny-lse-other", torch.float32)
    other = torch.where(other_kind == 3, neg, torch.where(other_kind == 4, pos, other_tiny))
    other = torch.where(other_kind == 5, 3.0 * normal(shape, seed, "tiny-lse-moderate"), other)
    pick(_TINY_LSE, torch.where(prefix_higher, tiny, other), torch.where(prefix_higher, other, tiny))
    return prefix.to(torch.float32), suffix.to(torch.float32)


def _with_special_values(values: torch.Tensor, chosen: torch.Tensor, seed: int, name: str) -> torch.Tensor:
    """``values`` with the ``chosen`` lanes replaced by signed zeros, denormals
    and the smallest normal of their dtype."""
    return torch.where(chosen, _tiny(tuple(values.shape), seed, name, values.dtype).to(values.dtype), values)


def _lse_layout(lse: torch.Tensor, view: str, lead: int, trail: int, device: str) -> torch.Tensor:
    """``lse`` ``[heads, tokens]`` on ``device`` in the layout ``view`` names
    (:data:`harness.model.MERGE_LSE_VIEWS`); a buffer's other elements are NaN."""
    heads, tokens = lse.shape
    if view == "contiguous":
        return lse.contiguous().to(device)
    if view == "column-slice":
        buffer = torch.full((heads, lead + tokens + trail), float("nan"), dtype=lse.dtype, device=device)
        buffer[:, lead : lead + tokens] = lse.to(device)
        return buffer[:, lead : lead + tokens]
    if view == "transposed":
        # Filled as a fresh [tokens, heads] tensor: .contiguous() would keep the
        # strides of a single token's [1, heads] as they are.
        token_major = torch.empty((tokens, heads), dtype=lse.dtype, device=device)
        token_major.copy_(lse.t())
        return token_major.t()
    raise ValueError(f"unknown merge LSE view {view!r}")


def _value_layout(values: torch.Tensor, view: str, lead: int, device: str) -> torch.Tensor:
    """``values`` ``[tokens, heads, dim]`` on ``device`` in the layout ``view``
    names (:data:`harness.model.MERGE_VALUE_VIEWS`); a buffer's other elements are NaN."""
    tokens, heads, dim = values.shape
    if view == "contiguous":
        return values.contiguous().to(device)
    if view == "head-dim-slice":
        buffer = torch.full(
            (lead + tokens, heads, dim + _HEAD_DIM_PAD), float("nan"), dtype=values.dtype, device=device
        )
        buffer[lead:, :, :dim] = values.to(device)
        return buffer[lead:, :, :dim]
    raise ValueError(f"unknown merge value view {view!r}")


def materialise_merge(case: MergeCase, device: str = "cpu") -> MergeInputs:
    """The case's partials and LSEs (:func:`merge_lses`), laid out as its views say.

    Values are seeded normals with about one lane in eight a signed zero,
    denormal or smallest normal on each side, half of those lanes special on
    both. NaN stands where the contract says nothing is read or the result
    does not depend on it: prefix values and LSEs of tokens at or past
    ``prefill_tokens_with_context``, and a quarter of the values of merged rows
    whose two LSEs are both infinite (both sides empty: output 0).
    """
    dtype = DTYPES[case.dtype]
    shape = (case.num_tokens, case.num_heads, case.head_size)
    seed = case.seed
    prefix = randn(shape, seed, "prefix-output", dtype)
    suffix = randn(shape, seed, "suffix-output", dtype)
    lanes = uniform(shape, seed, "special-lanes")
    prefix = _with_special_values(prefix, lanes < 1 / 8, seed, "prefix-special")
    suffix = _with_special_values(
        suffix, (lanes < 1 / 16) | ((lanes >= 1 / 8) & (lanes < 3 / 16)), seed, "suffix-special"
    )
    prefix_lse, suffix_lse = merge_lses(case)

    merged = case.num_tokens if case.prefill_tokens_with_context is None else case.prefill_tokens_with_context
    token_merged = torch.arange(case.num_tokens) < merged
    both_empty = (prefix_lse.isinf() & suffix_lse.isinf()).t().unsqueeze(-1)  # [tokens, heads, 1]
    garbage = uniform((2, *shape), seed, "empty-garbage") < 0.25
    merged_rows = token_merged.view(-1, 1, 1)
    prefix = torch.where(both_empty & merged_rows & garbage[0], float("nan"), prefix)
    suffix = torch.where(both_empty & merged_rows & garbage[1], float("nan"), suffix)
    # The prefix of a token without context is never read.
    prefix = torch.where(merged_rows, prefix, float("nan"))
    prefix_lse = torch.where(token_merged, prefix_lse, float("nan"))

    margins = integers(0, _MAX_VIEW_MARGIN, (4,), seed, "view-margins").tolist()
    inputs = MergeInputs(
        # As the context loop's merge: the running partial's rows and LSE
        # columns from an offset, the chunk's from 0 with columns past the slice.
        _value_layout(prefix, case.value_view, 1 + margins[0], device),
        _lse_layout(prefix_lse, case.lse_view, 1 + margins[1], margins[2], device),
        _value_layout(suffix, case.value_view, 0, device),
        _lse_layout(suffix_lse, case.lse_view, 0, 1 + margins[3], device),
        case.prefill_tokens_with_context,
    )
    for values in (inputs.prefix_output, inputs.suffix_output):
        # Upstream's kernel takes a value's token stride to be num_heads times its
        # head stride and its lanes to be adjacent; any other layout would have it
        # read and write out of bounds, silently. (A single token's stride is moot.)
        token_stride, head_stride, lane_stride = values.stride()
        assert lane_stride == 1 and (case.num_tokens == 1 or token_stride == case.num_heads * head_stride)
    return inputs


def merge_inputs_at(inputs: MergeInputs, token: int, head: int, dim: int | None) -> str:
    """What the merge of one element read: both LSEs and both partial values."""
    lses = f"prefix_lse {float(inputs.prefix_lse[head, token])!r}, suffix_lse {float(inputs.suffix_lse[head, token])!r}"
    if dim is None:
        return lses
    values = (
        f"prefix_output {float(inputs.prefix_output[token, head, dim])!r}, "
        f"suffix_output {float(inputs.suffix_output[token, head, dim])!r}"
    )
    return f"{lses}, {values}"
