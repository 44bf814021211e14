"""``junit.xml``: one testcase per item, for CI systems that read JUnit.

A new divergence is a ``<failure>`` whose message starts with why the
baseline does not expect it, an oracle error an ``<error>``, an item the port
did not run a ``<failure>`` of type ``not-run``, an expected (baseline)
divergence a ``<skipped>`` with its reason, and each stale baseline entry a
failing testcase of its own.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.sides.items import NOT_RUN, ORACLE_ERROR
from harness.verdicts.baseline import EXPECTED, NEW
from harness.verdicts.launch import PORT_DIR_NOTE, shell_join, uses_port_dir
from harness.verdicts.reproduce import printed_id, reproduce_from_meta
from harness.verdicts.summary import layout_causes
from reports.failure_text import failure_lines

if TYPE_CHECKING:
    from harness.verdicts.gate import GateOutcome


def render_junit(outcome: GateOutcome) -> ET.ElementTree[ET.Element]:
    meta, table = outcome.meta, outcome.verdict.table
    causes = layout_causes(table)
    suites = ET.Element("testsuites", name=f"parity {meta['suite']} {meta['port']}")
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    suite = ET.SubElement(suites, "testsuite", name=f"parity.{meta['suite']}.{meta['port']}")
    properties = ET.SubElement(suite, "properties")
    # Where the verdict was reached: the device, the CPU's model, torch's capability and the BLAS's path on it.
    environment = meta.get("provenance", {}).get("environment", {})
    for name in ("device", "cpu", "cpu_capability", "blas"):
        ET.SubElement(properties, "property", name=name, value=str(environment.get(name)))
    # What the L3 testcases compared of this port (an external port: its fold only).
    for level, what in outcome.summary.get("l3_compares", {}).items():
        ET.SubElement(properties, "property", name=f"{level}_compared", value=what)
    if uses_port_dir(shell_join(meta.get("launch") or [])):
        # Where the testcases' reproduce lines run: the variable they name the port's checkout by.
        ET.SubElement(properties, "property", name="reproduce", value=PORT_DIR_NOTE)
    for row in table.itertuples(index=False):
        name = printed_id(row.id, meta.get("suite"), meta.get("size"), meta.get("cases"), meta.get("numeric_size"))
        case = ET.SubElement(suite, "testcase", classname=f"parity.{meta['suite']}.{row.level}", name=name)
        if row.baseline == EXPECTED:
            ET.SubElement(case, "skipped", message=f"expected divergence: {row.reason}").text = row.detail
            counts["skipped"] += 1
        elif row.baseline == NEW and row.status == ORACLE_ERROR:
            ET.SubElement(case, "error", message=row.detail, type=row.status).text = _with_command(row, meta)
            counts["errors"] += 1
        elif row.baseline == NEW:
            detail = failure_lines(row, causes)[0]
            message = f"{row.reason}: {detail}" if row.reason else detail
            ET.SubElement(case, "failure", message=message, type=row.status).text = _with_command(row, meta, causes)
            counts["failures"] += 1
        elif row.status == NOT_RUN:
            # Compared with nothing: never a pass, whatever the baseline says.
            ET.SubElement(case, "failure", message=row.detail, type=row.status).text = _with_command(row, meta)
            counts["failures"] += 1
    for entry in outcome.verdict.stale:
        case = ET.SubElement(suite, "testcase", classname=f"parity.{meta['suite']}.baseline", name=entry.label)
        message = "stale or miscounted baseline entry: fewer failing items match it than it expects (re-measure)"
        ET.SubElement(case, "failure", message=message, type="stale").text = entry.reason
        counts["failures"] += 1
    tests = len(table) + len(outcome.verdict.stale)
    for element in (suite, suites):
        element.set("tests", str(tests))
        for key, value in counts.items():
            element.set(key, str(value))
    ET.indent(suites)
    return ET.ElementTree(suites)


def _with_command(row: Any, meta: dict[str, Any], causes: Mapping[str, str] | None = None) -> str:
    """A failing item's text: what every report says of it (its cause, its
    detail, a float item's ULP histogram), then the command that compares it again."""
    said = "\n".join(failure_lines(row, causes or {}))
    return f"{said}\nreproduce: {reproduce_from_meta(row.name, row.kind, meta)}"


def write_junit(outcome: GateOutcome, path: Path) -> None:
    render_junit(outcome).write(path, encoding="utf-8", xml_declaration=True)
