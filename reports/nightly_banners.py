"""The sentences that qualify the night's figures, shared by the page's HTML
and its Markdown: the sizes the night ran with (:func:`sizes_line`), the REDUCED
banner of a night smaller than the defaults, the INCOMPLETE banner of a night
still running or stopped, and the note on a GPU report that is not tonight's.

Invariants a reader must keep: each returns plain text (the renderer escapes
it) or None when there is nothing to say, so a complete, full night measured
tonight carries no banner; a night still running names what is still to come,
one that stopped names where, and neither is ever shown as finished.
"""

from __future__ import annotations

import datetime

from harness.night.data import Night
from harness.night.gpu_report import gpu_report_date
from harness.night.sizes import DEFAULT_EXPLORE_BUDGET_S, numeric_defaults
from harness.sides.items import LEVELS, NOT_RUN


def sizes_line(night: Night) -> str | None:
    """What the night ran: its ``--size``, ``--numeric-size``, levels, mutants and
    explore, each beside the default; None for a night that recorded none."""
    sizes = night.sizes
    if not sizes:
        return None
    defaults = sizes.get("defaults") or {}
    size, numeric = sizes.get("size"), sizes.get("numeric_size")
    default_size = f"{defaults['size']:,}" if defaults.get("size") is not None else "the suite's"
    default_numeric = numeric_defaults(defaults.get("numeric") or {}) or "the suite's"
    levels = sizes.get("levels") or []
    size_text = f"{default_size} (default)" if size is None else f"{size:,} (default {default_size})"
    numeric_text = f"default ({default_numeric})" if numeric is None else f"{numeric:,} (defaults: {default_numeric})"
    return (
        f"Sizes: --size {size_text}; --numeric-size {numeric_text}; "
        f"levels {'all' if tuple(levels) == LEVELS else ', '.join(levels)}; "
        f"mutant kill matrix {'run' if sizes.get('mutants') else 'not run'}; "
        f"explore {float(sizes.get('explore_budget_s', 0)):g} s per port (default {DEFAULT_EXPLORE_BUDGET_S:g} s)."
    )


def reduced_banner(night: Night) -> str | None:
    if not night.reduced:
        return None
    return (
        f"REDUCED night, smaller than the nightly defaults: {'; '.join(night.reduced)}. "
        "Its figures do not compare with a full night's; in the history its points are a series of their own."
    )


def incomplete_banner(night: Night) -> str | None:
    """What a night that is not complete says: still running (and what is still
    to come), or where it stopped; None for a complete night."""
    if night.complete:
        return None
    step = night.pending[0] if night.pending else None
    done = f"{night.items_done} of {night.expected_items} items"
    if night.stopped:
        compared = sum(int((p.table["status"] != NOT_RUN).sum()) for p in night.ports)
        return (
            f"INCOMPLETE: {night.stopped}, after {compared} of {night.expected_items} items compared; "
            "the tables below cover only what finished (no plots)."
        )
    if night.interrupted:
        where = f" during {step}" if step else ""
        return (
            f"INCOMPLETE: the run stopped{where}, after {done}; the tables below cover only what finished (no plots)."
        )
    later = f"; still to come: {', '.join(night.pending[1:])}" if len(night.pending) > 1 else ""
    return (
        f"INCOMPLETE: the night is still running ({step or 'starting'}{later}); {done} so far. "
        "This page is rewritten as the night goes on; the tables below cover only what finished, "
        "and the plots come when every step has run."
    )


def _days_apart(night_date: str, report_date: str) -> int | None:
    try:
        return (datetime.date.fromisoformat(night_date) - datetime.date.fromisoformat(report_date)).days
    except ValueError:
        return None


def gpu_staleness(night: Night) -> str | None:
    """Why the night's GPU section is not tonight's (its report is of another
    day), or None when it is tonight's or there is none."""
    if night.gpu is None:
        return None
    date = gpu_report_date(*night.gpu)
    if date == night.date:
        return None
    days = _days_apart(night.date, date)
    when = f"{abs(days)} day{'s' if abs(days) != 1 else ''} {'before' if days > 0 else 'after'}" if days else "not"
    return (
        f"Not measured tonight: this GPU report is from {date}, {when} this night ({night.date}); "
        "its figures are that day's."
    )
