"""Suites: named collections of cases and workspace configurations.

Definitions live in ``cases/suites.json``. A suite takes checked-in case files
(``files``, relative to ``cases/``), generated layout cases (``generate``: a group
``{"seed", "count"}`` or a list of groups, each with optional ``families``, the
generator families it deals, default the sweep families), a workspace-size grid
(``workspace_grid``: a grid name or a list of them, see :data:`GRIDS`; a
configuration in two grids counts once), merge cases for L2 (``merge``: seed and
count) and numeric prefill cases for L3 (``prefill``: a group with seed, count and
numeric preset, or a list of those; a group's optional ``families`` as for
``generate``, and ``keyless_per_family``, which adds, per family, that many of
its cases whose legacy grid has rows without keys again under each non-default
keyless-row behaviour). Case files with a ``numeric`` section are prefill cases too.

``--size N`` scales the whole suite: the first ``generate`` group gets N cases
and every other part its share, ``count * N // that group's count`` (rounded
down): later layout groups, the checked-in cases and both workspace grids (an
evenly spaced subset of each, in their order), the sparse batches, and, unless
``--numeric-size`` is given, every numeric group. While N > 0 each part keeps
at least one item (its first group one case, a grid one configuration), so a
quick run still reaches every level and kind of item; ``--size 0`` is empty. A
suite without a ``generate`` group has no scale, and ``--size`` leaves it whole.
``--numeric-size N`` sets the first group's count of ``merge``, ``prefill``,
``topk_mask`` and ``sparse_prefill`` to N; their later groups scale with it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.cases.fields import CaseError
from harness.cases.files import load_cases
from harness.cases.generate import generate
from harness.cases.json_input import read_json
from harness.cases.merge import generate_merge
from harness.cases.prefill_generate import generate_prefill
from harness.cases.sparse_generate import SPARSE_GRIDS, generate_mask_cases, generate_sparse, sparse_workspace_grid
from harness.cases.sparse_prefill_generate import generate_sparse_prefill
from harness.model import Case, MergeCase, WorkspaceConfig
from harness.model.names import did_you_mean
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase

CASES_DIR = Path(__file__).resolve().parents[2] / "cases"
SUITES_FILE = CASES_DIR / "suites.json"

# Axis grids: every combination of the axes, interleaves only under DCP.
_AXIS_GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
    "small": {
        "max_model_len": (2048, 163840),
        "max_num_seqs": (1, 256, 2048),
        "block_size": (16, 64),
        "dcp_world_size": (1, 4),
        "interleave": (1, 64),
    },
    "full": {
        "max_model_len": (1, 100, 2048, 4096, 8192, 32768, 163840),
        "max_num_seqs": (1, 3, 64, 256, 1024, 4096),
        "block_size": (1, 16, 64, 128),
        "dcp_world_size": (1, 2, 4, 8),
        "interleave": (1, 16, 64),
    },
}

# The "wide" grid: where formulas that agree on powers of two part ways, and
# where the size formula's intermediates pass 2^31. 8 * max_model_len reaches
# 2^31 at 2^28 (one below, at, one above); 4 * max_num_seqs * block_size passes
# it at 2^19 sequences of 1056-row blocks and 2^20 of 528 or 544. Block sizes
# that do not divide 65,536 make rounding up to the alignment before and after
# the cap differ; DCP worlds 3 and 6 and interleaves that do not nest with the
# block make lcm(block, I*D) differ from max(block, I*D).
WIDE_MODEL_LENS = (1, 100, 8191, 163840, (1 << 28) - 1, 1 << 28, (1 << 28) + 1)
WIDE_NUM_SEQS = (1, 3, 257, 1000, 1 << 19, 1 << 20)
WIDE_BLOCK_SIZES = (1, 3, 16, 48, 80, 528, 544, 1056)
WIDE_DCP_WORLDS = (2, 3, 4, 6, 8)
# Under DCP the grid crosses fewer lengths and sequence counts with more worlds
# and interleaves: one below the cap, one past it, and the two 2^31 crossings.
WIDE_DCP_MODEL_LENS = (100, 163840, (1 << 28) + 1)
WIDE_DCP_NUM_SEQS = (3, 1 << 19)


def wide_interleaves(block_size: int) -> tuple[int, ...]:
    """Interleaves from 1 to the block size: 1, 3 (rarely a divisor of a power
    of two), 16, half the block, the block itself, and 64 past small blocks."""
    values = {1, 3, 16, max(1, block_size // 2), block_size, 64}
    return tuple(sorted(values))


def _wide_grid() -> tuple[WorkspaceConfig, ...]:
    configs = [
        WorkspaceConfig(length, seqs, block)
        for length, seqs, block in itertools.product(WIDE_MODEL_LENS, WIDE_NUM_SEQS, WIDE_BLOCK_SIZES)
    ]
    for length, seqs, block, world in itertools.product(
        WIDE_DCP_MODEL_LENS, WIDE_DCP_NUM_SEQS, WIDE_BLOCK_SIZES, WIDE_DCP_WORLDS
    ):
        configs += [WorkspaceConfig(length, seqs, block, world, i) for i in wide_interleaves(block)]
    return tuple(configs)


GRIDS = (*_AXIS_GRIDS, "wide")


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[Case, ...]
    workspace_configs: tuple[WorkspaceConfig, ...]
    merge_cases: tuple[MergeCase, ...] = ()
    # The sparse path (SPEC 1d): batches (those with a numeric section also
    # sparse L3 cases), workspace settings, top-k mask cases.
    sparse_cases: tuple[SparseCase, ...] = ()
    sparse_workspace_configs: tuple[SparseWorkspaceConfig, ...] = ()
    mask_cases: tuple[TopkMaskCase, ...] = ()
    # ``parity coverage`` holds the suite to MC/DC (every condition of every
    # declared decision shown by a pair, harness/search/mcdc.py): suites.json's "mcdc".
    mcdc: bool = False


def workspace_grid(grid: str) -> tuple[WorkspaceConfig, ...]:
    """The configurations of grid ``grid`` (one of :data:`GRIDS`), in a fixed order."""
    if grid == "wide":
        return _wide_grid()
    axes = _AXIS_GRIDS[grid]
    configs = []
    for length, seqs, block, world, interleave in itertools.product(*axes.values()):
        if world == 1 and interleave != 1:
            continue  # interleave only matters under DCP
        configs.append(WorkspaceConfig(length, seqs, block, world, interleave))
    return tuple(configs)


def workspace_grids(kinds: list[str]) -> tuple[WorkspaceConfig, ...]:
    """The configurations of every grid in ``kinds``, each configuration once,
    where it first appears."""
    seen: set[WorkspaceConfig] = set()
    configs = []
    for kind in kinds:
        for config in workspace_grid(kind):
            if config not in seen:
                seen.add(config)
                configs.append(config)
    return tuple(configs)


def suite_names() -> list[str]:
    return sorted(_definitions())


def suite_description(name: str) -> str:
    """The suite's one-line description from cases/suites.json."""
    return str(_definitions()[name].get("description", ""))


def _definitions() -> dict[str, Any]:
    data = read_json(SUITES_FILE)
    if not isinstance(data, dict):
        raise CaseError(str(SUITES_FILE), None, "must be an object mapping suite names to their definitions")
    return data


def _groups(spec: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = spec.get(key, [])
    groups: list[dict[str, Any]] = value if isinstance(value, list) else [value]
    return groups


T = TypeVar("T")


@dataclass(frozen=True)
class SuiteScale:
    """What ``--size`` makes of a suite's counts: each is scaled by ``size /
    full`` (``full``: the first ``generate`` group's count), rounded down, and a
    part's first group keeps one item while ``size`` > 0. ``size`` None, or a
    suite without generated cases (``full`` 0), leaves every count as it is."""

    size: int | None
    full: int

    @property
    def scaling(self) -> bool:
        return self.size is not None and self.full > 0

    def count(self, count: int, first: bool = False) -> int:
        if self.size is None or not self.scaling:
            return count
        scaled = count * self.size // self.full
        return max(scaled, 1) if first and self.size > 0 and count > 0 else scaled

    def counts(self, groups: list[dict[str, Any]]) -> list[int]:
        return [self.count(int(group["count"]), first=i == 0) for i, group in enumerate(groups)]

    def subset(self, items: Sequence[T]) -> list[T]:
        """An evenly spaced subset of ``items`` of their scaled count, in their order."""
        keep = self.count(len(items), first=True)
        return [items[i * len(items) // keep] for i in range(keep)] if keep < len(items) else list(items)


def _counts(groups: list[dict[str, Any]], override: int) -> list[int]:
    """Each group's count when the first group's is set to ``override``: later
    groups scale with it (rounded down)."""
    counts = [int(group["count"]) for group in groups]
    if not counts:
        return counts
    first = counts[0]
    return [override] + [count * override // first if first else 0 for count in counts[1:]]


def _numeric_counts(groups: list[dict[str, Any]], numeric_size: int | None, scale: SuiteScale) -> list[int]:
    return scale.counts(groups) if numeric_size is None else _counts(groups, numeric_size)


def load_suite(name: str, size: int | None = None, numeric_size: int | None = None) -> Suite:
    """``size`` scales the suite (:class:`SuiteScale`: its first generated group
    gets ``size`` cases, every other part its share), ``numeric_size`` sets the
    numeric groups' first counts (later groups scale with it).

    A suite is a function of its arguments and of the files under ``cases/``
    (generation is seeded) and is immutable, so one process loads it once for
    the same arguments and the same files (their paths and bytes): the nightly
    suite takes seconds to generate, and a process (a test worker, the
    reproduce lines' lookups) may ask for it many times."""
    return _load_suite_once(name, size, numeric_size, _files_signature())


def _files_signature() -> str:
    """A digest of every file under ``cases/``: its path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in CASES_DIR.rglob("*") if p.is_file()):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def _load_suite_once(name: str, size: int | None, numeric_size: int | None, files: str) -> Suite:
    del files  # the key: edited case files are another load
    definitions = _definitions()
    if name not in definitions:
        raise CaseError(
            str(SUITES_FILE),
            None,
            f"no suite named {name!r}{did_you_mean(name, definitions)} (known: {', '.join(sorted(definitions))})",
        )
    spec = definitions[name]
    layout_groups = _groups(spec, "generate")
    scale = SuiteScale(size, int(layout_groups[0]["count"]) if layout_groups else 0)
    cases = scale.subset(load_cases([CASES_DIR / f for f in spec.get("files", [])]))
    for group, count in zip(layout_groups, scale.counts(layout_groups), strict=True):
        cases += list(generate(group["seed"], count, group.get("families")))
    prefill_groups = _groups(spec, "prefill")
    for group, count in zip(prefill_groups, _numeric_counts(prefill_groups, numeric_size, scale), strict=True):
        cases += list(
            generate_prefill(
                group["seed"], count, group["preset"], group.get("keyless_per_family", 0), group.get("families")
            )
        )
    merge_cases: tuple[MergeCase, ...] = ()
    if "merge" in spec:
        (count,) = _numeric_counts([spec["merge"]], numeric_size, scale)
        merge_cases = tuple(generate_merge(spec["merge"]["seed"], count))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise CaseError(str(SUITES_FILE), name, f"case name {duplicate!r} appears twice")
    grids = spec.get("workspace_grid", [])
    grid = tuple(scale.subset(workspace_grids(grids if isinstance(grids, list) else [grids])))
    sparse_groups = _groups(spec, "sparse")
    sparse_cases: list[SparseCase] = []
    for group, count in zip(sparse_groups, scale.counts(sparse_groups), strict=True):
        sparse_cases += generate_sparse(group["seed"], count, group.get("families"))
    # Sparse L3 cases are sparse batches too (compared at sparse-layout as well).
    sparse_prefill_groups = _groups(spec, "sparse_prefill")
    for group, count in zip(
        sparse_prefill_groups, _numeric_counts(sparse_prefill_groups, numeric_size, scale), strict=True
    ):
        sparse_cases += generate_sparse_prefill(group["seed"], count, group.get("families"))
    mask_groups = _groups(spec, "topk_mask")
    mask_cases: list[TopkMaskCase] = []
    for group, count in zip(mask_groups, _numeric_counts(mask_groups, numeric_size, scale), strict=True):
        mask_cases += generate_mask_cases(group["seed"], count, group.get("families"))
    # A generated item is input like any other: the validator refuses a bad one.
    from harness.cases.sparse_inputs import sparse_case_from_json, topk_mask_case_from_json

    for generated in sparse_cases:
        sparse_case_from_json(generated.to_json(), f"{SUITES_FILE} (suite {name}, generated {generated.name})")
    for generated_mask in mask_cases:
        topk_mask_case_from_json(
            generated_mask.to_json(), f"{SUITES_FILE} (suite {name}, generated {generated_mask.name})"
        )
    sparse_names = [c.name for c in sparse_cases] + [c.name for c in mask_cases]
    if len(set(sparse_names)) != len(sparse_names):
        duplicate = next(n for n in sparse_names if sparse_names.count(n) > 1)
        raise CaseError(str(SUITES_FILE), name, f"sparse item name {duplicate!r} appears twice")
    sparse_grids = spec.get("sparse_workspace_grid", [])
    sparse_configs: list[SparseWorkspaceConfig] = []
    for kind in sparse_grids if isinstance(sparse_grids, list) else [sparse_grids]:
        if kind not in SPARSE_GRIDS:
            raise CaseError(
                str(SUITES_FILE), name, f"no sparse workspace grid {kind!r} (known: {', '.join(SPARSE_GRIDS)})"
            )
        seen = set(sparse_configs)
        sparse_configs += [c for c in sparse_workspace_grid(kind) if c not in seen]
    held = spec.get("mcdc", False)
    if not isinstance(held, bool):
        raise CaseError(str(SUITES_FILE), name, "field 'mcdc' must be true or false")
    sparse_configs = scale.subset(sparse_configs)
    return Suite(
        name, tuple(cases), grid, merge_cases, tuple(sparse_cases), tuple(sparse_configs), tuple(mask_cases), held
    )
