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

from harness.model.levels import LEVELS, level_spec
from harness.night.drift import DRIFT_REPORTS, latest_drift_report

__all__ = ["DRIFT_REPORTS", "latest_drift_report"]


def level_heading(level: str) -> str:
    """A level's name in the report's tables (its registered heading)."""
    return (level_spec(level).heading or level) if level in LEVELS else level


STATUS_COLUMNS = (
    "parity",
    "both-refuse",
    "layout-only",
    "divergent",
    "refuse-differently",
    "pinned-error",
    "release-error",
)
# Items listed per level beyond the tables; the JSON holds every one.
LISTED_ITEMS = 20


def gibibytes(size: int | None) -> str:
    """As ``du -sh`` prints it (GiB)."""
    return "unknown" if size is None else f"{size / 2**30:.1f} GiB"


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else "-"


def _short(symbol: str) -> str:
    """``module:qual.name`` without the MLA modules' long prefix (the table's width)."""
    for module in ("mla_attention", "sparse_mla_attention"):
        symbol = symbol.replace(f"vllm.model_executor.layers.attention.{module}:", f"{module}:")
    return symbol


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
            f"| {level_heading(level)} | {drift['items']} | {counts} | {drift['seconds']} | "
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


def examples(items: list[dict[str, Any]], limit: int = LISTED_ITEMS) -> list[dict[str, Any]]:
    """At most ``limit`` items to list, in suite order, every kind of change
    (status and changed fields) represented: the first of each kind, then the
    second of each, and so on."""
    kinds: dict[tuple[str, ...], list[int]] = {}
    for index, item in enumerate(items):
        kinds.setdefault((item["status"], *item.get("changed", [])), []).append(index)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < min(limit, len(items)):
        chosen += [indices[depth] for indices in kinds.values() if depth < len(indices)][: limit - len(chosen)]
        depth += 1
    return [items[i] for i in sorted(chosen)]


def symbol_lines(name: str, drift: dict[str, Any]) -> list[str]:
    """What a level executes of vLLM and what of it the release moved."""
    if "symbols_drifted" not in drift:
        return []
    executed = f"the pinned oracle executes {drift.get('symbols_executed_pinned', drift['symbols_executed'])}"
    if "symbols_executed_release" in drift:
        executed += (
            f" fingerprinted symbols at this level, the release's {drift['symbols_executed_release']} "
            f"({drift['symbols_executed']} together)"
        )
    else:
        executed += " fingerprinted symbols at this level"
    line = f"- {name}: {executed}; changed or missing in the release: "
    line += f"{_names([_short(s) for s in drift['symbols_drifted']])}"
    if drift.get("symbols_new"):
        line += f"; new in the release's trace: {_names([_short(s) for s in drift['symbols_new']])}"
    lines = [line + "."]
    transcribed = drift.get("symbols_transcribed") or {}
    if transcribed:
        shown = ", ".join(f"`{_short(s)}` {status}" for s, status in transcribed.items())
        lines.append(
            f"- {name}: transcribed, not called (the release's answers use the pin's transcription, so parity "
            f"does not measure a change there): {shown}."
        )
    return lines


def level_lines(name: str, drift: dict[str, Any]) -> list[str]:
    """One level's symbols, changed fields, routes, error classes and first items."""
    lines = symbol_lines(name, drift)
    if drift["changed"]:
        changed = ", ".join(f"`{k}` ({v} items)" for k, v in drift["changed"].items())
        lines.append(f"- {name}: changed {changed}.")
    moved = {pair: n for pair, n in drift.get("routes", {}).items() if pair.split(" -> ")[0] != pair.split(" -> ")[1]}
    if drift.get("routes"):
        kept = sum(n for pair, n in drift["routes"].items() if pair not in moved)
        shown = "; ".join(f"{pair} ({n})" for pair, n in moved.items()) or "none"
        lines.append(f"- {name}: routes changed (pinned -> release): {shown}; {kept} kept their route.")
    for status, classes in drift["error_classes"].items():
        shown = "; ".join(f"{text} ({n})" for text, n in classes.items())
        lines.append(f"- {name}, {status} classes: {shown}")
    for item in examples([i for i in drift["not_parity"] if i["status"] not in ("both-refuse", "layout-only")]):
        changed = f" [{', '.join(item['changed'])}]" if item.get("changed") else ""
        lines.append(f"  - `{item['id']}` {item['status']}{changed}: {item['detail']}")
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
        "- Time: "
        + ", ".join(f"{part} {seconds[part]} s" for part in ("trace", "sources", "parity") if part in seconds)
        + ".",
        f"- Release's own pin: {release.get('release_pin') or 'none (oracle/pins has no file for it)'}.",
        "",
        f"### Oracle-vs-oracle parity, suite {release.get('suite', '?')}: {parity['verdict'].upper()}",
        "",
        "The pinned oracle (in-process) against this release's (`python -m oracle.serve` in its environment), "
        "item by item with the harness's runner. `both-refuse`: both releases refuse the item (agreement); "
        "`layout-only`: a sparse L3 batch both route to sparse MQA (compared at sparse-layout); "
        "`pinned-error` / `release-error`: only that one refuses or fails; `refuse-differently`: both "
        "refuse, for different reasons.",
        "",
        *level_table(parity["levels"]),
        "",
        parity["torch_note"],
        "",
    ]
    if parity.get("sparse_note"):
        lines += [parity["sparse_note"], ""]
    for level, drift in parity["levels"].items():
        lines += level_lines(level_heading(level), drift)
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
        f"{', '.join(level_heading(level) for level in record['levels'])}.",
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
            f"{level_heading(level)} {drift['verdict']}" for level, drift in release["parity"]["levels"].items()
        )
        lines.append(
            f"- {release['release']}: {counts['changed']} of {sum(counts.values())} symbols changed, "
            f"{counts['missing']} missing; {'grew: ' + '; '.join(grown) if grown else 'no fields added'}. "
            f"Parity: {levels or 'not measured'}."
        )
    return lines
