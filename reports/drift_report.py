"""The drift report ``parity drift`` writes: ``<out>/<date>.json`` (the record of
:func:`harness.night.drift.drift_record`) and ``<out>/<date>.md`` rendered from it,
and the nightly report's "Upstream since the pin" lines from the latest one.

Everything here renders a record (a dict as the JSON holds it), so a report
read back from disk renders as the run that wrote it did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.night.drift import DRIFT_REPORTS, latest_drift_report

__all__ = ["DRIFT_REPORTS", "latest_drift_report"]

LEVEL_NAMES = {"layout": "L1 layout (+ workspace size)", "merge": "L2 merge", "prefill": "L3 prefill"}
STATUS_COLUMNS = ("parity", "both-refuse", "divergent", "pinned-error", "release-error")
# Items listed per level beyond the tables; the JSON holds every one.
LISTED_ITEMS = 20


def gibibytes(size: int | None) -> str:
    """As ``du -sh`` prints it (GiB)."""
    return "unknown" if size is None else f"{size / 2**30:.1f} GiB"


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else "-"


def _short(symbol: str) -> str:
    """``module:qual.name`` without the MLA module's long prefix (the table's width)."""
    return symbol.replace("vllm.model_executor.layers.attention.mla_attention:", "mla_attention:")


def symbol_table(drift: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| symbol | status | fields added | parameters added | pinned | release |",
        "|:--|:--|:--|:--|:--|:--|",
    ]
    for d in drift:
        added = _names(d["fields_added"]) + (f" (removed {_names(d['fields_removed'])})" if d["fields_removed"] else "")
        params = _names(d["parameters_added"]) + (
            f" (removed {_names(d['parameters_removed'])})" if d["parameters_removed"] else ""
        )
        lines.append(
            f"| `{_short(d['symbol'])}` | {d['status']} | {added} | {params} | "
            f"{d['pinned_fingerprint'] or '-'} | {d['release_fingerprint'] or '-'} |"
        )
    return lines


def level_table(levels: dict[str, Any]) -> list[str]:
    lines = [
        "| level | items | " + " | ".join(STATUS_COLUMNS) + " | seconds | verdict |",
        "|:--|--:|" + "--:|" * len(STATUS_COLUMNS) + "--:|:--|",
    ]
    for level, drift in levels.items():
        counts = " | ".join(str(drift["counts"].get(s, 0)) for s in STATUS_COLUMNS)
        lines.append(
            f"| {LEVEL_NAMES.get(level, level)} | {drift['items']} | {counts} | {drift['seconds']} | "
            f"{drift['verdict'].upper() if drift['verdict'] == 'parity' else drift['verdict']} |"
        )
    return lines


def fields_added_note(drift: list[dict[str, Any]]) -> list[str]:
    """The fields and parameters the release added: L1 cannot have compared them."""
    added = [(d["symbol"], d["fields_added"], d["parameters_added"]) for d in drift]
    lines = []
    for symbol, fields, params in added:
        if fields:
            lines.append(f"- `{_short(symbol)}` gained field(s) {_names(fields)}.")
        if params:
            lines.append(f"- `{_short(symbol)}` gained parameter(s) {_names(params)}.")
    if lines:
        lines += [
            "",
            "The harness's layout (harness.model.Chunk, filled by oracle/side.py from 0.28.0's fields) reads none "
            "of the fields added since the pin: L1 parity says nothing about them. They are where a port "
            "following upstream has to look.",
        ]
    return lines


def release_markdown(release: dict[str, Any]) -> list[str]:
    counts = release["symbols"]["counts"]
    parity = release["parity"]
    seconds = release.get("seconds", {})
    lines = [
        f"## {release['release']}",
        "",
        f"- Installed: vllm {release['vllm_version']} ({release['vllm_commit']}), torch {release['torch_version']}.",
        f"- Environment: `{release.get('environment', '?')}`, {gibibytes(release.get('environment_bytes'))} on disk.",
        f"- Time: sources {seconds.get('sources', '?')} s, parity {seconds.get('parity', '?')} s.",
        f"- Release's own pin: {release.get('release_pin') or 'none (oracle/pins has no file for it)'}.",
        "",
        f"### Oracle-vs-oracle parity, suite {release.get('suite', '?')}: {parity['verdict'].upper()}",
        "",
        "The pinned oracle (in-process) against this release's (`python -m oracle.serve` in its environment), "
        "item by item with the harness's runner. `both-refuse`: both releases refuse the item (agreement); "
        "`pinned-error` / `release-error`: only that one refuses or fails.",
        "",
        *level_table(parity["levels"]),
        "",
        parity["torch_note"],
        "",
    ]
    for level, drift in parity["levels"].items():
        name = LEVEL_NAMES.get(level, level)
        if "symbols_drifted" in drift:
            drifted = drift["symbols_drifted"]
            lines.append(
                f"- {name}: the pinned oracle executes {drift['symbols_executed']} fingerprinted symbols at this "
                f"level; changed or missing in the release: {_names([_short(s) for s in drifted])}."
            )
        if drift["changed"]:
            changed = ", ".join(f"`{k}` ({v} items)" for k, v in drift["changed"].items())
            lines.append(f"- {name}: changed {changed}.")
        for status, classes in drift["error_classes"].items():
            shown = "; ".join(f"{text} ({n})" for text, n in classes.items())
            lines.append(f"- {name}, {status} classes: {shown}")
        listed = [i for i in drift["not_parity"] if i["status"] != "both-refuse"][:LISTED_ITEMS]
        for item in listed:
            lines.append(f"  - `{item['id']}` {item['status']}: {item['detail']}")
    lines += [
        "",
        f"### Source drift of {sum(counts.values())} fingerprinted symbols: "
        + ", ".join(f"{n} {status}" for status, n in counts.items()),
        "",
        *symbol_table(release["symbols"]["drift"]),
        "",
    ]
    note = fields_added_note(release["symbols"]["drift"])
    if note:
        lines += [*note, ""]
    for d in release["symbols"]["drift"]:
        if d["status"] == "changed":
            lines += [f"#### `{d['symbol']}`", "", "```diff", d["diff"].rstrip("\n"), "```", ""]
        elif d["status"] in ("missing", "new"):
            lines += [f"#### `{d['symbol']}`: {d['status']}", "", f"{d['reason'] or ''}", ""]
    return lines


def render_markdown(record: dict[str, Any]) -> str:
    pin = record["pin"]
    lines = [
        f"# Upstream drift since the pin: {record['date']}",
        "",
        f"- Pinned oracle: {pin['release']} (upstream {pin['upstream_commit']}, {pin['upstream_pr']}), installed "
        f"vllm {pin['vllm_version']} ({pin['vllm_commit']}), torch {pin['torch_version']}.",
        f"- Compared: {', '.join(r['release'] for r in record['releases'])}; suite {record['suite']}, levels "
        f"{', '.join(LEVEL_NAMES.get(level, level) for level in record['levels'])}.",
        f"- Reproduce: `{record.get('command', 'parity drift')}`.",
        "",
    ]
    for release in record["releases"]:
        lines += release_markdown(release)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_reports(record: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``<out>/<date>.md`` and ``.json``; the folder is created."""
    out.mkdir(parents=True, exist_ok=True)
    markdown, data = out / f"{record['date']}.md", out / f"{record['date']}.json"
    data.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    markdown.write_text(render_markdown(record), encoding="utf-8")
    return markdown, data


def upstream_since_pin(record: dict[str, Any]) -> list[str]:
    """The nightly report's "Upstream since the pin" lines (markdown) for one drift record."""
    lines = [f"From the drift report of {record['date']} (pin {record['pin']['release']}):", ""]
    for release in record["releases"]:
        counts = release["symbols"]["counts"]
        grown = [
            f"{_short(d['symbol'])} (+{', '.join(d['fields_added'] + d['parameters_added'])})"
            for d in release["symbols"]["drift"]
            if d["fields_added"] or d["parameters_added"]
        ]
        levels = "; ".join(
            f"{LEVEL_NAMES.get(level, level)} {drift['verdict']}"
            for level, drift in release["parity"]["levels"].items()
        )
        lines.append(
            f"- {release['release']}: {counts['changed']} of {sum(counts.values())} symbols changed, "
            f"{counts['missing']} missing; {'grew: ' + '; '.join(grown) if grown else 'no fields added'}. "
            f"Parity: {levels or 'not measured'}."
        )
    return lines
