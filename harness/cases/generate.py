"""Seeded generator of heterogeneous prefill batches, by named family.

Determinism: case ``k`` of a suite is drawn from ``random.Random(f"{seed}:{family}:{k}")``.
Python seeds a ``Random`` from a string through SHA-512, so the same seed gives
the same cases on any machine and under any ``PYTHONHASHSEED``. Families are
dealt round-robin, so every family is represented in any prefix of a suite.

Two sets of layout families: the sweep families (:data:`SWEEP_FAMILIES`, the
default of :func:`generate`, powers of two and batches of up to 1024 requests)
and the coverage families (:data:`COVERAGE_FAMILIES`), which push every integer
the planner computes past the widths a port may store it in (2^8, 2^11, 2^16)
and use block sizes, DCP worlds and interleaves that are not powers of two. A
suite deals them in separate groups, so adding a coverage family never changes
a sweep case. The L3 generator has the same split (:data:`NUMERIC_FAMILIES`,
:data:`NUMERIC_COVERAGE_FAMILIES`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from harness.model import KEYLESS_ROWS, NUMERIC_DTYPES, PRESETS, Case, alignment_unit

BLOCK_SIZES = (1, 16, 16, 32, 64, 128)
WORKSPACES = (64, 128, 256, 512, 1024, 2048, 4096)
LARGE_WORKSPACES = (16384, 65536)

# Upstream's worst case (SPEC section 1a): one request with 60000 context rows
# and 31 with 16, W = 65536, block 16; the legacy grid takes 30 chunks for it.
WORST_CASE_CONTEXT = (60000,) + (16,) * 31
WORST_CASE_QUERY = (513,) * 32


def _queries(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.choice((1, rng.randint(1, 32), rng.randint(1, 600))) for _ in range(n))


def _base(rng: random.Random) -> tuple[int, int]:
    """A block size and a workspace that holds at least one block."""
    block = rng.choice(BLOCK_SIZES)
    # Small workspaces exercise the same splits as large ones at a fraction of
    # the rows; a few large ones keep realistic sizes in every suite.
    workspace = max(rng.choice(LARGE_WORKSPACES if rng.random() < 0.04 else WORKSPACES), block)
    if rng.random() < 0.25:
        # Engines align the workspace, but the planner must cope with any size.
        workspace += rng.randint(1, block) if block > 1 else rng.randint(1, 7)
    return block, workspace


def _case(family: str, contexts: list[int], rng: random.Random, block: int, workspace: int, **extra: object) -> Case:
    return Case(
        name="",
        family=family,
        context_lens=tuple(contexts),
        query_lens=_queries(rng, len(contexts)),
        block_size=block,
        workspace_size=workspace,
        **extra,  # type: ignore[arg-type]
    )


def skew(rng: random.Random) -> Case:
    """A few giant contexts among many tiny ones (the shape the legacy grid wastes on)."""
    if rng.random() < 0.1:
        return Case("", WORST_CASE_CONTEXT, WORST_CASE_QUERY, 16, 65536, family="skew")
    block, workspace = _base(rng)
    n = rng.randint(2, 48)
    contexts = [rng.randint(1, 2 * block) for _ in range(n)]
    for _ in range(rng.randint(1, 3)):
        contexts[rng.randrange(n)] = rng.randint(workspace // 2, 3 * workspace)
    return _case("skew", contexts, rng, block, workspace)


def uniform(rng: random.Random) -> Case:
    block, workspace = _base(rng)
    n = rng.randint(1, 64)
    size = rng.randint(1, max(1, 2 * workspace // n))
    return _case("uniform", [size] * n, rng, block, workspace)


def zero_context(rng: random.Random) -> Case:
    """Requests without context leading, trailing and in runs between others."""
    block, workspace = _base(rng)
    n = rng.randint(2, 40)
    contexts = [rng.randint(1, workspace) for _ in range(n)]
    shape = rng.choice(("leading", "trailing", "runs", "alternating", "all"))
    if shape == "leading":
        k = rng.randint(1, n)
        contexts[:k] = [0] * k
    elif shape == "trailing":
        k = rng.randint(1, n)
        contexts[n - k :] = [0] * k
    elif shape == "runs":
        for _ in range(rng.randint(1, 4)):
            start = rng.randrange(n)
            for i in range(start, min(n, start + rng.randint(1, 5))):
                contexts[i] = 0
    elif shape == "alternating":
        contexts = [c if i % 2 else 0 for i, c in enumerate(contexts)]
    else:
        contexts = [0] * n
    return _case("zero-context", contexts, rng, block, workspace)


def exact_fit(rng: random.Random) -> Case:
    """Total context exactly at, one row off, and one block off the workspace."""
    block, workspace = _base(rng)
    target = workspace + rng.choice((0, -1, 1, -block, block))
    target = max(1, target)
    n = rng.randint(1, 12)
    cuts = sorted(rng.sample(range(1, target), min(n - 1, target - 1))) if target > 1 else []
    contexts = [b - a for a, b in zip([0, *cuts], [*cuts, target], strict=True)]
    return _case("exact-fit", contexts, rng, block, workspace)


def long_single(rng: random.Random) -> Case:
    """A request far longer than the workspace: many continuations, maybe with neighbours."""
    block, workspace = _base(rng)
    workspace = min(workspace, 4096)
    giant = rng.randint(2 * workspace, 12 * workspace)
    contexts = [giant]
    if rng.random() < 0.5:
        contexts = [rng.randint(0, workspace) for _ in range(rng.randint(0, 4))] + contexts
        contexts += [rng.randint(0, workspace) for _ in range(rng.randint(0, 4))]
    return _case("long-single", contexts, rng, block, workspace)


def unaligned_tails(rng: random.Random) -> Case:
    """Contexts that end mid-block, so splits and tails never line up."""
    block = rng.choice((16, 32, 64, 128))
    workspace = max(rng.choice(WORKSPACES), block)
    n = rng.randint(2, 24)
    contexts = [rng.randint(0, 4 * workspace // n // block + 1) * block + rng.randint(1, block - 1) for _ in range(n)]
    return _case("unaligned-tails", contexts, rng, block, workspace)


def many_requests(rng: random.Random) -> Case:
    block, workspace = _base(rng)
    n = rng.randint(512, 1024)
    contexts = [rng.choice((0, rng.randint(1, 64), rng.randint(1, 2 * block + 1))) for _ in range(n)]
    return _case("many-requests", contexts, rng, block, workspace)


def tiny_workspace(rng: random.Random) -> Case:
    """A workspace of one alignment unit (or barely more)."""
    block = rng.choice((1, 16, 32, 64, 128))
    workspace = block + (rng.randint(1, block - 1) if block > 1 and rng.random() < 0.3 else 0)
    n = rng.randint(1, 16)
    contexts = [rng.randint(0, 6 * block) for _ in range(n)]
    return _case("tiny-workspace", contexts, rng, block, workspace)


def unaligned_split(rng: random.Random) -> Case:
    """Block alignment off: splits may land on any row."""
    block, workspace = _base(rng)
    n = rng.randint(1, 24)
    contexts = [rng.randint(0, workspace) for _ in range(n)]
    return _case("unaligned-split", contexts, rng, block, workspace, align_to_block=False)


def dcp(rng: random.Random) -> Case:
    """Decode-context parallel: world 2/4/8, interleave 1/16/64, block 16/64/128."""
    world = rng.choice((2, 4, 8))
    interleave = rng.choice((1, 16, 64))
    block = rng.choice((16, 64, 128))
    unit = alignment_unit(block, world, interleave)
    workspace = unit * rng.choice((1, 2, 3, 8, 32))
    if rng.random() < 0.25:
        workspace += rng.randint(1, unit - 1) if unit > 1 else 1
    n = rng.randint(1, 24)
    shape = rng.choice(("mixed", "skew", "zeros"))
    contexts = [rng.randint(0, 2 * workspace // n + 1) for _ in range(n)]
    if shape == "skew":
        contexts[rng.randrange(n)] = rng.randint(workspace, 5 * workspace)
    elif shape == "zeros":
        contexts = [c if rng.random() < 0.6 else 0 for c in contexts]
    return _case("dcp", contexts, rng, block, workspace, dcp_world_size=world, cp_kv_cache_interleave_size=interleave)


# -- coverage families: integer widths and arithmetic off the powers of two -------------------

# Block sizes of hybrid attention + state-space models (528, 544, 1056: pages
# that line up with the state) and small odd ones. On them lcm(block, I*D) and
# max(block, I*D), or rounding up to the block before and after the 65,536-row
# cap, give different answers although they agree on every power of two.
HYBRID_BLOCK_SIZES = (528, 544, 1056, 3, 48, 80)
# DCP worlds that divide real tensor-parallel sizes.
DCP_WORLDS = (2, 3, 4, 6, 8)
# Boundaries of the integer widths a port may store a planner value in: 2^8
# (uint8), 2^11 (a 2048-entry table), 2^16 (uint16 / int16 indices).
WIDTH_EDGES = (1 << 8, 1 << 11, 1 << 16)
DCP_BLOCK_SIZES = (1, 3, 16, 48, 64, 80, 128, 528, 544, 1056)
# The largest alignment unit a DCP coverage case takes, so that a few units of
# workspace and context stay a few hundred thousand rows.
MAX_DCP_UNIT = 1 << 14


def _few_rows(rng: random.Random, block: int) -> int:
    """A context of a few rows: most batches of thousands are short contexts."""
    return rng.choice((1, 1, 2, 3, rng.randint(1, min(64, 2 * block))))


def _small_query_lens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.choice((1, 1, 2, rng.randint(1, 8))) for _ in range(n))


def wide_batch(rng: random.Random) -> Case:
    """Thousands of requests with context in one batch: chunks of hundreds and of
    thousands of requests (chunk-local request indices and ``token_to_seq`` values
    past 2^8 and 2^11), query offsets past 2^16, and now and then more than 65,536
    requests (request indices past 2^16). Contexts stay a few rows, so the batch
    costs the planner requests, not rows."""
    block = rng.choice((1, 16, 16, 528))
    if rng.random() < 0.05:
        # More than 65,536 requests, and a workspace that holds them all in one
        # chunk: chunk-local request indices past 2^16 too.
        n = rng.randint(65537, 70000)
        workspace = rng.choice((1 << 18, (1 << 18) + rng.randint(1, 999)))
        contexts = [rng.choice((1, 1, 2, 3)) for _ in range(n)]
        queries = _small_query_lens(rng, n)
        return Case("", tuple(contexts), queries, block, workspace, family="wide-batch")
    n = rng.choice((rng.randint(300, 1500), rng.randint(2000, 12000)))
    workspace = max(block, rng.choice((1024, 4096, 16384, 65536)) // block * block)
    if rng.random() < 0.25:
        workspace += rng.randint(1, block) if block > 1 else rng.randint(1, 7)
    contexts = [_few_rows(rng, block) for _ in range(n)]
    shape = rng.choice(("dense", "runs", "scattered"))
    if shape == "runs":
        # Long runs of requests with context between zero-context ones: a
        # zero-context request closes a chunk of hundreds or thousands.
        at = rng.randint(0, 400)
        while at < n:
            contexts[at] = 0
            at += rng.randint(200, 5000)
    elif shape == "scattered":
        contexts = [c if rng.random() < 0.97 else 0 for c in contexts]
    # Long queries (about a hundred tokens each) take the query offsets past 2^16.
    queries = _queries(rng, n) if rng.random() < 0.5 else _small_query_lens(rng, n)
    return Case("", tuple(contexts), queries, block, workspace, family="wide-batch")


def wide_context(rng: random.Random) -> Case:
    """Contexts and chunk starts past 2^16 rows, and cumulative offsets past 2^16
    in workspaces of more than 65,536 rows (the dense size 65,536 rounded up to a
    block that does not divide it, or larger engine-set sizes)."""
    block = rng.choice((1, 16, 64, 528, 1056))
    align = rng.random() < 0.8
    unit = block if align else 1
    shape = rng.choice(("continued", "packed", "skew"))
    if shape == "continued":
        # A workspace far below the request: starts step past 2^16 over many chunks.
        workspace = max(unit, rng.choice((4096, 16384, 65536)) // unit * unit)
        contexts = [rng.randint(65537, 200000)]
        contexts = [rng.randint(0, 2 * block) for _ in range(rng.randint(0, 3))] + contexts
        contexts += [rng.randint(0, workspace) for _ in range(rng.randint(0, 3))]
    elif shape == "packed":
        # One chunk of more than 65,536 rows: cu_seq_lens past 2^16.
        workspace = rng.choice((-(-65536 // unit) * unit, 1 << 17, (1 << 17) + rng.randint(1, 999), 3 << 16))
        workspace = max(workspace, unit)
        n = rng.randint(1, 12)
        contexts = [rng.randint(1, 2 * workspace // n) for _ in range(n)]
    else:
        workspace = max(unit, rng.choice((16384, 65536, 1 << 17)) // unit * unit)
        n = rng.randint(4, 64)
        contexts = [rng.randint(0, 2 * block) for _ in range(n)]
        for _ in range(rng.randint(1, 2)):
            contexts[rng.randrange(n)] = rng.randint(65537, 1 << 18)
    return _case("wide-context", contexts, rng, block, workspace, align_to_block=align)


def width_edges(rng: random.Random) -> Case:
    """One planner value right at, one below or one above 2^8, 2^11 or 2^16: a
    context length, a chunk start, a chunk's rows (its last ``cu_seq_lens``), a
    chunk's request count (its largest ``token_to_seq``), a chunk's token offset
    (wide-batch holds the batches of more than 65,536 requests)."""
    edge = rng.choice(WIDTH_EDGES)
    value = edge + rng.choice((-1, 0, 1))
    shapes = ["context", "start", "rows", "tokens"]
    if edge < 1 << 16 or rng.random() < 0.25:
        # 65,536 requests cost the planner the most: a quarter as often.
        shapes.append("requests")
    what = rng.choice(shapes)
    block = rng.choice((1, 16))
    align = True
    queries: tuple[int, ...] | None = None
    if what == "context":
        workspace = max(block, rng.choice((value // 3, value, 2 * value, 65536)) // block * block)
        contexts = [rng.randint(0, 64) for _ in range(rng.randint(0, 4))] + [value]
        contexts += [rng.randint(0, 64) for _ in range(rng.randint(0, 4))]
    elif what == "start":
        # Alignment off, so the second chunk starts exactly where the first one ends.
        align = False
        workspace = value
        contexts = [value + rng.randint(1, 3 * value)]
    elif what == "rows":
        # A full chunk of exactly `value` rows, then a request that spills.
        align = False
        workspace = value
        n = rng.randint(1, 8)
        cuts = sorted(rng.sample(range(1, value), n - 1))
        contexts = [b - a for a, b in zip([0, *cuts], [*cuts, value], strict=True)] + [rng.randint(1, value)]
    elif what == "requests":
        # `value` one-row requests fill the first chunk; the next ones open a second.
        workspace = max(block, value)
        contexts = [1] * value + [rng.randint(1, 3) for _ in range(rng.randint(1, 20))]
        queries = _small_query_lens(rng, len(contexts))
    else:
        # The second chunk's first token sits at `value`: token_start, continuation_token_end.
        workspace = max(block, rng.choice((64, 1024)) // block * block)
        contexts = [workspace, rng.randint(1, 3 * workspace), rng.randint(0, workspace)]
        queries = (value, rng.randint(1, 600), rng.randint(1, 600))
    if queries is None:
        queries = _queries(rng, len(contexts))
    return Case("", tuple(contexts), queries, block, workspace, align_to_block=align, family="width-edges")


def _hybrid_workspace(rng: random.Random, block: int) -> int:
    roll = rng.random()
    if roll < 0.1:
        # The dense size upstream sizes for this block: 65,536 rounded up to it.
        return -(-65536 // block) * block
    if roll < 0.15:
        return max(block, 65536)  # not a multiple of the block
    workspace = block * rng.choice((1, 2, 3, 5, 8, 16, 64))
    if rng.random() < 0.25:
        workspace += rng.randint(1, block - 1) if block > 1 else 1
    return workspace


def hybrid_block(rng: random.Random) -> Case:
    """Block sizes that are not powers of two (528, 544, 1056; 3, 48, 80), in the
    shapes of the sweep: skew, exact fit, long continuations, tails mid-block, a
    one-block workspace, zero-context runs; alignment on and off."""
    block = rng.choice(HYBRID_BLOCK_SIZES)
    align = rng.random() < 0.75
    workspace = _hybrid_workspace(rng, block)
    shape = rng.choice(("skew", "exact-fit", "long", "tails", "one-block", "zeros"))
    n = rng.randint(1, 24)
    if shape == "skew":
        contexts = [rng.randint(1, 2 * block) for _ in range(n + 1)]
        contexts[rng.randrange(n + 1)] = rng.randint(workspace // 2 + 1, 3 * workspace)
    elif shape == "exact-fit":
        target = max(1, workspace + rng.choice((0, -1, 1, -block, block)))
        cuts = sorted(rng.sample(range(1, target), min(n - 1, target - 1))) if target > 1 else []
        contexts = [b - a for a, b in zip([0, *cuts], [*cuts, target], strict=True)]
    elif shape == "long":
        contexts = [rng.randint(2 * workspace, max(2 * workspace, min(8 * workspace, 1 << 18)))]
        contexts = [rng.randint(0, workspace) for _ in range(rng.randint(0, 3))] + contexts
    elif shape == "tails":
        contexts = [rng.randint(0, 4 * workspace // n // block + 1) * block + rng.randint(1, block) for _ in range(n)]
    elif shape == "one-block":
        workspace = block + (rng.randint(1, block - 1) if block > 1 and rng.random() < 0.3 else 0)
        contexts = [rng.randint(0, 6 * block) for _ in range(n)]
    else:
        contexts = [rng.randint(0, workspace) if rng.random() < 0.6 else 0 for _ in range(n + 2)]
    return _case("hybrid-block", contexts, rng, block, workspace, align_to_block=align)


def _interleave(rng: random.Random, block: int) -> int:
    """1, the block, a divisor of it, anything between, or (rarely) past it."""
    divisors = [d for d in range(2, block) if block % d == 0]
    choices = [1, block, rng.randint(1, block)]
    if divisors:
        choices.append(rng.choice(divisors))
    if rng.random() < 0.1:
        return rng.randint(block + 1, 2 * block + 16)
    return rng.choice(choices)


def dcp_hybrid(rng: random.Random) -> Case:
    """DCP worlds 2, 3, 4, 6 and 8, interleaves from 1 to the block size, blocks
    powers of two and not, alignment on and off: where I*D and the block do not
    nest, lcm(block, I*D) is not max(block, I*D), and ``padded(n) = ceil(n/(I*D))*I``
    is not its floor at span boundaries off the I*D grid."""
    world = rng.choice(DCP_WORLDS)
    # Most cases insist on a virtual block I*D that does not nest with the block
    # (which needs a block above 1, aligned to).
    off_grid = rng.random() < 0.6
    block = rng.choice(DCP_BLOCK_SIZES[1:] if off_grid else DCP_BLOCK_SIZES)
    align = off_grid or rng.random() < 0.7
    effective_block = block if align else 1
    for _ in range(16):
        interleave = _interleave(rng, block)
        span = interleave * world
        nested = math.lcm(effective_block, span) == max(effective_block, span)
        if alignment_unit(block, world, interleave, align) <= MAX_DCP_UNIT and not (off_grid and nested):
            break
    else:
        interleave = 1
    unit = alignment_unit(block, world, interleave, align)
    workspace = unit * rng.choice((1, 1, 2, 3, 5, 8))
    if rng.random() < 0.25:
        workspace += rng.randint(1, unit - 1) if unit > 1 else 1
    n = rng.randint(1, 24)
    contexts = [rng.randint(0, 2 * workspace // n + 1) for _ in range(n)]
    shape = rng.choice(("mixed", "skew", "zeros"))
    if shape == "skew":
        contexts[rng.randrange(n)] = rng.randint(workspace, 4 * workspace)
    elif shape == "zeros":
        contexts = [c if rng.random() < 0.6 else 0 for c in contexts]
    return _case(
        "dcp-hybrid",
        contexts,
        rng,
        block,
        workspace,
        dcp_world_size=world,
        cp_kv_cache_interleave_size=interleave,
        align_to_block=align,
    )


SWEEP_FAMILIES: dict[str, Callable[[random.Random], Case]] = {
    "skew": skew,
    "uniform": uniform,
    "zero-context": zero_context,
    "exact-fit": exact_fit,
    "long-single": long_single,
    "unaligned-tails": unaligned_tails,
    "many-requests": many_requests,
    "tiny-workspace": tiny_workspace,
    "unaligned-split": unaligned_split,
    "dcp": dcp,
}
COVERAGE_FAMILIES: dict[str, Callable[[random.Random], Case]] = {
    "wide-batch": wide_batch,
    "wide-context": wide_context,
    "width-edges": width_edges,
    "hybrid-block": hybrid_block,
    "dcp-hybrid": dcp_hybrid,
}
FAMILIES: dict[str, Callable[[random.Random], Case]] = {**SWEEP_FAMILIES, **COVERAGE_FAMILIES}


def generate(seed: int, count: int, families: list[str] | None = None) -> Iterator[Case]:
    """``count`` cases, families dealt round-robin; case names are ``<family>-<k>``.
    ``families`` defaults to the sweep families (:data:`SWEEP_FAMILIES`).

    Every case is valid input (``harness.cases.files.case_from_json`` accepts its JSON).
    """
    names = families or list(SWEEP_FAMILIES)
    for index in range(count):
        family = names[index % len(names)]
        k = index // len(names)
        rng = random.Random(f"{seed}:{family}:{k}")
        case = FAMILIES[family](rng)
        yield replace(case, name=f"{family}-{k:04d}")


# -- numeric prefill cases (L3) --------------------------------------------------------------


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
