"""The sweep layout families: heterogeneous prefill batches at the sizes
engines run, block sizes and workspaces mostly powers of two, batches of up
to 1024 requests (:data:`SWEEP_FAMILIES`, the default of
:func:`harness.cases.generate.generate`).

Each family is a function of one ``random.Random`` and nothing else, and
returns a :class:`~harness.model.Case` without a name (the generator names
it). The order of the draws is part of every suite: a draw added, removed or
reordered in a family changes its cases, and with them the items the committed
baselines list. The drawing helpers here (``_queries``, ``_case``,
:func:`draws_below`) are shared with :mod:`harness.cases.coverage_families`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from harness.model import Case, alignment_unit

BLOCK_SIZES = (1, 16, 16, 32, 64, 128)
WORKSPACES = (64, 128, 256, 512, 1024, 2048, 4096)
LARGE_WORKSPACES = (16384, 65536)

# Upstream's worst case (SPEC section 1a): one request with 60000 context rows
# and 31 with 16, W = 65536, block 16; the legacy grid takes 30 chunks for it.
WORST_CASE_CONTEXT = (60000,) + (16,) * 31
WORST_CASE_QUERY = (513,) * 32


def draws_below(rng: random.Random) -> Callable[[int], int]:
    """``rng``'s draw of an int in ``[0, n)``: the one ``randint(a, b)`` makes as
    ``a + draw(b - a + 1)`` and ``choice(seq)`` as ``seq[draw(len(seq))]``.
    Called directly it gives the same values in the same order without their
    argument checks, for the loops that draw millions (a ci suite's per-request
    lengths); tests/test_generate.py holds it to randint's and choice's values."""
    draw: Callable[[int], int] = rng._randbelow  # type: ignore[attr-defined]
    return draw


def _queries(rng: random.Random, n: int) -> tuple[int, ...]:
    # rng.choice((1, rng.randint(1, 32), rng.randint(1, 600))) per request.
    draw = draws_below(rng)
    return tuple((1, 1 + draw(32), 1 + draw(600))[draw(3)] for _ in range(n))


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
    # rng.choice((0, rng.randint(1, 64), rng.randint(1, 2 * block + 1))) per request.
    draw, tail = draws_below(rng), 2 * block + 1
    contexts = [(0, 1 + draw(64), 1 + draw(tail))[draw(3)] for _ in range(n)]
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
