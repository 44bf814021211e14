"""The nightly parity report: ``<out>/<date>/index.html`` (one self-contained
file: tables inline, plots embedded as PNG data, no network) and ``report.md``.

The page answers first "is anything broken that was not broken the night
before": one row per port with its verdict against its baseline (PASS, EXPECTED:
only divergences the baseline expects, FAIL: a new one), its new and expected
counts, and how that compares with the previous night in the history. Then,
per port and level, the same; family-by-level tables coloured by verdict; chunk
counts and workspace utilisation per family, plotted per case relative to the
oracle with the unplannable batches counted; ULP histograms for ports that are
not bit-exact; the mutant kill matrix; coverage; explore; the latest GPU report
(dated, and marked when it is not tonight's); the history (parity rate and new
divergences over the nights that exist); provenance. A night still running, or
stopped, is written with an INCOMPLETE banner that says which. The header states
the night's sizes, and a night smaller than the defaults is marked REDUCED; each
failing item carries the ``parity diff`` command that reproduces it; the kill
matrix says n/a where no item of a level reaches a mutant's fault; each port has
one colour in every plot (reports/nightly_plots.py, which draws them).

The page's pieces are its siblings': the tables (reports/nightly_tables.py), the
HTML table, style sheet and colours (reports/nightly_html.py), the banners and
notes that qualify the figures (reports/nightly_banners.py) and the plots
(reports/nightly_plots.py). This module lays them out: :func:`render_html` and
:func:`render_markdown` show the same sections in the same order, so a change
to one is a change to both; the page stays one file that needs no network.

The night's data (Night, PortNight) is harness/night/data.py's and the history
store harness/night/history.py's; this module only renders them
(:func:`write_report` is the night's writer).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.night.data import Night, judges_explore, night_verdict
from harness.night.gpu_report import gpu_report_date
from harness.verdicts.launch import PORT_DIR_NOTE, uses_port_dir
from reports.coverage import headline, table_rows
from reports.coverage import render_markdown as coverage_markdown
from reports.drift_report import upstream_since_pin
from reports.gpu import (
    environment_line,
    gpu_section_markdown,
    merge_table,
    parity_table,
    prefill_table,
    section_problem,
)
from reports.nightly_banners import gpu_staleness, incomplete_banner, reduced_banner, sizes_line
from reports.nightly_html import (
    CSS,
    HISTORY_REDUCED,
    KILL_CLASS,
    LEGEND,
    anchor,
    colour_key,
    failing_cell_class,
    family_html,
    html_table,
    verdict_cell_class,
)
from reports.nightly_plots import (
    chunk_figure,
    history_figures,
    plot_attributes,
    png,
    port_colours,
    reduced_mask,
    ulp_histogram_figure,
)
from reports.nightly_tables import (
    KILL_NOTE,
    chunk_table,
    explore_table,
    failing_items,
    family_level_table,
    kill_matrix_table,
    not_shown,
    ports_table,
    verdict_table,
)
from reports.run_summary import numeric_text

HEADLINE = "Verdict (every port, against its baseline)"
NOT_JUDGED = " (not judged: the port has expected divergences, so its finds do not fail the night)"


def _explore_judged(night: Night, result: dict[str, Any]) -> bool:
    port = next((p for p in night.ports if p.port == result["port"]), None)
    return port is None or judges_explore(port)


PLOTS_PENDING = "The plots are drawn once every step of the night has run."


def _plot(fig: Any, alt: str) -> str:
    """A figure as an embedded PNG, with the colour each port was drawn in (``data-port-colours``)."""
    colours = html.escape(plot_attributes(fig))
    source = f"data:image/png;base64,{png(fig)}"
    return f'<img class="plot" alt="{html.escape(alt)}" data-port-colours="{colours}" src="{source}">'


def gpu_section_html(night: Night) -> str:
    """The night's GPU section: the latest GPU report's tables under its date."""
    assert night.gpu is not None
    path, report = night.gpu
    date = gpu_report_date(path, report)
    stale = gpu_staleness(night)
    title = f"GPU: report of {date}, not tonight's" if stale else f"GPU: tonight's report ({date})"
    parts = [f'<h2 id="gpu">{html.escape(title)}</h2>']
    if stale:
        parts.append(f'<p class="stale" id="gpu-stale">{html.escape(stale)}</p>')
    parts.append(f"<p>From <code>{html.escape(shown_path(path))}</code>: {html.escape(environment_line(report))}.</p>")
    for heading, section, table in (
        ("Parity on the GPU", "parity", parity_table),
        ("Merge kernel", "merge", merge_table),
        ("Prefill context loop", "prefill", prefill_table),
    ):
        parts.append(f"<h3>{heading}</h3>")
        problem = section_problem(report.get(section))
        parts.append(f"<p>{html.escape(problem)}</p>" if problem else html_table(table(report)))
    return "\n".join(parts)


def _headline(night: Night) -> str:
    return f"{HEADLINE}: {night_verdict(night)}"


def machine_line(environment: dict[str, Any]) -> str:
    """Where a run ran: its device, and the CPU with torch's capability and the BLAS's code path on it."""
    return (
        f"{environment.get('device')}, CPU {environment.get('cpu')} "
        f"(torch's CPU capability {environment.get('cpu_capability')}, BLAS {environment.get('blas')})"
    )


def shown_path(path: Path | str) -> str:
    """A report's path as the page names it: relative to the harness's checkout when
    inside it (the same on every machine), else as it is."""
    from harness.verdicts.launch import harness_root

    resolved = Path(path).resolve()
    root = harness_root()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def _failing_html(port: str, failing: pd.DataFrame) -> str:
    """A port's failing items: each row an anchor, its id a link to it (to share), its reproduce command beside it."""
    ids = [str(item) for item in failing["id"]]

    def link(row: int, column: str, value: Any) -> str | None:
        return f"#{anchor('item', port, str(value))}" if column == "id" else None

    def row_id(row: int) -> str:
        return anchor("item", port, ids[row])

    return html_table(failing, anchor("failing", port), "failing", failing_cell_class, cell_link=link, row_id=row_id)


def _first_new(failing: pd.DataFrame) -> str:
    """A port's first new failing item (its failing items list new ones first), or "-"."""
    new = failing[failing["baseline"] == "new"]
    return str(new["id"].iloc[0]) if not new.empty else "-"


def render_html(night: Night, history: pd.DataFrame) -> str:
    verdict = night_verdict(night)
    css_class = {"PASS": "pass", "FAIL": "fail"}.get(verdict, "incomplete")
    oracle = night.provenance.get("oracle", {})
    reduced = " (reduced)" if night.reduced else ""
    # One colour per port in every plot: tonight's ports and the history's, sorted.
    colours = port_colours((p.port for p in night.ports), history["port"] if "port" in history else ())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Nightly parity {html.escape(night.date)}{reduced}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Nightly parity report: {html.escape(night.date)}{reduced}</h1>",
        f"<p>Suite <code>{html.escape(night.suite)}</code>; pinned oracle "
        f"{html.escape(str(oracle.get('release', '?')))} "
        f"(upstream {html.escape(str(oracle.get('upstream_commit', '?')))}); run on "
        f"{html.escape(machine_line(night.provenance.get('environment', {})))}.</p>",
    ]
    sizes = sizes_line(night)
    if sizes:
        parts.append(f'<p id="sizes">{html.escape(sizes)}</p>')
    if night.reduced:
        parts.append(f'<p class="banner reduced" id="reduced">{html.escape(reduced_banner(night) or "")}</p>')
    parts.append(f'<div id="verdict" class="verdict {css_class}">{html.escape(_headline(night))}</div>')
    banner = incomplete_banner(night)
    if banner:
        parts.append(f'<p class="banner incomplete" id="incomplete">{html.escape(banner)}</p>')
    ports = ports_table(night, history)
    # A port's new count links to its failing items, each beside its reproduce command;
    # its first failing item (the first new one) links to that item's row.
    failing = {str(p.port): failing_items(p, night=night) for p in night.ports}
    first = [_first_new(failing[str(port)]) for port in ports["port"]]
    ports.insert(list(ports.columns).index("verdict") + 1, "first failing", first)

    def failing_link(row: int, column: str, value: Any) -> str | None:
        port = str(ports.iloc[row]["port"])
        if failing[port].empty or not value or value == "-":
            return None
        if column == "new":
            return f"#{anchor('failing', port)}"
        return f"#{anchor('item', port, str(value))}" if column == "first failing" else None

    parts += [
        "<h2>Ports tonight, against their baselines</h2>",
        html_table(ports, "ports", cell_class=verdict_cell_class, cell_link=failing_link),
        LEGEND,
        f"<p>Each port has one colour in every plot (the oracle's bars are grey):</p>{colour_key(colours)}",
        "<h2>Verdict per port and level</h2>",
        html_table(verdict_table(night), "verdicts", cell_class=verdict_cell_class),
    ]
    chunks = chunk_table(night)
    if not chunks.empty:
        parts += ["<h2>Chunks and workspace utilisation per family</h2>", html_table(chunks, "chunks")]
    # A page rewritten while the night runs draws no plots (each costs a
    # rendering, on every rewrite): the page of a night whose steps have all run does.
    plots = not night.pending
    if not plots:
        parts.append(f'<p class="note" id="plots-pending">{html.escape(PLOTS_PENDING)}</p>')
    figure = chunk_figure(night, colours) if plots else None
    if figure is not None:
        parts.append(_plot(figure, "chunks per family"))
    for p in night.ports:
        baseline = f" (baseline <code>{html.escape(p.baseline)}</code>)" if p.baseline else " (no baseline)"
        parts.append(f"<h2>Port {html.escape(p.port)}{baseline}</h2>")
        if p.stopped:
            parts.append(f'<p class="banner incomplete">Stopped early: {html.escape(p.stopped)}.</p>')
        parts.append(family_html(p))
        for level, what in p.summary.get("l3_compares", {}).items():
            parts.append(f'<p class="note">{html.escape(level)} compared {html.escape(what)}.</p>')
        histogram = ulp_histogram_figure(p, colours) if plots else None
        if histogram is not None:
            parts.append(_plot(histogram, f"{p.port} ULP histogram"))
        failing = failing_items(p, night=night)
        if not failing.empty:
            parts.append("<h3>First failing items (new first), each with the command that reproduces it</h3>")
            if any(uses_port_dir(str(command)) for command in failing["reproduce"]):
                parts.append(f'<p class="note">{html.escape(PORT_DIR_NOTE)}</p>')
            parts.append(_failing_html(p.port, failing))
            more = not_shown(p, len(failing))
            if more:
                parts.append(f'<p class="note">{html.escape(more)}</p>')
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        parts.append(f"<h2>Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed</h2>")
        kills = kill_matrix_table(night.kill_matrix)
        parts.append(html_table(kills, "kill-matrix", cell_class=lambda _, c, value: KILL_CLASS.get(str(value))))
        parts.append(f'<p class="note">{html.escape(KILL_NOTE)}</p>')
    if night.coverage:
        parts.append(f'<h2 id="coverage">{html.escape(headline(night.coverage))}</h2>')
        parts.append(html_table(pd.DataFrame(table_rows(night.coverage)), "coverage-table"))
    if night.explore:
        parts.append('<h2 id="explore">Property-based exploration (parity explore)</h2>')
        for result in night.explore:
            note = "" if _explore_judged(night, result) else NOT_JUDGED
            parts.append(
                f"<h3>{html.escape(result['port_spec'])}: {html.escape(result['verdict'].upper())}"
                f"{html.escape(note)}</h3>"
            )
            parts.append(html_table(explore_table(result), css="explore"))
            for find in result["finds"]:
                parts.append(
                    f"<p>{html.escape(find['property'])}, {html.escape(find['status'])}: "
                    f"{html.escape(find['detail'])}<br><code>{html.escape(find['command'])}</code></p>"
                )
    if night.gpu:
        parts.append(gpu_section_html(night))
    if night.drift:
        path, record = night.drift
        lines = upstream_since_pin(record)
        parts.append('<h2 id="upstream">Upstream since the pin</h2>')
        parts.append(f"<p>From <code>{html.escape(shown_path(path))}</code>. {html.escape(lines[0])}</p>")
        items = "".join(f"<li>{html.escape(line[2:])}</li>" for line in lines if line[:2] == "- ")
        parts.append(f"<ul>{items}</ul>")
    parts.append("<h2>History</h2>")
    images = [_plot(fig, alt) for alt, fig in history_figures(history, colours)] if plots else []
    if images and reduced_mask(history).any():
        images.insert(0, f'<p id="history-reduced">{html.escape(HISTORY_REDUCED)}</p>')
    parts += images or ["<p>No history yet.</p>" if plots else f"<p>{html.escape(PLOTS_PENDING)}</p>"]
    parts += [
        "<h2>Provenance</h2>",
        f"<pre id='provenance'>{html.escape(json.dumps(night.provenance, indent=2, sort_keys=True))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts)


# -- Markdown ------------------------------------------------------------------------------------


def render_markdown(night: Night, history: pd.DataFrame | None = None) -> str:
    history = history if history is not None else pd.DataFrame()
    lines = [f"# Nightly parity report: {night.date}{' (reduced)' if night.reduced else ''}", ""]
    lines += [f"{text}", ""] if (text := sizes_line(night)) else []
    lines += [f"**{text}**", ""] if (text := reduced_banner(night)) else []
    lines += [f"{HEADLINE}: **{night_verdict(night)}**", ""]
    banner = incomplete_banner(night)
    if banner:
        lines += [banner.replace("INCOMPLETE", "**INCOMPLETE**", 1), ""]
    if night.ports:
        lines += [ports_table(night, history).to_markdown(index=False), ""]
        lines += [verdict_table(night).to_markdown(index=False), ""]
    chunks = chunk_table(night)
    if not chunks.empty:
        lines += ["## Chunks per family", "", chunks.to_markdown(index=False), ""]
    for p in night.ports:
        lines += [f"## {p.port}", "", family_level_table(p).to_markdown(index=False), ""]
        for level, n in p.summary["numeric"].items():
            lines.append(f"- {level}: {numeric_text(n)}")
        lines += [f"- {level} compared {what}" for level, what in p.summary.get("l3_compares", {}).items()]
        failing = failing_items(p, night=night)
        lines += ["", "First failing items (new first):", ""] if not failing.empty else []
        lines += [f"- `{r.id}` {r.status} ({r.baseline}): `{r.reproduce}`" for r in failing.itertuples(index=False)]
        more = not_shown(p, len(failing))
        lines += [f"- {more}"] if more else []
        lines.append("")
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        lines += [f"## Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed", ""]
        lines += [kill_matrix_table(night.kill_matrix).to_markdown(index=False), "", KILL_NOTE, ""]
    if night.coverage:
        lines += [f"## {headline(night.coverage)}", "", coverage_markdown(night.coverage)]
    if night.explore:
        lines += ["## Property-based exploration (parity explore)", ""]
        for result in night.explore:
            note = "" if _explore_judged(night, result) else f"_{result['port_spec']}{NOT_JUDGED}_\n"
            lines += [note + result["markdown"]]
    if night.gpu:
        path, report = night.gpu
        date = gpu_report_date(path, report)
        stale = gpu_staleness(night)
        lines += [f"## GPU: report of {date}, NOT tonight's" if stale else f"## GPU: tonight's report ({date})", ""]
        lines += [f"**{stale}**", ""] if stale else []
        lines += [f"From `{shown_path(path)}`.", ""]
        lines += gpu_section_markdown(report, heading="###")
    if night.drift:
        path, record = night.drift
        lines += ["## Upstream since the pin", "", f"From `{shown_path(path)}`.", "", *upstream_since_pin(record), ""]
    oracle = night.provenance.get("oracle", {})
    environment = night.provenance.get("environment", {})
    harness_repo = night.provenance.get("harness_repository", {})
    lines += [
        "## Provenance",
        "",
        f"- oracle: {oracle.get('release')} (upstream {oracle.get('upstream_commit')}), installed vllm "
        f"{oracle.get('installed_vllm')} ({oracle.get('installed_commit_id')}), fingerprints "
        f"{'overridden' if oracle.get('oracle_drift_overridden') else 'all ok'}",
        f"- torch {environment.get('torch')}, triton {environment.get('triton')}, {machine_line(environment)}",
        f"- harness repository {harness_repo.get('commit')} ({'dirty' if harness_repo.get('dirty') else 'clean'})",
    ]
    for port, repo in night.provenance.get("port_repositories", {}).items():
        state = "dirty" if repo.get("dirty") else "clean"
        lines.append(
            f"- port {port}: repository {repo.get('commit')} ({state}), {repo.get('source') or repo.get('reason')}"
        )
    return "\n".join(lines) + "\n"


def write_report(night: Night, out_dir: Path, history: pd.DataFrame) -> Path:
    """The night's writer (harness.night.folder.WriteReport): ``report.md`` and
    ``index.html`` in ``out_dir``; ``history`` is what the history plots show."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(render_markdown(night, history), encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_html(night, history), encoding="utf-8")
    return index
