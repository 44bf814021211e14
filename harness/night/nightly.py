"""Running the nightly sweep: the night's data, every port, incremental writes,
interruption, baselines, the history store and the night's exit code.

The report is rewritten after every step, and first of all before any work, so
a run killed at any point leaves a readable report; only a run that finishes
marks it complete and appends to the history store. Until then the night lists
the steps still pending (a port, the mutant kill matrix, a search), so a page
written mid-run says what is still running rather than that the run stopped.
SIGINT and SIGTERM stop the run gracefully: what finished is kept and the night
says where it stopped.

Every port is judged against its baseline (harness/verdicts/baseline.py): by default
``cases/baselines/<port>.json`` for a built-in port that has one, else what
``NightlyPlan.baselines`` gives. A divergence the baseline expects is not a
failure; a new one fails the night (:func:`night_exit_code`).

The history store and the night's sizes (what makes a night *reduced*) are
harness/night/history.py's. A write that fails mid-night (a full disk) stops
nothing: ``Night.unwritten`` says what is still unwritten, for the command to
print. This module renders nothing: the report is written by the
``write_report`` callback the command passes in (reports/nightly.py's
``write_report``), so the harness never imports ``reports/``.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.cases.suites import CASES_DIR, Suite
from harness.night.drift import latest_drift_report
from harness.night.history import _ISO_DATE, night_sizes, reduced_reasons, warn

# The history store was this module's: its names are still importable from here.
from harness.night.history import HISTORY_COLUMNS as HISTORY_COLUMNS
from harness.night.history import append_history as append_history
from harness.night.history import history_rows as history_rows
from harness.night.history import read_history as read_history
from harness.protocol.port import Port, l3_compares
from harness.search.coverage import JudgedCoverage, nightly_coverage
from harness.sides.items import NOT_RUN, PARITY
from harness.sides.loading import BUILTIN_PORTS
from harness.sides.pool import WorkerPool, stream_items
from harness.sides.runner import INTERRUPTED_WHY, LOST_WHY, Shard, count_items, selected_item_ids, unfinished_items
from harness.verdicts.baseline import (
    EXPECTED,
    NEW,
    BaselineEntry,
    check_baseline_oracle,
    check_baseline_port,
    load_baseline,
    pinned_release,
)
from harness.verdicts.baseline import port_names as baseline_port_names
from harness.verdicts.judge import apply_baseline
from harness.verdicts.provenance import collect, port_digest, port_repository, source_digest
from harness.verdicts.results_file import items_digest
from harness.verdicts.summary import COLUMNS, check_prefill_layouts, result_row, summarise_table

NIGHT_META = "night.json"
LOCK_FILE = ".nightly.lock"
BASELINES_DIR = CASES_DIR / "baselines"
# The GPU reports benchmarks/gpu_report.py writes; the latest becomes the night's GPU section.
GPU_REPORTS = Path("reports/gpu")
_DATED_JSON = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}\.json$")
# ``--baseline PORT=none``: judge that port against no baseline, not its default one.
NO_BASELINE = "none"

# A port's verdict against its baseline (:attr:`Tally.verdict`).
PASS, EXPECTED_ONLY, FAIL, INCOMPLETE, NO_ITEMS = "pass", "expected", "fail", "incomplete", "-"
# The exit codes every command uses (harness/commands/common.py).
EXIT_PASS, EXIT_DIVERGENT, EXIT_INTERRUPTED = 0, 1, 130


# -- the night's data ----------------------------------------------------------------------


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


@dataclass(frozen=True)
class Tally:
    """A port's (or a level's) items by how the baseline judged them. ``expected``
    and ``new`` partition the failing items (divergent, errors); ``not_run`` are
    items of a level the port does not implement."""

    items: int
    parity: int
    expected: int
    new: int
    not_run: int

    @property
    def verdict(self) -> str:
        """``fail`` when anything is new; ``incomplete`` when items did not run;
        ``expected`` when every failing item is in the baseline (a pass that is
        not bit-for-bit clean); ``pass`` when everything is at parity; ``-`` for none."""
        if not self.items:
            return NO_ITEMS
        if self.new:
            return FAIL
        if self.not_run:
            return INCOMPLETE
        return EXPECTED_ONLY if self.expected else PASS


def tally(table: pd.DataFrame) -> Tally:
    """Count ``table``'s items. Without a ``baseline`` column (a table nothing
    judged) every failing item is new."""
    status = table["status"]
    failing = ~status.isin([PARITY, NOT_RUN])
    if "baseline" in table.columns:
        expected = int((failing & (table["baseline"] == EXPECTED)).sum())
        new = int((failing & (table["baseline"] == NEW)).sum())
    else:
        expected, new = 0, int(failing.sum())
    return Tally(len(table), int((status == PARITY).sum()), expected, new, int((status == NOT_RUN).sum()))


@dataclass
class PortNight:
    """One port's share of a night: its results table (with the baseline's
    ``baseline``/``reason``/``baseline_entry`` columns when judged) and summary."""

    port: str
    table: pd.DataFrame
    summary: dict[str, Any]
    seconds: float = 0.0
    # The baseline file it was judged against; None: no baseline (every divergence is new).
    baseline: str | None = None

    @property
    def tally(self) -> Tally:
        return tally(self.table)

    @property
    def verdict(self) -> str:
        return self.tally.verdict


@dataclass
class Night:
    date: str
    suite: str
    expected_items: int
    ports: list[PortNight] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    kill_matrix: dict[str, Any] | None = None  # harness.search.mutants' JSON form
    gpu: tuple[Path, dict[str, Any]] | None = None  # the latest GPU report (:func:`latest_gpu_report`)
    # The latest ``parity drift`` report (reports/drift_report.py): "Upstream since the pin".
    drift: tuple[Path, dict[str, Any]] | None = None
    coverage: JudgedCoverage | None = None  # the suite's coverage (harness/search/coverage.py)
    # One ``parity explore`` per port (harness/search/explore.py's JSON form plus "markdown").
    explore: list[dict[str, Any]] = field(default_factory=list)
    # The seconds of explore asked for per port; 0: the night did not search.
    explore_budget_s: float = 0.0
    # Per port name, the baseline it is judged against (absent: none).
    baselines: dict[str, PortBaseline] = field(default_factory=dict)
    # The steps not finished yet, in order; while the night runs the first is running,
    # after an interruption it is where the night stopped. Empty once complete.
    pending: list[str] = field(default_factory=list)
    interrupted: bool = False
    # The sizes it ran with (harness.night.history.night_sizes; {}: not recorded).
    sizes: dict[str, Any] = field(default_factory=dict)
    # Per port name, its ``--ports`` spelling (for the failing items' reproduce commands).
    port_specs: dict[str, str] = field(default_factory=dict)
    # What could not be written ("report", "history"), one line each naming the path and why.
    unwritten: dict[str, str] = field(default_factory=dict)

    @property
    def items_done(self) -> int:
        return sum(len(p.table) for p in self.ports)

    @property
    def reduced(self) -> list[str]:
        """Why the night is smaller than a full one ([]: it is not)."""
        return reduced_reasons(self.sizes)


def explore_verdict(night: Night, port: str) -> str:
    """``clean``, ``found`` or ``incomplete`` for a port's search tonight, ``not-run``
    when the night asked for none; asked for and missing (a shard 1 that never got
    there, say) is ``incomplete``."""
    if night.explore_budget_s <= 0:
        return "not-run"
    return next((r["verdict"] for r in night.explore if r["port"] == port), "incomplete")


def judges_explore(port: PortNight) -> bool:
    """Whether a port's explore finds count in the night's verdict: only for a
    port the night expects at parity everywhere (no baseline). A port with
    expected divergences (equal_share, the legacy reference) diverges on most
    inputs by design, and a find has no family or case a baseline entry could
    name; its finds are listed on the page, marked as not judged."""
    return port.baseline is None


def night_verdict(night: Night, gated_ports: Collection[str] | None = None) -> str:
    """``PASS``, ``FAIL`` or ``INCOMPLETE`` over ``gated_ports`` (default: every
    port of the night), each against its baseline: FAIL when one has a new
    divergence or its search found one; INCOMPLETE when the night did not finish,
    a port left items unrun, a search asked for is missing, or no port was judged."""
    if not night.complete:
        return "INCOMPLETE"
    ports = [p for p in night.ports if gated_ports is None or p.port in gated_ports]
    verdicts = [p.verdict for p in ports]
    searches = [explore_verdict(night, p.port) for p in ports if judges_explore(p)]
    if FAIL in verdicts or "found" in searches:
        return "FAIL"
    if not ports or INCOMPLETE in verdicts or NO_ITEMS in verdicts or "incomplete" in searches:
        return "INCOMPLETE"
    return "PASS"


def night_exit_code(night: Night, gated_ports: Collection[str] | None = None) -> int:
    """The night's exit status, as every command's: 130 when it did not finish;
    0 when every gated port (default: every port) is at parity or diverges only
    as its baseline expects and its search (if asked for) came back clean; 1 otherwise."""
    if not night.complete:
        return EXIT_INTERRUPTED
    return EXIT_PASS if night_verdict(night, gated_ports) == "PASS" else EXIT_DIVERGENT


# -- user input: the date, baselines, the lock ---------------------------------------------


def validate_night_date(text: str) -> str:
    """``text`` if it is an ISO date (YYYY-MM-DD), the name of the night's folder
    under ``--out``; anything else (a path, ``../escape``) is a :class:`CaseError`."""
    if not _ISO_DATE.match(text):
        raise CaseError("--date", None, f"{text!r} is not a date YYYY-MM-DD (it names the folder <out>/<date>)")
    try:
        datetime.date.fromisoformat(text)
    except ValueError as exc:
        raise CaseError("--date", None, f"{text!r} is not a date: {exc}") from None
    return text


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


_held_locks: dict[Path, tuple[IO[str], int]] = {}


@contextlib.contextmanager
def nightly_lock(out_root: Path) -> Iterator[Path]:
    """Hold ``<out_root>/.nightly.lock`` (``flock``) for the block: a second night
    into the same ``--out`` (whose history and explore database it shares) is
    refused with a :class:`CaseError` instead of racing. Re-entrant within a
    process; the lock goes when the block ends or the process dies."""
    out_root.mkdir(parents=True, exist_ok=True)
    path = (out_root / LOCK_FILE).resolve()
    if path in _held_locks:
        handle, depth = _held_locks[path]
        _held_locks[path] = (handle, depth + 1)
    else:
        handle = path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CaseError(
                str(out_root / LOCK_FILE), None,
                f"another parity nightly ({holder}) is writing into {out_root}; wait for it or use another --out",
            ) from None  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, since {datetime.datetime.now().isoformat(timespec='seconds')}\n")
        handle.flush()
        _held_locks[path] = (handle, 1)
    try:
        yield path
    finally:
        handle, depth = _held_locks[path]
        if depth > 1:
            _held_locks[path] = (handle, depth - 1)
        else:
            del _held_locks[path]
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


# -- the GPU report --------------------------------------------------------------------------


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
        data = json.loads(dated[-1].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if report:
            report(f"{dated[-1]}: not a GPU report, left out of the night ({exc})")
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


# -- running a night ---------------------------------------------------------------------------

# Writes the night's report (reports/nightly.py's ``write_report``): the night, its
# folder, and the history to plot (the nights before, plus tonight once complete).
WriteReport = Callable[[Night, Path, pd.DataFrame], object]
# A progress display for (total, what is counted: "items of port NAME") and its callback.
ProgressFactory = Callable[[int, str], tuple[Any, Any]]
MUTANTS_STEP = "the mutant kill matrix"


@dataclass(frozen=True)
class NightlyPlan:
    date: str
    suite: Suite
    levels: tuple[str, ...]
    shard: Shard | None
    out_dir: Path
    history: Path
    mutants: bool = True
    # The latest GPU report here (benchmarks/gpu_report.py) becomes the night's GPU section.
    gpu_reports: Path = GPU_REPORTS
    # ``parity explore`` for every port after the suite (0: not run). Its folder is
    # not per date, so every night first replays the finds of the nights before.
    explore_budget_s: float = 0.0
    explore_dir: Path | None = None
    # The ``--ports`` spelling of each port, for the finds' reproduce commands.
    port_specs: tuple[str, ...] = ()
    # ``--baseline PORT=FILE`` (:func:`parse_baseline_options`): by port name or
    # spelling; None judges the port against no baseline. A built-in port not
    # named here gets its default (:func:`default_baseline`).
    baselines: Mapping[str, Path | None] = field(default_factory=dict)
    # Where the night's items, kill matrix and searches run (harness/sides/pool.py,
    # ``--jobs``): its workers load each port from ``port_specs``. None: in
    # this process. The night's results are the same either way; its owner closes it.
    pool: WorkerPool | None = None
    # ``--size`` and ``--numeric-size`` as given (None: the suite's default), for the page's sizes.
    size: int | None = None
    numeric_size: int | None = None


def _write_meta(night: Night, plan_levels: tuple[str, ...], out_dir: Path, digest: str | None = None) -> None:
    meta = {
        # Every port's items of the whole night (all shards), so merging can prove its shards add up to it.
        "items_digest": digest,
        "date": night.date,
        "suite": night.suite,
        "levels": list(plan_levels),
        "expected_items": night.expected_items,
        "complete": night.complete,
        "pending": night.pending,
        "interrupted": night.interrupted,
        "ports": [p.port for p in night.ports],
        "provenance": night.provenance,
        # The suite's coverage (measured once per night: by an unsharded run or shard 1).
        "coverage": night.coverage.to_json() if night.coverage else None,
        # Explore runs once per night (unsharded, or shard 1); its budget says whether it was asked for.
        "explore_budget_s": night.explore_budget_s,
        "explore": night.explore,
        "baselines": {port: b.to_json() for port, b in sorted(night.baselines.items())},
        "sizes": night.sizes,
        "port_specs": night.port_specs,
        # Each port's code and the harness's by content: shards of two commits are not one night.
        "port_digests": {port: port_digest(spec) for port, spec in sorted(night.port_specs.items())},
        "harness_sources": source_digest(),
        "kill_matrix": night.kill_matrix,
    }
    (out_dir / NIGHT_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_night(
    night: Night,
    out_dir: Path,
    history: pd.DataFrame,
    write_report: WriteReport,
    digest: str | None,
    levels: tuple[str, ...],
) -> None:
    """The night's files: each port's results, the report, and night.json last
    (a night.json names only ports whose results are already on disk)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in night.ports:
        p.table.to_parquet(out_dir / f"results-{p.port}.parquet", index=False)
    write_report(night, out_dir, history)
    _write_meta(night, levels, out_dir, digest)


def run_nightly(
    plan: NightlyPlan,
    oracle: Port,
    ports: list[Port],
    oracle_provenance: dict[str, Any],
    *,
    write_report: WriteReport,
    progress: ProgressFactory | None = None,
) -> Night:
    """Run the night under ``<out>/.nightly.lock`` (``plan.out_dir``'s parent is
    ``--out``). Bad input (the date, a baseline) is refused before anything is written.
    ``plan.pool`` (when given) runs the night's work in its worker processes."""
    validate_night_date(plan.date)
    if plan.pool is not None and len(plan.port_specs) != len(ports):
        # The workers load each port from its spelling; the Port objects given
        # would otherwise only lend their names to whatever those load.
        raise ValueError(
            f"a night with a worker pool needs the spelling of each of its {len(ports)} ports "
            f"(plan.port_specs holds {len(plan.port_specs)}): the workers load the ports from them"
        )
    specs = list(plan.port_specs or [p.name for p in ports])
    with nightly_lock(plan.out_dir.parent):
        baselines = nightly_baselines(ports, specs, plan.baselines, plan.suite.name, oracle_provenance.get("release"))
        history = read_history(plan.history)
        return _run_locked(plan, oracle, ports, specs, oracle_provenance, baselines, history, write_report, progress)


def _run_locked(
    plan: NightlyPlan,
    oracle: Port,
    ports: list[Port],
    specs: list[str],
    oracle_provenance: dict[str, Any],
    baselines: dict[str, PortBaseline],
    history: pd.DataFrame,
    write_report: WriteReport,
    progress: ProgressFactory | None,
) -> Night:
    per_port = count_items(plan.suite, plan.levels, plan.shard)
    night = Night(plan.date, plan.suite.name, per_port * len(ports), provenance=collect(oracle_provenance))
    night.provenance["shard"] = str(plan.shard) if plan.shard else None
    # Each port's own code (its repository and commit), not the harness's in its place.
    night.provenance["port_repositories"] = {p.name: port_repository(s, p) for p, s in zip(ports, specs, strict=True)}
    night.gpu = latest_gpu_report(plan.gpu_reports)
    night.drift = latest_drift_report()
    night.baselines = baselines
    night.port_specs = {p.name: s for p, s in zip(ports, specs, strict=True)}
    # Only the shard that searches (shard 1, or the whole night) owes a search.
    searches = plan.shard is None or plan.shard.number == 1
    night.explore_budget_s = plan.explore_budget_s if searches else 0.0
    mutants = plan.mutants and plan.shard is None
    night.sizes = night_sizes(
        plan.suite.name, plan.size, plan.numeric_size, plan.levels, mutants, plan.explore_budget_s
    )
    night.pending = [f"port {p.name}" for p in ports]
    night.pending += [MUTANTS_STEP] if mutants else []
    night.pending += [f"parity explore of {spec}" for spec in specs] if night.explore_budget_s > 0 else []
    digest = items_digest(selected_item_ids(plan.suite, plan.levels))

    def save() -> None:
        # A report that cannot be written (a full disk) stops nothing: the night goes on,
        # the next save tries again, and the command prints what is still unwritten.
        try:
            _write_night(night, plan.out_dir, history, write_report, digest, plan.levels)
            night.unwritten.pop("report", None)
        except OSError as exc:
            night.unwritten["report"] = _unwritable(exc, plan.out_dir, "report")

    # Coverage is the suite's, not a shard's: one shard measures it for the night.
    if searches:
        night.coverage = nightly_coverage(plan.suite, oracle)
    save()

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for port, spec in zip(ports, specs, strict=True):
            bar, advance = progress(per_port, f"items of port {port.name}") if progress else (None, None)
            # The night writes tables: each result becomes its row at once (a divergent
            # port's layouts, tens of thousands of them, are never all held), and the
            # workers do not send the layouts' chunks back.
            rows: list[dict[str, Any]] = []
            started = time.perf_counter()
            stream = stream_items(
                oracle, port, spec, plan.suite, plan.levels, plan.shard, pool=plan.pool, keep_layouts=False
            )
            try:
                for result in stream:
                    rows.append(result_row(result))
                    if advance is not None:
                        advance(result)
            except KeyboardInterrupt:
                night.interrupted = True
                # What workers finished past the last result in order is kept too; what
                # the port did not reach is not-run, so its row can never read PASS.
                rows += [result_row(r) for r in stream.unreported()]
            finally:
                stream.close()
                if bar is not None:
                    bar.stop()
            # Every selected item has its row: what the port did not reach (interrupted,
            # or lost to a harness fault) is not-run, so its row can never read PASS.
            why = INTERRUPTED_WHY if night.interrupted else LOST_WHY
            finished = {str(row["id"]) for row in rows}
            rows += [result_row(r) for r in unfinished_items(plan.suite, plan.levels, plan.shard, finished, why)]
            baseline = baselines.get(port.name)
            table = check_prefill_layouts(pd.DataFrame(rows, columns=list(COLUMNS)))
            table = judge_port(table, port.name, baseline, plan.levels)
            summary = summarise_table(table, plan.suite.name, port.name, plan.levels, l3_compares(port))
            seconds = time.perf_counter() - started
            night.ports.append(PortNight(port.name, table, summary, seconds, baseline.source if baseline else None))
            if night.interrupted:
                break
            night.pending.pop(0)
            save()
        if mutants and not night.interrupted:
            night.kill_matrix = _kill_matrix(oracle, plan)
            night.pending.pop(0)
            save()
        # Like coverage, the search is the night's, not a shard's: shard 1 runs it.
        if night.explore_budget_s > 0 and not night.interrupted:
            for port, spec in zip(ports, specs, strict=True):
                night.explore.append(_explore(oracle, port, spec, plan))
                night.pending.pop(0)
                save()
    except KeyboardInterrupt:
        night.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    night.complete = not night.interrupted
    if night.complete:
        try:
            history = append_history(plan.history, night)
        except OSError as exc:
            night.unwritten["history"] = _unwritable(exc, plan.history, "history")
    save()
    return night


def _unwritable(exc: OSError, path: Path, what: str) -> str:
    """One line naming the path that could not be written and why."""
    return f"{exc.filename or path}: cannot write the {what} ({exc.strerror or exc})"


def explore_seed(date: str) -> int:
    """Each night searches from a new seed (its date), after replaying the database."""
    return int("".join(ch for ch in date if ch.isdigit()) or "0")


def _explore(oracle: Port, port: Port, spec: str, plan: NightlyPlan) -> dict[str, Any]:
    """``parity explore`` of one port at the night's levels; its JSON form plus its Markdown."""
    from harness.kernels import CpuKernels
    from harness.search.explore import explore

    level = plan.levels[0] if len(plan.levels) == 1 else "all"
    root = plan.explore_dir or plan.out_dir.parent / "explore"
    folder = root / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec)
    seed = explore_seed(plan.date)
    result = explore(oracle, port, spec, level, plan.explore_budget_s, seed, folder, CpuKernels(), pool=plan.pool)
    return {**result.to_json(), "markdown": result.to_markdown("###")}


def _kill_matrix(oracle: Port, plan: NightlyPlan) -> dict[str, Any]:
    """The seeded mutants against tonight's suite (no shrinking: a night has a budget)."""
    from harness.kernels import CpuKernels
    from harness.search.mutants import kill_matrix
    from ports.mutants import MUTANTS, fault_probe

    mutants = [m() for m in MUTANTS.values()]
    rows = kill_matrix(oracle, mutants, plan.suite, plan.levels, CpuKernels(), pool=plan.pool, probe=fault_probe)
    return {"suite": plan.suite.name, "levels": list(plan.levels), "mutants": [r.to_json() for r in rows]}


# -- merging shards ------------------------------------------------------------------------------


def shard_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """What every shard of one night must share besides the suite: the pin, the
    drift override, the device (a night is one oracle on one device), the
    baselines its ports are judged against, and the code of its ports and of
    the harness by content."""
    provenance = meta.get("provenance", {})
    oracle = provenance.get("oracle", {})
    return {
        "pin": f"{oracle.get('release')} @ {oracle.get('upstream_commit')}",
        "oracle_drift_overridden": oracle.get("oracle_drift_overridden"),
        "device": provenance.get("environment", {}).get("device"),
        "baselines": meta.get("baselines", {}),
        "port_digests": meta.get("port_digests"),
        "harness_sources": meta.get("harness_sources"),
    }


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / NIGHT_META
    if not path.exists():
        raise CaseError(str(path), None, "missing: not a nightly output folder")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseError(str(path), None, f"not a night's metadata ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("date"), str):
        raise CaseError(str(path), "date", "not a night's metadata")
    try:
        validate_night_date(meta["date"])
    except CaseError as exc:
        raise CaseError(str(path), "date", exc.reason) from None
    return meta


def merge_nightly_shards(
    directories: list[Path],
    out_dir: Path,
    history: Path,
    *,
    write_report: WriteReport,
    gpu_reports: Path = GPU_REPORTS,
) -> Night:
    """One night from the outputs of ``parity nightly --shard K/N`` runs, written
    to ``out_dir`` under ``out_dir``'s parent's lock; each port is judged against
    the baseline its shards carry."""
    metas = [_read_meta(directory) for directory in directories]
    first = metas[0]
    for directory, meta in zip(directories, metas, strict=True):
        if (meta["suite"], meta["levels"], meta["ports"]) != (first["suite"], first["levels"], first["ports"]):
            raise CaseError(str(directory / NIGHT_META), "suite", "shards of different runs")
        for key, value in shard_identity(meta).items():
            if value != shard_identity(first)[key]:
                shown = value if key != "baselines" else sorted(value)
                theirs = shard_identity(first)[key] if key != "baselines" else sorted(shard_identity(first)[key])
                raise CaseError(str(directory / NIGHT_META), key, f"is {shown!r} but {directories[0]} has {theirs!r}")
    levels = tuple(first["levels"])
    with nightly_lock(out_dir.parent):
        past = read_history(history)
        night = Night(
            first["date"],
            first["suite"],
            sum(m["expected_items"] for m in metas),
            provenance={**first["provenance"], "shard": None, "merged_from": [str(d) for d in directories]},
            complete=all(m["complete"] for m in metas),
            gpu=latest_gpu_report(gpu_reports),
            drift=latest_drift_report(),
            coverage=next(
                (JudgedCoverage.from_json(m["coverage"]) for m in metas if m.get("coverage") is not None), None
            ),
            explore=next((m["explore"] for m in metas if m.get("explore")), []),
            explore_budget_s=max(float(m.get("explore_budget_s", 0.0)) for m in metas),
            baselines={port: PortBaseline.from_json(b) for port, b in first.get("baselines", {}).items()},
            sizes=first.get("sizes") or {},
            port_specs=first.get("port_specs") or {},
        )
        unfinished = [d for d, m in zip(directories, metas, strict=True) if not m["complete"]]
        night.interrupted = bool(unfinished)
        night.pending = [f"shard {d}" for d in unfinished]
        for port in first["ports"]:
            table = pd.concat(
                [pd.read_parquet(d / f"results-{port}.parquet") for d in directories], ignore_index=True
            ).sort_values("index", kind="stable")
            table = table.reset_index(drop=True)
            if (
                first.get("items_digest") is None
                or items_digest([str(i) for i in table["id"]]) != first["items_digest"]
            ):
                raise CaseError(
                    str(directories[0] / NIGHT_META),
                    "items_digest",
                    f"port {port}: the shards' items, in suite order, are not the night's item list "
                    "(a shard missing, given twice, or of another run)",
                )
            baseline = night.baselines.get(port)
            table = judge_port(check_prefill_layouts(table), port, baseline, levels)
            summary = summarise_table(table, night.suite, port, levels)
            night.ports.append(PortNight(port, table, summary, baseline=baseline.source if baseline else None))
        if night.complete:
            past = append_history(history, night)
        _write_night(night, out_dir, past, write_report, first.get("items_digest"), levels)
    return night
