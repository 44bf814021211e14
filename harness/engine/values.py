"""The values a run's options take, checked the same way by every entry point
(the command line's flags, the pytest plugin's ``--parity-*``): each parser
returns the value or raises ValueError with the one line that says why."""

from __future__ import annotations

import math


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0: a limit of 0 would mean none for a Python
    port and an instant failure for an external one, so neither is accepted."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None
    if value < least:
        raise ValueError(f"must be >= {least}, got {text!r}")
    return value


def jobs_count(text: str) -> int:
    """``--jobs``: a count >= 1, or ``auto`` (:func:`harness.sides.job_sizing.machine_workers`)."""
    if text.strip().lower() == "auto":
        from harness.sides.job_sizing import machine_workers

        return machine_workers()
    return positive_int(text)


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)
