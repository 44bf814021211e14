"""The nightly page's plots: chunks per family, ULP histograms, the history.

Every port has one colour in every plot (:func:`port_colours`: the sorted port
names of the night and its history, in matplotlib's tab10 order), and each
artist drawn for a port carries the gid ``port:NAME``, so
:func:`drawn_port_colours` reads back from a drawn figure which colour each
port got; the page records that on each plot (``data-port-colours``) beside its
colour key, and tests/test_report_browser.py checks both against the pixels.

The history keeps reduced nights (:func:`harness.night.history.reduced_reasons`)
apart from full nights: their points are their own dotted series with diamond
markers, never a point on the full nights' line. The parity rate's axis is
zoomed to the values shown, so a drop from 100% to 98% is seen.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.model.levels import kinds_where
from harness.night.data import Night, PortNight

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The oracle's bars (it is no port): a grey no port is given.
ORACLE_COLOUR = "#444444"
# The order levels are hatched in a port's ULP histogram (its bars are the port's colour).
HATCHES = ("", "//", "..", "xx", "\\\\", "oo")
ULP_BUCKETS = ["0", "1", "2", "3-4", "5-8", "9-16", "17-64", "65-256", "257-1024", "1025-1048576", ">1048576"]


def port_colours(*groups: Iterable[str]) -> dict[str, str]:
    """A fixed colour per port: the sorted names in ``groups`` take tab10's
    colours in order (then tab20's lighter shades), as ``#rrggbb``."""
    import matplotlib
    from matplotlib.colors import to_hex

    names = sorted({str(name) for group in groups for name in group})
    tab10, tab20 = matplotlib.colormaps["tab10"], matplotlib.colormaps["tab20"]
    palette = [to_hex(tab10(i)) for i in range(10)] + [to_hex(tab20(i)) for i in range(1, 20, 2)]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def drawn_port_colours(fig: Figure) -> dict[str, list[str]]:
    """Per port, the colours its artists (gid ``port:NAME``) were drawn in."""
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    seen: dict[str, set[str]] = {}
    for artist in fig.findobj(lambda a: str(a.get_gid() or "").startswith("port:")):
        if isinstance(artist, Line2D):
            colours = {artist.get_color(), artist.get_markerfacecolor()}
        elif isinstance(artist, Patch):
            colours = {artist.get_facecolor()}
        else:
            continue
        seen.setdefault(str(artist.get_gid())[5:], set()).update(to_hex(c, keep_alpha=False) for c in colours)
    return {port: sorted(colours) for port, colours in sorted(seen.items())}


def png(fig: Figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plot_attributes(fig: Figure) -> str:
    """The ``data-port-colours`` JSON of a figure (before :func:`png` closes it)."""
    return json.dumps(drawn_port_colours(fig), sort_keys=True)


def _figure(
    width: float = 7.0, height: float = 3.2, columns: int = 1, rows: int = 1, **kwargs: Any
) -> tuple[Figure, Any]:
    """A figure laid out by matplotlib's constrained layout, so no label is cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=(width, height), layout="constrained", **kwargs)


def _colour(colours: Mapping[str, str], side: str) -> str:
    return ORACLE_COLOUR if side == "oracle" else colours.get(side) or port_colours([side])[side]


def _grouped_bars(ax: Axes, frame: pd.DataFrame, colours: Mapping[str, str]) -> None:
    """One bar per row and column of ``frame``, each column (the oracle, a port) in its colour."""
    width = 0.8 / max(len(frame.columns), 1)
    for i, side in enumerate(frame.columns):
        values = pd.to_numeric(frame[side], errors="coerce")
        shown = [(x, v) for x, v in enumerate(values) if pd.notna(v)]
        gid = "oracle" if side == "oracle" else f"port:{side}"
        ax.bar(
            [x - 0.4 + width * (i + 0.5) for x, _ in shown],
            [v for _, v in shown],
            width,
            label=str(side),
            color=_colour(colours, str(side)),
            gid=gid,
        )
    ax.set_xticks(range(len(frame.index)), [str(f) for f in frame.index], rotation=35, ha="right", fontsize=8)


def ulp_histogram_figure(port: PortNight, colours: Mapping[str, str] | None = None) -> Figure | None:
    """Bar chart of mismatching elements by ULP bucket, per numeric level: the
    bars are the port's colour, each level hatched its own way."""
    numeric = {lv: n for lv, n in port.summary["numeric"].items() if n["histogram"]}
    if not numeric:
        return None
    fig, ax = _figure()
    width = 0.8 / len(numeric)
    colour = _colour(colours or {}, port.port)
    for offset, (level, n) in enumerate(numeric.items()):
        counts = [n["histogram"].get(bucket, 0) for bucket in ULP_BUCKETS]
        ax.bar(
            [i + offset * width for i in range(len(ULP_BUCKETS))],
            counts,
            width=width,
            label=level,
            color=colour,
            edgecolor="#222222",
            hatch=HATCHES[offset % len(HATCHES)],
            gid=f"port:{port.port}",
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ULP_BUCKETS))], ULP_BUCKETS, rotation=45, fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("ULP distance")
    ax.set_ylabel("mismatching elements")
    ax.set_title(f"{port.port}: ULP histogram")
    ax.legend(title="level")
    return fig


def layout_items(table: pd.DataFrame) -> pd.DataFrame:
    """The rows whose chunk figures are the plan they compared (the layout level's)."""
    return table[table["kind"].isin(kinds_where(lambda kind, level: kind.plan_figures))]


def chunk_ratios(night: Night) -> pd.DataFrame:
    """Per family (rows) and port (columns): the mean over the family's cases of
    the port's chunks over the oracle's, so a family of 30-chunk cases weighs no
    more than one of single chunks. Cases either side could not plan, and cases
    with no context (no chunks), are left out; they are counted by
    :func:`unplannable_counts`."""
    columns = {}
    for p in night.ports:
        layout = layout_items(p.table)
        planned = layout[(layout["oracle_chunks"] > 0) & (layout["port_chunks"] >= 0)]
        columns[p.port] = (planned["port_chunks"] / planned["oracle_chunks"]).groupby(planned["family"]).mean()
    return pd.DataFrame(columns).sort_index()


def unplannable_counts(night: Night) -> pd.DataFrame:
    """Per family (rows) and side (columns: ``oracle``, then each port): the
    layout cases that side could not plan (chunks < 0, a planner error)."""
    if not night.ports:
        return pd.DataFrame()
    columns: dict[str, pd.Series] = {}
    for p in night.ports:
        layout = layout_items(p.table)
        families = pd.Index(sorted(set(layout["family"])))
        if "oracle" not in columns:
            columns["oracle"] = (layout["oracle_chunks"] < 0).groupby(layout["family"]).sum().reindex(families)
        columns[p.port] = (layout["port_chunks"] < 0).groupby(layout["family"]).sum().reindex(families)
    return pd.DataFrame(columns).fillna(0).astype(int).sort_index()


def chunk_figure(night: Night, colours: Mapping[str, str] | None = None) -> Figure | None:
    """Left: chunks per case relative to the oracle (log scale: 1 is the oracle's
    count); right: the unplannable cases per family and side, so they are seen."""
    colours = colours or port_colours(p.port for p in night.ports)
    ratios = chunk_ratios(night)
    unplannable = unplannable_counts(night)
    if ratios.empty and unplannable.empty:
        return None
    fig, (left, right) = _figure(11, 4.2, columns=2, width_ratios=[3, 2])
    if not ratios.empty:
        _grouped_bars(left, ratios, colours)
        left.set_yscale("log")
        left.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="oracle (1.0)")
        left.legend(fontsize=8)
    left.set_xlabel("family")
    left.set_ylabel("port chunks / oracle chunks\n(mean per case, log scale)")
    left.set_title("chunks per case, relative to the oracle")
    total = int(unplannable.to_numpy().sum()) if not unplannable.empty else 0
    if total:
        _grouped_bars(right, unplannable[unplannable.sum(axis=1) > 0], colours)
        right.legend(fontsize=8)
    else:
        right.text(0.5, 0.5, "no unplannable batch", ha="center", va="center", transform=right.transAxes)
    right.set_xlabel("family")
    right.set_ylabel("cases")
    right.set_title(f"unplannable batches: {total}")
    return fig


def _date_axis(ax: Axes, nights: pd.Series) -> None:
    """The x-axis spans the nights that exist (half a day either side), each
    labelled as a date; beyond a fortnight of nights, matplotlib picks the ticks."""
    import matplotlib.dates

    # matplotlib.dates is untyped: its classes are used as Any.
    mdates: Any = matplotlib.dates
    dates = pd.to_datetime(pd.Series(sorted(set(nights))))
    half_day = pd.Timedelta(hours=12)
    ax.set_xlim(dates.min() - half_day, dates.max() + half_day)
    if len(dates) <= 14:
        ax.set_xticks(list(dates))
    else:
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=12))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")
    ax.set_xlabel("night")


def reduced_mask(history: pd.DataFrame) -> pd.Series:
    """Which history lines are of reduced nights (lines without the field: full)."""
    if "reduced" not in history.columns:
        return pd.Series(False, index=history.index)
    return history["reduced"].apply(lambda v: v is not None and not pd.isna(v) and bool(v)).astype(bool)


def parity_limits(values: pd.Series) -> tuple[float, float]:
    """The parity axis's limits: the values shown and a margin, never below 0,
    so that 98% is well apart from 100% (an axis from 0 would draw them as one)."""
    known = pd.to_numeric(values, errors="coerce").dropna()
    if known.empty:
        return 0.0, 1.0
    low, high = float(known.min()), float(known.max())
    span = high - low
    # A fixed half a percent around a steady rate; around a change, a margin of its own
    # scale, so a drop of 0.01% fills the axis as a drop of 2% does.
    margin = 0.005 if span == 0 else max(span * 0.15, min(0.005, span * 0.5))
    return max(0.0, low - margin), min(1.0, high) + margin


def _parity_axis(ax: Axes, values: pd.Series) -> str:
    """Zoom the parity axis to ``values`` (ticks only up to 100%); its label."""
    from matplotlib.ticker import PercentFormatter

    low, high = parity_limits(values)
    ax.set_ylim(low, high)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_yticks([t for t in ax.get_yticks() if low - 1e-12 <= t <= 1.0 + 1e-12])
    ax.set_ylim(low, high)
    if low <= 0.0:
        return "items at parity"
    # Enough decimals that the two ends of a narrow zoom read apart.
    decimals = 1 if high - low >= 0.01 else 3
    return f"items at parity\n(axis zoomed to {low:.{decimals}%}-{min(high, 1.0):.{decimals}%})"


def _history_lines(ax: Axes, rows: pd.DataFrame, column: str, reduced: pd.Series, colour: str, port: str) -> None:
    """One port's lines of ``column``: full nights solid, reduced nights a dotted series of their own."""
    for is_reduced, style, label in ((False, "-", port), (True, ":", f"{port} (reduced nights)")):
        part = rows[reduced[rows.index] == is_reduced]
        if part.empty:
            continue
        values = pd.to_numeric(part[column], errors="coerce")
        marker = "D" if is_reduced else "o"
        ax.plot(
            pd.to_datetime(part["date"]), values, linestyle=style, marker=marker, color=colour,
            label=label, gid=f"port:{port}",
        )  # fmt: skip


def history_figures(history: pd.DataFrame, colours: Mapping[str, str] | None = None) -> list[tuple[str, Any]]:
    """(alt text, figure): the parity rate and the new divergences per port over
    the nights in the history (lines written before ``new`` was recorded leave
    gaps); reduced nights are a dotted series of their own per port. The
    parity rate has a panel per port, each axis zoomed to that port's own
    values: a drop of 0.01% in one port is drawn apart from 100% whatever the
    other ports' rates (one shared axis is set by the worst of them)."""
    if history.empty:
        return []
    from matplotlib.ticker import MaxNLocator

    history = history.sort_values(["date", "port"], kind="stable")
    colours = colours or port_colours(history["port"])
    reduced = reduced_mask(history)
    by_port = list(history.groupby("port"))
    fig, axes = _figure(height=max(2.4, 2.2 * len(by_port)), rows=len(by_port), squeeze=False)
    for ax, (port, rows) in zip(axes[:, 0], by_port, strict=True):
        _history_lines(ax, rows, "pass_rate", reduced, _colour(colours, str(port)), str(port))
        # Every panel spans the same nights, so a night sits at one x in all of them.
        _date_axis(ax, history["date"])
        # A short label, the zoom in the title: a panel is too short for two lines beside its axis.
        label, _, zoom = _parity_axis(ax, rows["pass_rate"]).partition("\n")
        ax.set_ylabel("at parity", fontsize=8)
        ax.set_title(f"{label}: {port} {zoom}".rstrip(), fontsize=9)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize=8)  # its full and reduced nights apart (the title names the port)
    figures = [("history: parity rate", fig)]
    fig, ax = _figure()
    for port, rows in by_port:
        _history_lines(ax, rows, "new", reduced, _colour(colours, str(port)), str(port))
    _date_axis(ax, history["date"])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("items")
    ax.set_title("new divergences per port (not in its baseline)")
    ax.legend(fontsize=8)
    figures.append(("history: new divergences", fig))
    return figures
