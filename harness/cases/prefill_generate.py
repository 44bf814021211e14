"""Seeded generator of numeric prefill cases (L3), by named family, and their
keyless-row variants.

Determinism: case ``index`` of a suite is drawn from
``random.Random(f"{seed}:prefill:{family}:{index}")`` (seeded through SHA-512,
so the same on any machine and under any ``PYTHONHASHSEED``); families are
dealt round-robin, each family's dtypes in turn. Three sets of families, as
for the layout cases (:mod:`harness.cases.generate`): :data:`NUMERIC_FAMILIES`
(the default), :data:`NUMERIC_COVERAGE_FAMILIES` and
:data:`NUMERIC_DCP_FAMILIES`; a suite deals them in separate groups, so adding
a family to one never changes a case of another. Keyless-row variants
(:func:`keyless_variants`) come after all of a group's cases, so the first
``count`` cases, their names and their order do not depend on them. Batches
are sized for the CPU and Triton interpreters.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace

from harness.cases.coverage_families import HYBRID_BLOCK_SIZES
from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES, PRESETS, Case


def _small_queries(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randint(1, 4) for _ in range(n))


def _numeric_batch(family: str, rng: random.Random) -> tuple[list[int], int, int, bool]:
    """(context_lens, block_size, workspace_size, align_to_block), sized for the
    CPU interpreter: a few dozen query tokens and a few thousand context rows."""
    block = rng.choice((1, 16, 16, 32))
    workspace = rng.choice((32, 64, 128, 256)) // block * block or block
    n = rng.randint(1, 6)
    align = True
    if family == "zero-context":
        contexts = [rng.choice((0, rng.randint(1, 3 * workspace))) for _ in range(n + 2)]
        contexts[rng.randrange(len(contexts))] = 0
        contexts[rng.randrange(len(contexts))] = rng.randint(workspace + 1, 4 * workspace)
    elif family == "long-single":
        contexts = [rng.randint(3 * workspace, 8 * workspace)]
        if rng.random() < 0.5:
            contexts = [rng.randint(0, workspace), *contexts, rng.randint(0, workspace)]
    elif family == "many-chunks":
        contexts = [rng.randint(workspace // 2, 2 * workspace) for _ in range(n + 3)]
    elif family == "single-chunk":
        # The fast path: one chunk, no empty token slices.
        contexts = [rng.randint(1, max(1, workspace // (n + 1))) for _ in range(n)]
    elif family == "skew":
        contexts = [rng.randint(1, 2 * block) for _ in range(n + 2)]
        contexts[rng.randrange(len(contexts))] = rng.randint(2 * workspace, 5 * workspace)
    elif family == "exact-fit":
        target = workspace + rng.choice((0, -1, 1, -block, block))
        cut = rng.randint(1, max(1, target - 1))
        contexts = [cut, max(1, target - cut)]
    elif family == "unaligned-tails":
        block = rng.choice((16, 32))
        workspace = max(workspace, block)
        contexts = [rng.randint(0, 4) * block + rng.randint(1, block - 1) for _ in range(n)]
    elif family == "tiny-workspace":
        workspace = block
        contexts = [rng.randint(0, 4 * block) for _ in range(n)]
    elif family == "unaligned-split":
        align = False
        contexts = [rng.randint(0, 2 * workspace) for _ in range(n)]
    else:  # uniform
        contexts = [rng.randint(1, workspace)] * n
    return contexts, block, workspace, align


NUMERIC_FAMILIES = (
    "zero-context",
    "long-single",
    "many-chunks",
    "single-chunk",
    "skew",
    "exact-fit",
    "unaligned-tails",
    "tiny-workspace",
    "unaligned-split",
    "uniform",
)


NUMERIC_COVERAGE_FAMILIES = ("crowd", "three-piece", "hybrid-block")

# Request counts of a crowd case, dealt in turn: dozens, hundreds. The hundreds
# hold more than 256 query tokens (1.75 a request on average).
CROWD_SIZES = ((24, 60), (155, 175))


def _crowd(rng: random.Random, k: int) -> tuple[list[int], tuple[int, ...], int, int, bool]:
    """Dozens or hundreds of requests, one to four query tokens each (mostly one:
    the merge costs per token). Sizes and dtypes both cycle with ``k`` (2 sizes,
    3 dtypes: every pairing within 6 cases). The dozens share a workspace the
    legacy grid can plan in a few chunks (16 rows and a block per request, or
    more), with zero-context and short requests beside a few longer ones, so
    they have keyless rows; the hundreds share a few hundred to a few thousand
    rows: chunks of dozens of requests, and continuations among them."""
    size = k % len(CROWD_SIZES)
    low, high = CROWD_SIZES[size]
    n = rng.randint(low, high)
    block = rng.choice((1, 16, 16, 48))
    contexts = [rng.choice((rng.randint(1, 2 * block + 1), rng.randint(1, 40))) for _ in range(n)]
    if size == 0:
        # At least 16 rows a request (n requests' worth, so at least the legacy
        # share), so the legacy grid takes a few chunks, not dozens.
        workspace = max(block, 16) * n * rng.choice((1, 2))
        share = workspace // n // block * block
        for _ in range(rng.randint(1, 3)):
            contexts[rng.randrange(n)] = rng.randint(2 * share, 4 * share)
    else:
        workspace = max(block, rng.choice((512, 1024, 2048)) // block * block)
        for _ in range(rng.randint(1, 3)):
            contexts[rng.randrange(n)] = rng.randint(workspace, 3 * workspace)
    # Zero-context requests are rare (each one closes a chunk), so chunks hold
    # dozens to hundreds of requests; there is always one.
    for _ in range(rng.randint(1, max(1, n // 25))):
        contexts[rng.randrange(n)] = 0
    queries = tuple(rng.choice((1, 1, 1, 1, 1, 2, 3, 4)) for _ in range(n))
    return contexts, queries, block, workspace, True


# L3 under decode context parallelism: the world sizes vLLM is run with (powers
# of two and the non-powers of two a tensor-parallel size of 6, 12, 24 allows),
# and interleaves from 1 to 64 (vLLM wants the block size a multiple of it).
NUMERIC_DCP_FAMILIES = ("dcp",)
DCP_NUMERIC_WORLDS = (2, 4, 8, 3, 6)
DCP_NUMERIC_INTERLEAVES = (1, 2, 4, 8, 16, 32, 64, 3)


def _dcp_numeric_batch(rng: random.Random, k: int) -> tuple[list[int], tuple[int, ...], int, int, int, int]:
    """(context_lens, query_lens, block_size, workspace_size, world, interleave)
    of the ``k``-th DCP L3 case. World sizes and interleaves cycle with ``k``
    (5 worlds, 8 interleaves: every pairing within 40 cases); the block is a
    multiple of the interleave; the workspace one to three alignment units, so
    a multiple of the world (upstream's builder asserts it). A request longer
    than a chunk's rows is always there (continuations across chunks, padded
    local windows), beside short, unaligned and zero-context ones."""
    world = DCP_NUMERIC_WORLDS[k % len(DCP_NUMERIC_WORLDS)]
    interleave = DCP_NUMERIC_INTERLEAVES[k % len(DCP_NUMERIC_INTERLEAVES)]
    block = interleave * rng.choice((1, 2)) if interleave >= 16 else rng.choice((16, 32, 48))
    block = block if block % interleave == 0 else interleave * rng.choice((1, 16))
    unit = math.lcm(block, world * interleave)
    workspace = unit * rng.choice((1, 2, 3))
    n = rng.randint(1, 5)
    contexts = [rng.choice((0, rng.randint(1, workspace), rng.randint(1, 3 * interleave * world))) for _ in range(n)]
    contexts.insert(rng.randint(0, n), rng.randint(workspace + 1, 3 * workspace))
    return contexts, _small_queries(rng, len(contexts)), block, workspace, world, interleave


def _coverage_numeric_batch(
    family: str, rng: random.Random, k: int
) -> tuple[list[int], tuple[int, ...], int, int, bool]:
    """(context_lens, query_lens, block_size, workspace_size, align_to_block) of
    the ``k``-th case of an L3 coverage family, sized for the Triton interpreter
    (a few milliseconds per (token, head) merged)."""
    align = True
    if family == "crowd":
        return _crowd(rng, k)
    if family == "three-piece":
        # A request longer than two chunks between neighbours: three pieces and more.
        block = rng.choice((1, 3, 16, 16, 32, 80))
        workspace = max(block, rng.choice((32, 64, 128)) // block * block)
        giants = [rng.randint(2 * workspace + 1, 4 * workspace) for _ in range(rng.choice((1, 1, 2)))]
        contexts = [rng.randint(0, workspace) for _ in range(rng.randint(0, 3))]
        for giant in giants:
            contexts += [giant] + [rng.randint(0, workspace) for _ in range(rng.randint(0, 2))]
        return contexts, _small_queries(rng, len(contexts)), block, workspace, align
    # hybrid-block: the hybrid models' page sizes, and small odd ones, at L3.
    block = rng.choice(HYBRID_BLOCK_SIZES)
    align = rng.random() < 0.75
    workspace = block * rng.choice((1, 2, 3)) + (rng.randint(1, block - 1) if rng.random() < 0.25 else 0)
    n = rng.randint(2, 8)
    contexts = [rng.randint(0, 2 * workspace) if rng.random() < 0.8 else 0 for _ in range(n)]
    contexts[rng.randrange(n)] = rng.randint(2 * workspace, 3 * workspace)
    return contexts, _small_queries(rng, n), block, workspace, align


def legacy_grid_has_keyless_rows(case: Case) -> bool:
    """Whether the legacy equal-share grid (SPEC 1a) of ``case`` hands the
    attention kernel a query row without keys: a request with zero rows in some
    chunk of the grid (a zero-context request in any chunk, or a short request
    in a later one). Such rows are what seeds/003's neutralisation is for.

    The share is equal_share's (vllm==0.27.1's): ``W // n`` rounded down to the
    block size only, never to the DCP-widened alignment. Request ``i`` has rows
    in chunk ``j`` iff ``c_i > j * share``, so some chunk has a keyless request
    iff ``min(c) <= (num_chunks - 1) * share``. False when no request has
    context (no chunks) or the grid cannot plan the case (a share of 0 rows, or
    under DCP one that is not a multiple of the world size).
    """
    with_context = sum(1 for c in case.context_lens if c > 0)
    if with_context == 0:
        return False
    unit = case.block_size if case.align_to_block else 1
    share = case.workspace_size // with_context // unit * unit
    if share <= 0 or (case.dcp_world_size > 1 and share % case.dcp_world_size):
        return False
    num_chunks = -(-max(case.context_lens) // share)
    return min(case.context_lens) <= (num_chunks - 1) * share


def keyless_variants(cases: list[Case], per_family: int) -> Iterator[Case]:
    """For each family, its first ``per_family`` numeric cases whose legacy grid
    has keyless rows, once under every non-default keyless-row behaviour
    (:data:`~harness.model.KEYLESS_ROWS`), named ``<name>-keyless-<behaviour>``:
    the same batch and tensors, only the shared kernels' report on rows without
    keys differs."""
    taken: dict[str, int] = {}
    for case in cases:
        if case.numeric is None or not legacy_grid_has_keyless_rows(case):
            continue
        if taken.get(case.family, 0) >= per_family:
            continue
        taken[case.family] = taken.get(case.family, 0) + 1
        for behaviour in KEYLESS_ROWS[1:]:
            yield replace(
                case, name=f"{case.name}-keyless-{behaviour}", numeric=replace(case.numeric, keyless_rows=behaviour)
            )


def generate_prefill(
    seed: int,
    count: int,
    preset: str = "tiny",
    keyless_per_family: int = 0,
    families: Sequence[str] | None = None,
) -> Iterator[Case]:
    """L3 cases (layout and numeric) over ``families`` (default
    :data:`NUMERIC_FAMILIES`; any of those, :data:`NUMERIC_COVERAGE_FAMILIES`
    and :data:`NUMERIC_DCP_FAMILIES`),
    dealt round-robin, each family's dtypes in turn; named
    ``numeric-<family>-<index>``, with the preset after ``numeric`` for any preset
    but ``tiny``. Then, when ``keyless_per_family`` is set, the
    :func:`keyless_variants` of those cases, after all of them (so the first
    ``count`` cases, their names and their order do not depend on it)."""
    cases = list(_prefill_cases(seed, count, preset, tuple(families or NUMERIC_FAMILIES)))
    yield from cases
    if keyless_per_family:
        yield from keyless_variants(cases, keyless_per_family)


def _prefill_cases(seed: int, count: int, preset: str, families: tuple[str, ...]) -> Iterator[Case]:
    prefix = "numeric" if preset == "tiny" else f"numeric-{preset}"
    for index in range(count):
        family = families[index % len(families)]
        k = index // len(families)
        rng = random.Random(f"{seed}:prefill:{family}:{index}")
        world = interleave = 1
        if family in NUMERIC_DCP_FAMILIES:
            contexts, queries, block, workspace, world, interleave = _dcp_numeric_batch(rng, k)
            align = True
            spec = replace(PRESETS[preset], dtype=NUMERIC_DTYPES[k % 3], seed=rng.randrange(1 << 31))
        elif family in NUMERIC_COVERAGE_FAMILIES:
            contexts, queries, block, workspace, align = _coverage_numeric_batch(family, rng, k)
            spec = replace(PRESETS[preset], dtype=NUMERIC_DTYPES[k % 3], seed=rng.randrange(1 << 31))
        else:
            contexts, block, workspace, align = _numeric_batch(family, rng)
            spec = replace(PRESETS[preset], dtype=NUMERIC_DTYPES[k % 3], seed=rng.randrange(1 << 31))
            queries = _small_queries(rng, len(contexts))
        yield Case(
            name=f"{prefix}-{family}-{index:04d}",
            family=family,
            context_lens=tuple(contexts),
            query_lens=queries,
            block_size=block,
            workspace_size=workspace,
            dcp_world_size=world,
            cp_kv_cache_interleave_size=interleave,
            align_to_block=align,
            numeric=spec,
        )
