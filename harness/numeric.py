"""Deterministic numeric inputs: the prefill (L3) tensors of a case and the merge
(L2) partials of a merge case.

Same spec, same bits, on any machine: every tensor is drawn on the CPU from a
``torch.Generator`` seeded from the case's seed and the tensor's name, then moved
to the target device. The paged KV cache scatters each request's blocks through
a shuffled block table and fills every block no request owns with NaN, so a
gather that reads outside a request's context poisons the result and is flagged.
Block-table slots past a request's last block point at one of those NaN blocks
too (never at block 0, which may hold another request's rows), so a gather that
strays through an unused slot is flagged as well.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from harness.kernels import SharedKernels
from harness.model import MergeCase, NumericSpec

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator for one named tensor of one case (independent streams)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def randn(shape: tuple[int, ...], seed: int, name: str, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    values = torch.randn(shape, generator=generator(seed, name), dtype=torch.float32)
    return (values * scale).to(dtype)


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

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])


def materialise_prefill(
    context_lens: tuple[int, ...],
    query_lens: tuple[int, ...],
    block_size: int,
    spec: NumericSpec,
    device: str = "cpu",
) -> PrefillInputs:
    dtype = DTYPES[spec.dtype]
    seed = spec.seed
    blocks_per_request = [-(-c // block_size) for c in context_lens]
    owned = sum(blocks_per_request)
    # Spare blocks interleave with owned ones so a gather off the end of a
    # request's blocks lands in NaN, not in a neighbour's data.
    num_blocks = owned + max(4, owned // 2)
    order = torch.randperm(num_blocks, generator=generator(seed, "block-order"))
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
    num_tokens = sum(query_lens)
    qsl = [0]
    for length in query_lens:
        qsl.append(qsl[-1] + length)
    weight_scale = 1.0 / math.sqrt(spec.kv_lora_rank)
    tensors = {
        "kv_cache": kv_cache,
        "block_table": block_table,
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
    return PrefillInputs(
        spec=spec,
        scale=1.0 / math.sqrt(spec.qk_head_dim),
        max_query_len=max(query_lens, default=0),
        poison_block=poison_block,
        **{k: v.to(device) for k, v in tensors.items()},
    )


def new_token_partial(inputs: PrefillInputs, kernels: SharedKernels) -> tuple[torch.Tensor, torch.Tensor]:
    """The suffix partial of SPEC 1c on the shared kernels: the new tokens' causal
    attention over themselves, their keys and values up-projected from the new
    latent rows. Both sides call this one function."""
    spec = inputs.spec
    kv = kernels.kv_b_proj(inputs.kv_b_weight, inputs.new_kv_c)
    k_nope, v = torch.split(
        kv.view(-1, spec.num_heads, spec.qk_nope_head_dim + spec.v_head_dim),
        [spec.qk_nope_head_dim, spec.v_head_dim],
        dim=-1,
    )
    k = torch.cat([k_nope, inputs.new_k_pe.expand(-1, spec.num_heads, -1)], dim=-1)
    qsl, longest = inputs.query_start_loc, inputs.max_query_len
    return kernels.attention(inputs.q, k, v, qsl, qsl, True, inputs.scale, longest, longest)


# -- L2: merge partials ------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeInputs:
    prefix_output: torch.Tensor
    prefix_lse: torch.Tensor
    suffix_output: torch.Tensor
    suffix_lse: torch.Tensor
    prefill_tokens_with_context: int | None


def materialise_merge(case: MergeCase, device: str = "cpu") -> MergeInputs:
    dtype = DTYPES[case.dtype]
    shape = (case.num_tokens, case.num_heads, case.head_size)
    lse_shape = (case.num_heads, case.num_tokens)
    prefix = randn(shape, case.seed, "prefix-output", dtype)
    suffix = randn(shape, case.seed, "suffix-output", dtype)
    prefix_lse = randn(lse_shape, case.seed, "prefix-lse", torch.float32, 3.0)
    suffix_lse = randn(lse_shape, case.seed, "suffix-lse", torch.float32, 3.0)
    pattern = case.pattern
    if pattern == "mixed":
        kinds = torch.randint(0, 6, lse_shape, generator=generator(case.seed, "mixed"))
    else:
        kind_of = {"random": 0, "neg-inf-both": 1, "neg-inf-prefix": 2, "neg-inf-suffix": 3, "pos-inf": 4}
        kinds = torch.full(lse_shape, kind_of.get(pattern, 5))
    neg, pos = float("-inf"), float("inf")
    prefix_lse = torch.where((kinds == 1) | (kinds == 2), neg, prefix_lse)
    suffix_lse = torch.where((kinds == 1) | (kinds == 3), neg, suffix_lse)
    # FA2 reports +inf for an empty side: on one side or both.
    side = torch.rand(lse_shape, generator=generator(case.seed, "pos-inf-side"))
    prefix_lse = torch.where((kinds == 4) & (side < 0.67), pos, prefix_lse)
    suffix_lse = torch.where((kinds == 4) & (side > 0.33), pos, suffix_lse)
    gap = 30.0 + 60.0 * torch.rand(lse_shape, generator=generator(case.seed, "gap"))
    flip = torch.rand(lse_shape, generator=generator(case.seed, "gap-side")) < 0.5
    large = kinds == 5
    prefix_lse = torch.where(large & flip, suffix_lse + gap, prefix_lse)
    suffix_lse = torch.where(large & ~flip, prefix_lse + gap, suffix_lse)
    return MergeInputs(
        prefix.to(device),
        prefix_lse.to(device),
        suffix.to(device),
        suffix_lse.to(device),
        case.prefill_tokens_with_context,
    )
