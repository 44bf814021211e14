"""Seeded generator of heterogeneous prefill batches, by named family.

Determinism: case ``k`` of a suite is drawn from ``random.Random(f"{seed}:{family}:{k}")``.
Python seeds a ``Random`` from a string through SHA-512, so the same seed gives
the same cases on any machine and under any ``PYTHONHASHSEED``. Families are
dealt round-robin, so every family is represented in any prefix of a suite.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
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


FAMILIES: dict[str, Callable[[random.Random], Case]] = {
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


def generate(seed: int, count: int, families: list[str] | None = None) -> Iterator[Case]:
    """``count`` cases, families dealt round-robin; case names are ``<family>-<k>``.

    Every case is valid input (``harness.cases.case_from_json`` accepts its JSON).
    """
    names = families or list(FAMILIES)
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


def legacy_grid_has_keyless_rows(case: Case) -> bool:
    """Whether the legacy equal-share grid (SPEC 1a) of ``case`` hands the
    attention kernel a query row without keys: a request with zero rows in some
    chunk of the grid (a zero-context request in any chunk, or a short request
    in a later one). Such rows are what seeds/003's neutralisation is for.

    Request ``i`` has rows in chunk ``j`` iff ``c_i > j * share``, so some chunk
    has a keyless request iff ``min(c) <= (num_chunks - 1) * share``. False when
    no request has context (no chunks) or the grid cannot plan the case.
    """
    with_context = sum(1 for c in case.context_lens if c > 0)
    if with_context == 0:
        return False
    share = case.workspace_size // with_context // case.alignment * case.alignment
    if share <= 0:
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


def generate_prefill(seed: int, count: int, preset: str = "tiny", keyless_per_family: int = 0) -> Iterator[Case]:
    """L3 cases (layout and numeric) over :data:`NUMERIC_FAMILIES`, dtypes dealt in
    turn; named ``numeric-<family>-<index>``, with the preset after ``numeric``
    for any preset but ``tiny``. Then, when ``keyless_per_family`` is set, the
    :func:`keyless_variants` of those cases, after all of them (so the first
    ``count`` cases, their names and their order do not depend on it)."""
    cases = list(_prefill_cases(seed, count, preset))
    yield from cases
    if keyless_per_family:
        yield from keyless_variants(cases, keyless_per_family)


def _prefill_cases(seed: int, count: int, preset: str) -> Iterator[Case]:
    prefix = "numeric" if preset == "tiny" else f"numeric-{preset}"
    for index in range(count):
        family = NUMERIC_FAMILIES[index % len(NUMERIC_FAMILIES)]
        rng = random.Random(f"{seed}:prefill:{family}:{index}")
        contexts, block, workspace, align = _numeric_batch(family, rng)
        spec = replace(
            PRESETS[preset], dtype=NUMERIC_DTYPES[(index // len(NUMERIC_FAMILIES)) % 3], seed=rng.randrange(1 << 31)
        )
        yield Case(
            name=f"{prefix}-{family}-{index:04d}",
            family=family,
            context_lens=tuple(contexts),
            query_lens=_small_queries(rng, len(contexts)),
            block_size=block,
            workspace_size=workspace,
            align_to_block=align,
            numeric=spec,
        )
