"""Seeded generator of heterogeneous prefill batches (layout cases), by named family.

Determinism: case ``k`` of a suite is drawn from ``random.Random(f"{seed}:{family}:{k}")``.
Python seeds a ``Random`` from a string through SHA-512, so the same seed gives
the same cases on any machine and under any ``PYTHONHASHSEED``. Families are
dealt round-robin, so every family is represented in any prefix of a suite.

Two sets of layout families: the sweep families
(:data:`harness.cases.sweep_families.SWEEP_FAMILIES`, the default of
:func:`generate`, powers of two and batches of up to 1024 requests) and the
coverage families (:data:`harness.cases.coverage_families.COVERAGE_FAMILIES`),
which push every integer the planner computes past the widths a port may store
it in (2^8, 2^11, 2^16) and use block sizes, DCP worlds and interleaves that
are not powers of two. A suite deals them in separate groups, so adding a
coverage family never changes a sweep case. The L3 generator
(:mod:`harness.cases.prefill_generate`) has the same split.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace

from harness.cases.coverage_families import COVERAGE_FAMILIES
from harness.cases.sweep_families import SWEEP_FAMILIES
from harness.model import Case

FAMILIES: dict[str, Callable[[random.Random], Case]] = {**SWEEP_FAMILIES, **COVERAGE_FAMILIES}


def generate(seed: int, count: int, families: list[str] | None = None) -> Iterator[Case]:
    """``count`` cases, families dealt round-robin; case names are ``<family>-<k>``.
    ``families`` defaults to the sweep families (:data:`~harness.cases.sweep_families.SWEEP_FAMILIES`).

    Every case is valid input (``harness.cases.files.case_from_json`` accepts its JSON).
    """
    names = families or list(SWEEP_FAMILIES)
    for index in range(count):
        family = names[index % len(names)]
        k = index // len(names)
        rng = random.Random(f"{seed}:{family}:{k}")
        case = FAMILIES[family](rng)
        yield replace(case, name=f"{family}-{k:04d}")
