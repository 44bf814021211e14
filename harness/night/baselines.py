"""Which baseline each port of a night is judged against, and the judging.

Every port is judged against its baseline (harness/verdicts/baseline.py): by default
``cases/baselines/<port>.json`` for a built-in port that has one (or the one
measured on the night's suite, :func:`default_baseline`), else what
``NightlyPlan.baselines`` gives (``--baseline PORT=FILE``,
:func:`parse_baseline_options`). A divergence the baseline expects is not a
failure; a new one fails the night (harness.night.data.night_exit_code).

Invariants a reader must keep: every baseline is checked before the night does
any work (:func:`nightly_baselines` raises :class:`CaseError` for a file that
cannot be read, one that names none of the port's names, one measured against
another oracle, or a port that is not in the night); a port without a baseline
is judged against none, so every divergence of it is new; the night never
reports stale entries (its suite is not the one a baseline is measured on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.cases.suites import CASES_DIR
from harness.protocol.port import Port
from harness.sides.loading import BUILTIN_PORTS
from harness.verdicts.baseline import (
    BaselineEntry,
    check_baseline_oracle,
    check_baseline_port,
    load_baseline,
    pinned_release,
)
from harness.verdicts.baseline import port_names as baseline_port_names
from harness.verdicts.judge import apply_baseline

BASELINES_DIR = CASES_DIR / "baselines"
# ``--baseline PORT=none``: judge that port against no baseline, not its default one.
NO_BASELINE = "none"


@dataclass(frozen=True)
class PortBaseline:
    """The baseline a port is judged against: where it came from, its entries,
    and the names its entries may give the port (its name and ``--ports`` spelling,
    see harness.verdicts.baseline.port_names)."""

    source: str
    entries: tuple[BaselineEntry, ...]
    names: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "names": sorted(self.names), "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PortBaseline:
        source = str(data["source"])
        entries = tuple(BaselineEntry(**e, source=source, position=i) for i, e in enumerate(data["entries"]))
        return cls(source, entries, frozenset(data["names"]))


def parse_baseline_options(values: Sequence[str]) -> dict[str, Path | None]:
    """``--baseline PORT=FILE`` (repeatable) as a mapping from the port (its name
    or ``--ports`` spelling) to the file; ``PORT=none`` judges that port against
    no baseline. A malformed or repeated option is a :class:`CaseError`."""
    out: dict[str, Path | None] = {}
    for value in values:
        port, sep, file = value.partition("=")
        if not sep or not port.strip() or not file.strip():
            raise CaseError("--baseline", None, f"{value!r} is not PORT=FILE (or PORT={NO_BASELINE})")
        if port in out:
            raise CaseError("--baseline", None, f"port {port!r} is given twice")
        out[port] = None if file == NO_BASELINE else Path(file)
    return out


def default_baseline(port: Port, spec: str, suite: str = "nightly") -> Path | None:
    """A built-in port's shipped baseline for ``suite``: ``cases/baselines/<port>-<suite>.json``
    (measured on that suite) when it exists, else ``cases/baselines/<port>.json`` (the ci
    suite's, which the gate uses), else none."""
    for short, path in BUILTIN_PORTS.items():
        if {spec, port.name} & {short, path}:
            for candidate in (BASELINES_DIR / f"{short}-{suite}.json", BASELINES_DIR / f"{short}.json"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def _shown(path: Path) -> str:
    """A baseline's name on the page: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(CASES_DIR.parent))
    except ValueError:
        return str(path)


def nightly_baselines(
    ports: Sequence[Port],
    specs: Sequence[str],
    given: Mapping[str, Path | None],
    suite: str = "nightly",
    oracle: str | None = None,
) -> dict[str, PortBaseline]:
    """Each port's baseline, by port name: the one ``given`` for it (by name or
    spelling), else its default (:func:`default_baseline`, measured against the
    pin: none under another ``oracle``). A file that cannot be read or parsed, a
    baseline none of whose entries names the port, one measured against another
    oracle than the night's, or a ``given`` port that is not in the night is a
    :class:`CaseError`."""
    oracle = oracle or pinned_release()
    out: dict[str, PortBaseline] = {}
    used: set[str] = set()
    for port, spec in zip(ports, specs, strict=True):
        names = baseline_port_names(port.name, spec)
        keys = [key for key in given if key in names]
        if len(keys) > 1:
            raise CaseError("--baseline", None, f"port {port.name} is given twice ({', '.join(keys)})")
        used.update(keys)
        path = given[keys[0]] if keys else None
        if not keys and oracle == pinned_release():
            path = default_baseline(port, spec, suite)
        if path is None:
            continue
        entries = load_baseline(path)
        check_baseline_port(entries, names)
        check_baseline_oracle(entries, oracle)
        out[port.name] = PortBaseline(_shown(path), tuple(entries), names)
    unknown = sorted(set(given) - used)
    if unknown:
        ran = ", ".join(specs)
        raise CaseError("--baseline", None, f"port {unknown[0]!r} is not one of the night's ports ({ran})")
    return out


def judge_port(table: pd.DataFrame, port: str, baseline: PortBaseline | None, levels: tuple[str, ...]) -> pd.DataFrame:
    """``table`` with the baseline's columns. Stale entries are not the night's
    concern: its suite is not the one a baseline is measured on (the gate's is)."""
    if baseline is None:
        return apply_baseline(table, baseline_port_names(port), [], levels, check_stale=False).table
    return apply_baseline(table, baseline.names, list(baseline.entries), levels, check_stale=False).table
