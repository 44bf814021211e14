"""Suites: named collections of cases and workspace configurations.

Definitions live in ``cases/suites.json``. A suite takes checked-in case files
(``files``, relative to ``cases/``), generated cases (``generate``: a seed and a
count; ``--size`` overrides the count), and a workspace-size grid (``small`` or
``full``), merge cases for L2 (``merge``: seed and count) and numeric prefill
cases for L3 (``prefill``: seed, count and numeric preset, or a list of those; a group's optional
``keyless_per_family`` adds, per family, that many of its cases whose legacy grid has rows without
keys again under each non-default keyless-row behaviour). Case files with a ``numeric`` section
are prefill cases too.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases import CaseError, load_cases
from harness.generate import generate, generate_prefill
from harness.merge_cases import generate_merge
from harness.model import Case, MergeCase, WorkspaceConfig

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"
SUITES_FILE = CASES_DIR / "suites.json"

_GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
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


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[Case, ...]
    workspace_configs: tuple[WorkspaceConfig, ...]
    merge_cases: tuple[MergeCase, ...] = ()


def workspace_grid(kind: str) -> tuple[WorkspaceConfig, ...]:
    axes = _GRIDS[kind]
    configs = []
    for length, seqs, block, world, interleave in itertools.product(*axes.values()):
        if world == 1 and interleave != 1:
            continue  # interleave only matters under DCP
        configs.append(WorkspaceConfig(length, seqs, block, world, interleave))
    return tuple(configs)


def suite_names() -> list[str]:
    return sorted(_definitions())


def _definitions() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SUITES_FILE.read_text(encoding="utf-8"))
    return data


def load_suite(name: str, size: int | None = None, numeric_size: int | None = None) -> Suite:
    """``size`` overrides the generated layout case count, ``numeric_size`` the
    merge and prefill case counts."""
    definitions = _definitions()
    if name not in definitions:
        raise CaseError(str(SUITES_FILE), None, f"no suite named {name!r} (known: {', '.join(sorted(definitions))})")
    spec = definitions[name]
    cases = load_cases([CASES_DIR / f for f in spec.get("files", [])])
    if "generate" in spec:
        count = spec["generate"]["count"] if size is None else size
        cases += list(generate(spec["generate"]["seed"], count))
    prefill = spec.get("prefill", [])
    for group in prefill if isinstance(prefill, list) else [prefill]:
        count = group["count"] if numeric_size is None else numeric_size
        cases += list(generate_prefill(group["seed"], count, group["preset"], group.get("keyless_per_family", 0)))
    merge_cases: tuple[MergeCase, ...] = ()
    if "merge" in spec:
        count = spec["merge"]["count"] if numeric_size is None else numeric_size
        merge_cases = tuple(generate_merge(spec["merge"]["seed"], count))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise CaseError(str(SUITES_FILE), name, f"case name {duplicate!r} appears twice")
    grid = workspace_grid(spec["workspace_grid"]) if "workspace_grid" in spec else ()
    return Suite(name, tuple(cases), grid, merge_cases)
