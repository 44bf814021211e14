"""Generated items of the sparse path: batches aimed at every edge of the route,
top-k mask cases aimed at every edge of the mask builder and the remap, and
the sparse workspace grids.

Every generator is a pure function of its seed. The families (each item
carries its family's name):

- ``sparse-route``: batches whose longest sequence sits on, one below or one
  above a sequence-length bucket edge of the masked-MHA threshold table (2048
  to 32768) or ``index_topk``, with a longest query on, below or above that
  bucket's minimum, over every backend with thresholds and others, TP sizes
  with and without a table;
- ``sparse-fit``: a mask workspace that fits the suffix and chunk masks (or the
  global mask) exactly, by one word, or misses by one;
- ``sparse-tile``: longest queries of 128, 129, 256 and 257 (the tile switch);
- ``sparse-force``: the three forcing flags, alone and together, the masked
  kernel missing, and mask workspaces too small for a forced masked run;
- ``sparse-mixed``: heterogeneous batches with zero-context requests,
  continuations and DCP worlds (the masked route is off under DCP);
- ``topk-mask-*`` (L2): one form each (single, batched, global), query lengths
  on both sides of 128/256, key lengths on both sides of a 32-key word, ranges
  that start mid-sequence (continuation pieces) and end at, before and after a
  sequence's end, every index pattern.
"""

from __future__ import annotations

import itertools
import random

from harness.cases.sparse_decisions import FAMILY, generate_decision_cases
from harness.model.sparse import (
    MASK_FORMS,
    MASKED_MHA_THRESHOLDS,
    ROW_PATTERNS,
    SEQ_LEN_EDGES,
    SPARSE_BACKENDS,
    TOPK_PATTERNS,
    MaskForm,
    SparseCase,
    SparseWorkspaceConfig,
    TopkMaskCase,
    mask_words,
)

SPARSE_FAMILIES = ("sparse-route", "sparse-fit", "sparse-tile", "sparse-force", "sparse-mixed")
MASK_FAMILIES = ("topk-mask-single", "topk-mask-batched", "topk-mask-global")

# The masked-MHA threshold table and its sequence-length bucket edges (SPEC 1d).
BUCKET_EDGES = SEQ_LEN_EDGES
TOPK_CLASSES = (1, 256, 512, 1024, 2048, 2049)
THRESHOLD_TABLES = MASKED_MHA_THRESHOLDS


def _mask_words(batch: int, max_query: int, max_keys: int, reserve: bool = False) -> int:
    """The words a mask of this batch takes (only to aim workspace sizes at an edge: both sides still decide)."""
    return mask_words(batch, max_query, max_keys, reserve)


def _batch_with(rng: random.Random, max_seq: int, max_query: int, requests: int) -> tuple[list[int], list[int]]:
    """A batch whose longest sequence is ``max_seq`` and longest query ``max_query``."""
    max_query = max(1, min(max_query, max_seq))
    query = [max_query] + [rng.randint(1, max_query) for _ in range(requests - 1)]
    context = [max_seq - max_query] + [rng.randint(0, max(0, max_seq - q)) for q in query[1:]]
    if requests > 2 and rng.random() < 0.4:
        context[rng.randrange(1, requests)] = 0
    order = list(range(requests))
    rng.shuffle(order)
    return [context[i] for i in order], [query[i] for i in order]


def _route_case(rng: random.Random, name: str) -> SparseCase:
    (backend, tp), minimums = rng.choice(list(THRESHOLD_TABLES.items()))
    if rng.random() < 0.2:
        backend, tp = rng.choice(SPARSE_BACKENDS[2:]), rng.choice((1, 2, 4, 8))
    if rng.random() < 0.1:
        tp = rng.choice((3, 16))
    bucket = rng.randrange(len(BUCKET_EDGES))
    topk = rng.choice(TOPK_CLASSES)
    if rng.random() < 0.3:
        max_seq = max(1, topk + rng.choice((-1, 0, 1)))
    else:
        max_seq = BUCKET_EDGES[bucket] + rng.choice((-1, 0, 1))
    minimum = minimums[bucket] or rng.choice((512, 1536, 4096))
    max_query = min(max_seq, minimum + rng.choice((-1, 0, 1)))
    context, query = _batch_with(rng, max_seq, max_query, rng.randint(1, 4))
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        rng.choice((16, 64)),
        max_model_len=rng.choice((max_seq, 163840)),
        max_num_seqs=rng.choice((1, 4, 256)),
        index_topk=topk,
        backend=backend,
        tensor_parallel_size=tp,
        family="sparse-route",
    )


def _fit_case(rng: random.Random, name: str) -> SparseCase:
    """A masked-route batch with a mask workspace at an edge of one of the two checks."""
    (backend, tp), minimums = ("FLASHMLA_SPARSE", 8), THRESHOLD_TABLES[("FLASHMLA_SPARSE", 8)]
    bucket = rng.randrange(len(BUCKET_EDGES))
    max_seq = rng.randint(BUCKET_EDGES[bucket - 1] + 1 if bucket else 2049, max(BUCKET_EDGES[bucket], 2049))
    max_query = rng.randint(minimums[bucket] or 512, min(max_seq, (minimums[bucket] or 512) + 300))
    requests = rng.randint(1, 3)
    context, query = _batch_with(rng, max_seq, max_query, requests)
    if not any(context):
        context[0] = max_seq - query[0] or 1
    block = rng.choice((16, 64))
    # The chunk masks' longest key range is at most the workspace, which is
    # unknown here: aim at the suffix/global sizes and at a sweep around them.
    global_words = _mask_words(requests, max(query), max(c + q for c, q in zip(context, query, strict=True)), True)
    per_range = _mask_words(requests, max(query), max(max(query), min(max(context), 65536)))
    target = rng.choice((global_words, per_range))
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        block,
        max_model_len=163840,
        max_num_seqs=256,
        index_topk=2048,
        backend=backend,
        tensor_parallel_size=tp,
        mask_workspace_words=max(0, target + rng.choice((-1, 0, 1))),
        family="sparse-fit",
    )


def _tile_case(rng: random.Random, name: str) -> SparseCase:
    max_query = rng.choice((127, 128, 129, 255, 256, 257))
    max_seq = max_query + rng.choice((0, 31, 32, 33, 3000))
    context, query = _batch_with(rng, max_seq, max_query, rng.randint(1, 5))
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        16,
        max_model_len=4096,
        max_num_seqs=rng.choice((2, 64)),
        index_topk=rng.choice((256, 2048)),
        mask_workspace_words=rng.choice((1 << 25, 4096, 100000)),
        family="sparse-tile",
    )


def _force_case(rng: random.Random, name: str) -> SparseCase:
    max_seq = rng.choice((1000, 2048, 2049, 5000))
    context, query = _batch_with(rng, max_seq, rng.choice((100, 600, 2000)), rng.randint(1, 3))
    flags = rng.choice([(a, b, c) for a, b, c in itertools.product((False, True), repeat=3) if a or b or c])
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        64,
        max_model_len=8192,
        max_num_seqs=128,
        index_topk=2048,
        tensor_parallel_size=8,
        masked_kernel=rng.random() < 0.7,
        # A small mask workspace: a forced masked run whose masks do not fit.
        mask_workspace_words=rng.choice((None, 20000, 300000)),
        dcp_world_size=rng.choice((1, 1, 1, 2)),
        force_dense_mha=flags[0],
        force_masked_mha=flags[1],
        force_mqa=flags[2],
        family="sparse-force",
    )


def _mixed_case(rng: random.Random, name: str) -> SparseCase:
    requests = rng.randint(1, 12)
    context = [rng.choice((0, rng.randint(1, 300), rng.randint(1000, 40000))) for _ in range(requests)]
    query = [rng.choice((1, rng.randint(1, 64), rng.randint(100, 2500))) for _ in range(requests)]
    world = rng.choice((1, 1, 1, 2, 3, 4, 8))
    return SparseCase(
        name,
        tuple(context),
        tuple(query),
        rng.choice((1, 16, 48, 64)),
        max_model_len=rng.choice((4096, 163840)),
        max_num_seqs=rng.choice((1, 3, 16, 256)),
        index_topk=rng.choice(TOPK_CLASSES),
        dcp_world_size=world,
        cp_kv_cache_interleave_size=rng.choice((1, 16)) if world > 1 else 1,
        align_to_block=rng.random() < 0.9,
        backend=rng.choice(SPARSE_BACKENDS[:2]),
        tensor_parallel_size=rng.choice((1, 2, 4, 8)),
        family="sparse-mixed",
    )


_SPARSE_MAKERS = {
    "sparse-route": _route_case,
    "sparse-fit": _fit_case,
    "sparse-tile": _tile_case,
    "sparse-force": _force_case,
    "sparse-mixed": _mixed_case,
}


# Families built from a table rather than drawn (harness/cases/sparse_decisions.py):
# a group names one alone and takes its first ``count`` items.
AIMED_FAMILIES = {FAMILY: generate_decision_cases}


def generate_sparse(seed: int, count: int, families: list[str] | None = None) -> list[SparseCase]:
    """``count`` sparse cases dealt round-robin over ``families`` (default all
    the drawn ones), or the first ``count`` of one aimed family."""
    if families and any(f in AIMED_FAMILIES for f in families):
        if len(families) != 1:
            raise ValueError(f"an aimed family ({', '.join(AIMED_FAMILIES)}) is named alone in its group")
        return AIMED_FAMILIES[families[0]](seed, count)
    rng = random.Random(seed)
    chosen = families or list(SPARSE_FAMILIES)
    return [
        _SPARSE_MAKERS[chosen[i % len(chosen)]](rng, f"{chosen[i % len(chosen)]}-{seed % 10000:04d}-{i:04d}")
        for i in range(count)
    ]


def _mask_case(rng: random.Random, form: str, name: str) -> TopkMaskCase:
    requests = 1 if form == MaskForm.SINGLE else rng.randint(2, 4)
    query = [rng.choice((1, 7, 127, 128, 129, 255, 256, 257)) for _ in range(requests)]
    if rng.random() < 0.5:
        query = [min(q, 130) for q in query]  # keep most interpreted kernels small
    seqs = [max(q, rng.choice((1, 31, 32, 33, 63, 64, 65, 500, 2049))) for q in query]
    topk = rng.choice((1, 16, 64, 256))
    starts, lens, keys = [], [], []
    for length in seqs:
        start = rng.choice((0, 0, length // 2, max(0, length - 1), rng.randint(0, length)))
        span = rng.choice((length - start, max(0, length - start - 1), rng.randint(0, length - start), length))
        starts.append(start)
        lens.append(span)
        keys.append(rng.choice((0, start, length - 1)))
    return TopkMaskCase(
        name,
        tuple(query),
        tuple(seqs),
        topk,
        form,
        rng.choice(TOPK_PATTERNS),
        rng.randrange(1 << 31),
        tuple(starts),
        tuple(lens),
        tuple(keys) if form == MaskForm.GLOBAL else (),
        family=f"topk-mask-{form}",
    )


MASK_ROWS_FAMILY = "topk-mask-rows"


def _mask_rows_cases(seed: int) -> list[TopkMaskCase]:
    """Each row pattern of :data:`ROW_PATTERNS` and duplicates, in each mask form:
    32 indices a row over sequences of 64 and 40 keys (full rows hold 32 distinct
    keys), ranges that start mid-sequence (continuation pieces). The first four
    hold each pattern once and every form (ci takes those), the rest the other
    pairs."""
    patterns = (*ROW_PATTERNS, "duplicates")
    first = [(pattern, MASK_FORMS[i % len(MASK_FORMS)]) for i, pattern in enumerate(patterns)]
    pairs = first + [pair for pair in itertools.product(patterns, MASK_FORMS) if pair not in first]
    cases = []
    for index, (pattern, form) in enumerate(pairs):
        requests = 1 if form == MaskForm.SINGLE else 2
        cases.append(
            TopkMaskCase(
                f"{MASK_ROWS_FAMILY}-{seed % 10000:04d}-{index:04d}",
                (5, 3)[:requests],
                (64, 40)[:requests],
                32,
                form,
                pattern,
                seed + index,
                (16, 8)[:requests],
                (30, 32)[:requests],
                (16, 8)[:requests] if form == MaskForm.GLOBAL else (),
                family=MASK_ROWS_FAMILY,
            )
        )
    return cases


def generate_mask_cases(seed: int, count: int, families: list[str] | None = None) -> list[TopkMaskCase]:
    """``count`` top-k mask cases dealt round-robin over the three forms, or the
    first ``count`` of the aimed :data:`MASK_ROWS_FAMILY` named alone."""
    if families == [MASK_ROWS_FAMILY]:
        return _mask_rows_cases(seed)[:count]
    rng = random.Random(seed)
    forms = MASK_FORMS
    return [_mask_case(rng, forms[i % 3], f"topk-mask-{seed % 10000:04d}-{i:04d}") for i in range(count)]


SPARSE_GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
    "sparse-small": {
        "index_topk": (1, 256, 2048, 2049),
        "max_model_len": (2048, 163840),
        "max_num_seqs": (1, 256),
        "block_size": (16, 64),
        "dcp_world_size": (1, 4),
        "interleave": (1, 64),
    },
    # Each of the min's three terms binds somewhere, and the block floor; block
    # sizes off the powers of two, DCP worlds where lcm(block, I*D) is neither.
    "sparse-full": {
        "index_topk": TOPK_CLASSES,
        "max_model_len": (1, 100, 2048, 8192, 163840),
        "max_num_seqs": (1, 3, 64, 256, 1024),
        "block_size": (1, 3, 16, 48, 64, 528),
        "dcp_world_size": (1, 3, 4),
        "interleave": (1, 16),
    },
}


def sparse_workspace_grid(kind: str) -> tuple[SparseWorkspaceConfig, ...]:
    axes = SPARSE_GRIDS[kind]
    configs = []
    for topk, length, seqs, block, world, interleave in itertools.product(*axes.values()):
        if world == 1 and interleave != 1:
            continue
        configs.append(SparseWorkspaceConfig(length, seqs, block, topk, world, interleave))
    return tuple(configs)
