"""A night's sizes: the suite's defaults, what a night ran with, and why a
night below them is *reduced* (its page says so, and its history lines are a
series of their own). Imports no other module of the night.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness.cases.suites import SUITES_FILE
from harness.sides.items import LEVELS

_ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
# ``--explore-budget-s`` when not given: seconds of parity explore per port.
DEFAULT_EXPLORE_BUDGET_S = 60.0
# The suite's groups that ``--numeric-size`` sets (the first group of each), by their name on the page.
NUMERIC_GROUPS = {"prefill": "prefill", "merge": "merge", "topk_mask": "top-k mask", "sparse_prefill": "sparse L3"}


def _first_count(spec: Mapping[str, Any], key: str) -> int | None:
    value = spec.get(key)
    group = value[0] if isinstance(value, list) and value else value
    return int(group["count"]) if isinstance(group, dict) and "count" in group else None


def suite_defaults(suite: str) -> dict[str, Any]:
    """What ``--size`` and ``--numeric-size`` override in ``suite`` when not given
    (cases/suites.json): the first generated layout group's count (``size``), and
    per numeric group the first group's count (``numeric``); {} for a suite not there."""
    try:
        spec = json.loads(SUITES_FILE.read_text(encoding="utf-8")).get(suite)
    except (OSError, ValueError):
        return {}
    if not isinstance(spec, dict):
        return {}
    numeric = {key: _first_count(spec, key) for key in NUMERIC_GROUPS}
    return {"size": _first_count(spec, "generate"), "numeric": {k: v for k, v in numeric.items() if v is not None}}


def night_sizes(
    suite: str,
    size: int | None,
    numeric_size: int | None,
    levels: Sequence[str],
    mutants: bool,
    explore_budget_s: float,
) -> dict[str, Any]:
    """The sizes a night ran with (None: the suite's default) and the suite's
    defaults, as night.json and the page record them. ``mutants`` is whether the
    kill matrix ran (a shard runs none); ``explore_budget_s`` the search asked for."""
    return {
        "size": size,
        "numeric_size": numeric_size,
        "levels": list(levels),
        "mutants": mutants,
        "explore_budget_s": explore_budget_s,
        "defaults": suite_defaults(suite),
    }


def reduced_reasons(sizes: Mapping[str, Any]) -> list[str]:
    """Why a night with these sizes (:func:`night_sizes`) is smaller than a full
    one; [] for a full night, and for a night that recorded no sizes."""
    if not sizes:
        return []
    defaults = sizes.get("defaults") or {}
    reasons = []
    size, default_size = sizes.get("size"), defaults.get("size")
    if size is not None and default_size is not None and size < default_size:
        reasons.append(f"--size {size} (default {default_size:,})")
    numeric, default_numeric = sizes.get("numeric_size"), defaults.get("numeric") or {}
    if numeric is not None and any(numeric < count for count in default_numeric.values()):
        reasons.append(f"--numeric-size {numeric} (defaults: {numeric_defaults(default_numeric)})")
    if list(sizes.get("levels") or LEVELS) != list(LEVELS):
        reasons.append(f"levels {', '.join(sizes['levels'])} only")
    if not sizes.get("mutants", True):
        reasons.append("no mutant kill matrix")
    budget = float(sizes.get("explore_budget_s", DEFAULT_EXPLORE_BUDGET_S))
    if budget <= 0:
        reasons.append("no explore search")
    elif budget < DEFAULT_EXPLORE_BUDGET_S:
        reasons.append(f"explore {budget:g} s per port (default {DEFAULT_EXPLORE_BUDGET_S:g} s)")
    return reasons


def numeric_defaults(counts: Mapping[str, int]) -> str:
    """The defaults ``--numeric-size`` overrides, in :data:`NUMERIC_GROUPS`' order
    (night.json keeps its keys sorted)."""
    order = [key for key in NUMERIC_GROUPS if key in counts] + sorted(set(counts) - set(NUMERIC_GROUPS))
    return ", ".join(f"{NUMERIC_GROUPS.get(key, key)} {counts[key]:,}" for key in order)


# -- the history store -------------------------------------------------------------------------
