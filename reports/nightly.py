"""The nightly parity report: ``reports/<date>/index.html`` (one self-contained
file: tables inline, plots embedded as PNG data, no network) and ``report.md``.

It shows, per port: the verdict per level; family-by-level tables; chunk counts
and workspace utilisation per family for the oracle and each port; ULP
histograms for ports that are not bit-exact; provenance; and the history store
(one JSON line per port and night), plotted as pass rate and chunk counts over
time; when a GPU report exists, the latest one's tables (reports/gpu.py); and
the coverage of the night's suite against its targets (harness/coverage.py).
A run that did not finish is written with an INCOMPLETE banner.
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.coverage import JudgedCoverage, headline, table_rows
from harness.coverage import render_markdown as coverage_markdown
from harness.runner import PARITY
from reports.gpu import gpu_section_html, gpu_section_markdown

HISTORY_COLUMNS = ("date", "port", "suite", "items", "pass_rate", "oracle_chunks", "port_chunks", "complete")


@dataclass
class PortNight:
    """One port's share of a night: its results table and summary."""

    port: str
    table: pd.DataFrame
    summary: dict[str, Any]
    seconds: float = 0.0


@dataclass
class Night:
    date: str
    suite: str
    expected_items: int
    ports: list[PortNight] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    kill_matrix: dict[str, Any] | None = None  # harness.mutants' JSON form
    gpu: tuple[Path, dict[str, Any]] | None = None  # the latest GPU report (reports/gpu.py)
    coverage: JudgedCoverage | None = None  # the suite's coverage (harness/coverage.py)
    # One ``parity explore`` per port (harness/explore.py's JSON form plus "markdown").
    explore: list[dict[str, Any]] = field(default_factory=list)
    # The seconds of explore asked for per port; 0: the night did not search.
    explore_budget_s: float = 0.0

    @property
    def items_done(self) -> int:
        return sum(len(p.table) for p in self.ports)


# -- figures -----------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 7.0, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def ulp_histogram_plot(port: PortNight) -> str | None:
    """Bar chart of mismatching elements by ULP bucket, per numeric level."""
    numeric = {lv: n for lv, n in port.summary["numeric"].items() if n["histogram"]}
    if not numeric:
        return None
    fig, ax = _figure()
    order = ["0", "1", "2", "3-4", "5-8", "9-16", "17-64", "65-256", "257-1024", "1025-1048576", ">1048576"]
    width = 0.8 / len(numeric)
    for offset, (level, n) in enumerate(numeric.items()):
        counts = [n["histogram"].get(bucket, 0) for bucket in order]
        ax.bar([i + offset * width for i in range(len(order))], counts, width=width, label=level)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(order))], order, rotation=45, fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("ULP distance")
    ax.set_ylabel("mismatching elements")
    ax.set_title(f"{port.port}: ULP histogram")
    ax.legend()
    return _png(fig)


def chunk_plot(night: Night) -> str | None:
    frames = []
    for p in night.ports:
        layout = p.table[(p.table["kind"] == "layout") & (p.table["port_chunks"] >= 0)]
        frames.append(layout.groupby("family")["port_chunks"].sum().rename(p.port))
        if p is night.ports[0]:
            oracle = p.table[(p.table["kind"] == "layout") & (p.table["oracle_chunks"] >= 0)]
            frames.insert(0, oracle.groupby("family")["oracle_chunks"].sum().rename("oracle"))
    if not frames:
        return None
    data = pd.concat(frames, axis=1).fillna(0)
    if data.empty:
        return None
    fig, ax = _figure(8, 3.5)
    data.plot.bar(ax=ax, rot=30, fontsize=8)
    ax.set_ylabel("chunks")
    ax.set_title("chunks per family: oracle and ports")
    return _png(fig)


def history_plots(history: pd.DataFrame) -> list[str]:
    if history.empty:
        return []
    images = []
    for column, title in (("pass_rate", "pass rate over time"), ("port_chunks", "port chunks over time")):
        fig, ax = _figure()
        for port, rows in history.groupby("port"):
            ax.plot(pd.to_datetime(rows["date"]), rows[column], marker="o", label=str(port))
        if column == "port_chunks":
            first = history.groupby("date")["oracle_chunks"].first()
            ax.plot(pd.to_datetime(first.index), first.values, marker="x", linestyle="--", label="oracle")
        ax.set_title(title)
        ax.legend()
        fig.autofmt_xdate()
        images.append(_png(fig))
    return images


# -- tables ------------------------------------------------------------------------------------


def verdict_table(night: Night) -> pd.DataFrame:
    rows = []
    for p in night.ports:
        for level, counts in p.summary["levels"].items():
            total = sum(counts.values())
            rows.append(
                {
                    "port": p.port,
                    "level": level,
                    "items": total,
                    "parity": counts[PARITY],
                    "failing": total - counts[PARITY],
                    "verdict": "PASS" if total and counts[PARITY] == total else ("-" if not total else "FAIL"),
                }
            )
    return pd.DataFrame(rows, columns=["port", "level", "items", "parity", "failing", "verdict"])


def family_level_table(port: PortNight) -> pd.DataFrame:
    """Parity rate per family (rows) and level (columns), as "parity/items"."""
    table = port.table
    grouped = table.groupby(["family", "level"])["status"]
    cells = grouped.apply(lambda s: f"{int((s == PARITY).sum())}/{len(s)}").unstack(fill_value="")
    return cells


def chunk_table(night: Night) -> pd.DataFrame:
    columns: dict[str, pd.Series] = {}
    for p in night.ports:
        layout = p.table[p.table["kind"] == "layout"]
        if "oracle chunks" not in columns:
            planned = layout[layout["oracle_chunks"] >= 0]
            columns["oracle chunks"] = planned.groupby("family")["oracle_chunks"].sum()
            util = planned.groupby("family")[["oracle_rows", "oracle_capacity"]].sum()
            columns["oracle utilisation"] = (util["oracle_rows"] / util["oracle_capacity"]).map("{:.1%}".format)
        planned = layout[layout["port_chunks"] >= 0]
        columns[f"{p.port} chunks"] = planned.groupby("family")["port_chunks"].sum()
        util = planned.groupby("family")[["port_rows", "port_capacity"]].sum()
        columns[f"{p.port} utilisation"] = (util["port_rows"] / util["port_capacity"]).map("{:.1%}".format)
        columns[f"{p.port} unplannable"] = layout[layout["port_chunks"] < 0].groupby("family").size()
    if not columns:
        return pd.DataFrame()
    frame = pd.DataFrame(columns)
    counts = [c for c in frame.columns if c.endswith(("chunks", "unplannable"))]
    frame[counts] = frame[counts].fillna(0).astype(int)
    return frame.fillna("-")


# -- history -----------------------------------------------------------------------------------


def explore_table(result: dict[str, Any]) -> pd.DataFrame:
    """One row per searched property of a ``parity explore`` result (its JSON form)."""
    columns = ["name", "examples", "refused", "seconds", "ended_by", "finds"]
    return pd.DataFrame([{c: run[c] for c in columns} for run in result["properties"]], columns=columns)


def kill_matrix_table(matrix: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for m in matrix["mutants"]:
        first = next((k for k in m["kills"].values() if k), None)
        rows.append(
            {
                "mutant": m["name"],
                "bug": m["description"],
                "source": m["source"],
                **{lv: ("killed" if m["kills"].get(lv) else "survived") for lv in matrix["levels"]},
                "first kill": first["item"] if first else "SURVIVED",
            }
        )
    return pd.DataFrame(rows)


def history_rows(night: Night) -> list[dict[str, Any]]:
    rows = []
    for p in night.ports:
        sides = p.summary["sides"]
        rows.append(
            {
                "date": night.date,
                "port": p.port,
                "suite": night.suite,
                "items": len(p.table),
                "pass_rate": float((p.table["status"] == PARITY).mean()) if len(p.table) else 0.0,
                "oracle_chunks": sides["oracle"]["chunks"],
                "port_chunks": sides["port"]["chunks"],
                "complete": night.complete,
            }
        )
    return rows


def append_history(path: Path, night: Night) -> pd.DataFrame:
    """Add tonight's rows (replacing an earlier run of the same date and port)."""
    history = read_history(path)
    tonight = pd.DataFrame(history_rows(night), columns=list(HISTORY_COLUMNS))
    if not history.empty:
        same = history["date"].eq(night.date) & history["port"].isin(tonight["port"])
        history = history[~same]
    history = pd.concat([history, tonight], ignore_index=True).sort_values(["date", "port"], kind="stable")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in history.to_dict(orient="records"):
            out.write(json.dumps(record, sort_keys=True) + "\n")
    return history


def read_history(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return pd.DataFrame(lines, columns=list(HISTORY_COLUMNS))


# -- rendering ---------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; }
.verdict { font-size: 1.4em; font-weight: bold; padding: 0.4em 0.8em; display: inline-block; }
.pass { background: #d9f2d9; } .fail { background: #f7d4d4; }
.incomplete { background: #fff2b3; border: 2px solid #e0b000; padding: 0.6em; font-weight: bold; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
code, pre { background: #f6f6f6; padding: 0 3px; }
"""


def _img(data: str, alt: str) -> str:
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def explore_verdict(night: Night, port: str) -> str:
    """``clean``, ``found`` or ``incomplete`` for a port's search tonight, ``not-run``
    when the night asked for none; asked for and missing (a shard 1 that never got
    there, say) is ``incomplete``."""
    if night.explore_budget_s <= 0:
        return "not-run"
    return next((r["verdict"] for r in night.explore if r["port"] == port), "incomplete")


def headline_port(night: Night) -> str:
    """Whose verdict the headline is: per_request's when it ran, else every port's."""
    return "per_request" if any(p.port == "per_request" for p in night.ports) else "every port"


def overall_verdict(night: Night) -> str:
    """The headline: the suite's verdict and, when the night searched, explore's,
    for per_request (or for every port when per_request did not run)."""
    table = verdict_table(night)
    if not night.complete:
        return "INCOMPLETE"
    ports = ["per_request"] if (table["port"] == "per_request").any() else list(table["port"])
    rows = table[table["port"].isin(ports)]
    searches = [explore_verdict(night, port) for port in ports]
    if (rows["verdict"] == "FAIL").any() or "found" in searches:
        return "FAIL"
    if "incomplete" in searches:
        return "INCOMPLETE"
    return "PASS"


def render_html(night: Night, history: pd.DataFrame) -> str:
    verdict = overall_verdict(night)
    css_class = {"PASS": "pass", "FAIL": "fail"}.get(verdict, "incomplete")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Nightly parity {html.escape(night.date)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Nightly parity report: {html.escape(night.date)}</h1>",
        f"<p>Suite <code>{html.escape(night.suite)}</code>; pinned oracle "
        f"{html.escape(str(night.provenance.get('oracle', {}).get('release', '?')))} "
        f"(upstream {html.escape(str(night.provenance.get('oracle', {}).get('upstream_commit', '?')))}).</p>",
        f'<div id="verdict" class="verdict {css_class}">Verdict ({headline_port(night)}): {verdict}</div>',
    ]
    if not night.complete:
        parts.append(
            f'<p class="incomplete" id="incomplete">INCOMPLETE: the run stopped after {night.items_done} of '
            f"{night.expected_items} items; the figures below cover only what finished.</p>"
        )
    parts += ["<h2>Verdict per port and level</h2>", verdict_table(night).to_html(index=False, table_id="verdicts")]
    chunks = chunk_table(night)
    if not chunks.empty:
        parts += ["<h2>Chunks and workspace utilisation per family</h2>", chunks.to_html(table_id="chunks")]
    plot = chunk_plot(night)
    if plot:
        parts.append(_img(plot, "chunks per family"))
    for p in night.ports:
        parts.append(f"<h2>Port {html.escape(p.port)}</h2>")
        parts.append(family_level_table(p).to_html(classes="families"))
        histogram = ulp_histogram_plot(p)
        if histogram:
            parts.append(_img(histogram, f"{p.port} ULP histogram"))
        failing = p.table[p.table["status"] != PARITY].head(10)
        if not failing.empty:
            parts.append("<h3>First failing items</h3>")
            parts.append(failing[["id", "status", "detail"]].to_html(index=False))
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        parts.append(f"<h2>Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed</h2>")
        parts.append(kill_matrix_table(night.kill_matrix).to_html(index=False, table_id="kill-matrix"))
    if night.coverage:
        parts.append(f'<h2 id="coverage">{html.escape(headline(night.coverage))}</h2>')
        coverage = pd.DataFrame(table_rows(night.coverage))
        parts.append(coverage.to_html(index=False, table_id="coverage-table"))
    if night.explore:
        parts.append('<h2 id="explore">Property-based exploration (parity explore)</h2>')
        for result in night.explore:
            parts.append(f"<h3>{html.escape(result['port_spec'])}: {html.escape(result['verdict'].upper())}</h3>")
            parts.append(explore_table(result).to_html(index=False, classes="explore"))
            for find in result["finds"]:
                parts.append(
                    f"<p>{html.escape(find['property'])}, {html.escape(find['status'])}: "
                    f"{html.escape(find['detail'])}<br><code>{html.escape(find['command'])}</code></p>"
                )
    if night.gpu:
        parts.append(gpu_section_html(*night.gpu))
    parts.append("<h2>History</h2>")
    images = history_plots(history)
    parts += [_img(image, "history") for image in images] or ["<p>No history yet.</p>"]
    parts += [
        "<h2>Provenance</h2>",
        f"<pre id='provenance'>{html.escape(json.dumps(night.provenance, indent=2, sort_keys=True))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts)


def render_markdown(night: Night) -> str:
    verdict = overall_verdict(night)
    lines = [f"# Nightly parity report: {night.date}", "", f"Verdict ({headline_port(night)}): **{verdict}**", ""]
    if not night.complete:
        lines += [f"**INCOMPLETE**: stopped after {night.items_done} of {night.expected_items} items.", ""]
    lines += [verdict_table(night).to_markdown(index=False), ""]
    chunks = chunk_table(night)
    if not chunks.empty:
        lines += ["## Chunks per family", "", chunks.to_markdown(), ""]
    for p in night.ports:
        lines += [f"## {p.port}", "", family_level_table(p).to_markdown(), ""]
        for level, n in p.summary["numeric"].items():
            lines.append(f"- {level}: bit-exact {n['bit_exact']}/{n['items']}, max {n['max_ulp']} ULP")
        lines.append("")
    if night.kill_matrix:
        killed = sum(m["killed"] for m in night.kill_matrix["mutants"])
        lines += [f"## Mutant kill matrix: {killed}/{len(night.kill_matrix['mutants'])} killed", ""]
        lines += [kill_matrix_table(night.kill_matrix).to_markdown(index=False), ""]
    if night.coverage:
        lines += [f"## {headline(night.coverage)}", "", coverage_markdown(night.coverage)]
    if night.explore:
        lines += ["## Property-based exploration (parity explore)", ""]
        lines += [result["markdown"] for result in night.explore]
    if night.gpu:
        path, report = night.gpu
        lines += [f"## GPU (latest report: {path}, {report.get('date')})", ""]
        lines += gpu_section_markdown(report, heading="###")
    oracle = night.provenance.get("oracle", {})
    environment = night.provenance.get("environment", {})
    repo = night.provenance.get("port_repository", {})
    lines += [
        "## Provenance",
        "",
        f"- oracle: {oracle.get('release')} (upstream {oracle.get('upstream_commit')}), installed vllm "
        f"{oracle.get('installed_vllm')} ({oracle.get('installed_commit_id')}), fingerprints "
        f"{'overridden' if oracle.get('oracle_drift_overridden') else 'all ok'}",
        f"- torch {environment.get('torch')}, triton {environment.get('triton')}, device {environment.get('device')}",
        f"- port repository {repo.get('commit')} ({'dirty' if repo.get('dirty') else 'clean'})",
    ]
    return "\n".join(lines) + "\n"


def write_night(night: Night, out_dir: Path, history_path: Path) -> Path:
    """Write (or rewrite) the night's files; the history is appended once, when complete."""
    out_dir.mkdir(parents=True, exist_ok=True)
    history = append_history(history_path, night) if night.complete else read_history(history_path)
    for p in night.ports:
        p.table.to_parquet(out_dir / f"results-{p.port}.parquet", index=False)
    (out_dir / "report.md").write_text(render_markdown(night), encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_html(night, history), encoding="utf-8")
    return index
