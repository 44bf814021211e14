"""The coverage layout families (:data:`COVERAGE_FAMILIES`): they push every
integer the planner computes past the widths a port may store it in (2^8,
2^11, 2^16) and use block sizes, DCP worlds and interleaves that are not
powers of two.

A suite deals them in a group of their own, apart from the sweep families
(:mod:`harness.cases.sweep_families`), so adding a coverage family never
changes a sweep case. As there, each family is a function of one
``random.Random`` alone, and the order of its draws is part of every suite
(``tests/test_generate_coverage.py`` pins a digest).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from harness.cases.sweep_families import _case, _queries, draws_below
from harness.model import Case, alignment_unit

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


def _few_rows(rng: random.Random, block: int, n: int) -> list[int]:
    """``n`` contexts of a few rows: most batches of thousands are short contexts."""
    # rng.choice((1, 1, 2, 3, rng.randint(1, min(64, 2 * block)))) per request.
    draw, widest = draws_below(rng), min(64, 2 * block)
    return [(1, 1, 2, 3, 1 + draw(widest))[draw(5)] for _ in range(n)]


def _small_query_lens(rng: random.Random, n: int) -> tuple[int, ...]:
    # rng.choice((1, 1, 2, rng.randint(1, 8))) per request.
    draw = draws_below(rng)
    return tuple((1, 1, 2, 1 + draw(8))[draw(4)] for _ in range(n))


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
    contexts = _few_rows(rng, block, n)
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


COVERAGE_FAMILIES: dict[str, Callable[[random.Random], Case]] = {
    "wide-batch": wide_batch,
    "wide-context": wide_context,
    "width-edges": width_edges,
    "hybrid-block": hybrid_block,
    "dcp-hybrid": dcp_hybrid,
}
