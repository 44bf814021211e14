"""The night's GPU section comes from the newest GPU report on disk: the JSON
benchmarks/gpu_report.py writes as ``reports/gpu/<date>.json``.

The night runs on the CPU and measures nothing on a GPU; it only finds the latest
report (:func:`latest_gpu_report`) and says which day it was measured
(:func:`gpu_report_date`), so the page can mark a report that is not tonight's.
An unreadable report is reported and left out, never fatal. This module reads
JSON only: rendering it is reports/gpu.py's, and the harness never imports reports/.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.json_input import read_json
from harness.night.history import warn

# The GPU reports benchmarks/gpu_report.py writes; the latest becomes the night's GPU section.
GPU_REPORTS = Path("reports/gpu")
_DATED_JSON = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}\.json$")


def latest_gpu_report(
    directory: Path = GPU_REPORTS, report: Callable[[str], None] | None = warn
) -> tuple[Path, dict[str, Any]] | None:
    """The newest ``<date>.json`` in ``directory`` and its data, or None (an
    unreadable one is reported and left out: the night goes on without it)."""
    if not directory.is_dir():
        return None
    dated = sorted(p for p in directory.iterdir() if _DATED_JSON.match(p.name))
    if not dated:
        return None
    try:
        data = read_json(dated[-1])
    except CaseError as exc:
        if report:
            report(f"{dated[-1]}: not a GPU report, left out of the night ({exc.reason})")
        return None
    if not isinstance(data, dict):
        if report:
            report(f"{dated[-1]}: not a GPU report (not a JSON object), left out of the night")
        return None
    return dated[-1], data


def gpu_report_date(path: Path, report: Mapping[str, Any]) -> str:
    """The day a GPU report was measured: its ``date``, else its file's name."""
    date = report.get("date")
    return date if isinstance(date, str) and date else path.stem
