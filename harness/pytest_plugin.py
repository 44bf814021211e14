"""pytest plugin: parity items from a suite, for JUnit, ``-k`` and pytest-xdist.

``pytest --parity-suite ci --parity-port per_request`` collects one item per
(case, level), with ids such as ``ci/skew-0031[prefill]``, instead of the test
files: the harness's own unit tests are never mixed with parity items. A failing
item's message is the first-divergence text ``parity diff`` prints.

Rules (the same as ``parity gate``'s, by construction):

- Nothing compared is never a pass: ``--parity-suite`` given empty or blank (an
  unset CI variable), or any other ``--parity-*`` option given without
  ``--parity-suite``, is a usage error, never a run of the repository's own tests.
- Every option is checked in ``pytest_configure``, before anything is collected
  (under pytest-xdist the controller never collects): an unknown suite or level,
  a port that does not load, a bad size, timeout, shard or device stops the
  session with one line, ``ERROR: --parity-OPTION: why``, and exit code 4.
- A selection of zero items (a level the suite lacks, an empty shard) is a usage
  error, one line: nothing compared is never a pass.
- An item at a level the port does not implement (a port's ``levels``, e.g. an
  external ``cmd:`` port declaring only ``("layout",)``) fails as ``not-run``,
  unless ``--parity-level`` leaves that level out.
- With ``--parity-baseline FILE`` the file is checked before any item runs (bad
  input, or an entry naming a case, family or port the run cannot have, is a
  usage error, and so is a baseline none of whose entries names the port under
  test), and each failing item is judged *after* it ran, by
  :func:`harness.verdicts.baseline.judge_item`, the gate's own rule, matching entries by
  the loaded port's ``name`` (or the ``--parity-port`` spelling): an expected
  item is ``xfail`` with the entry's reason; one beyond its entry fails and
  says why. An oracle error is never ``xfail``. Stale entries are the gate's job.

Under pytest-xdist (``-n N``) each xdist worker is one process that compares
the items it is given in-process: the plugin never starts a worker pool of its
own (``--jobs`` is the CLI's, :mod:`harness.sides.pool`), and torch runs on one thread
in every process that compares (:func:`harness.engine.select_device`),
so ``-n N`` keeps N cores busy without oversubscribing them and gives the same
verdicts and figures as one process.

Registered through the ``pytest11`` entry point, so it is active wherever the
package is installed; without any ``--parity-*`` option it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S
from harness.sides.items import LEVELS, CaseResult
from harness.sides.runner import Shard, plan_items, run_item

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.protocol.port import Port
    from harness.verdicts.baseline import BaselineEntry

_T = TypeVar("_T")


SUITE_OPTION = "--parity-suite"
# Every option's argparse default is None, so an option is "given" exactly when
# its value is not None (an explicit spelling of a default counts); the
# defaults below apply only once a suite is named.
DEFAULTS: dict[str, str] = {
    "--parity-port": "per_request",
    "--parity-level": "all",
    "--parity-timeout": str(DEFAULT_PORT_TIMEOUT_S),
    "--parity-device": "cpu",
}
OPTIONS_NEEDING_A_SUITE = (
    "--parity-port",
    "--parity-level",
    "--parity-size",
    "--parity-timeout",
    "--parity-shard",
    "--parity-baseline",
    "--parity-allow-oracle-drift",
    "--parity-device",
    "--parity-no-oracle-cache",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    # Values are checked in pytest_configure, not by argparse (type=, choices=):
    # argparse's refusal is four lines of usage, the plugin's is one.
    group = parser.getgroup("parity", "MLA chunked-context parity against the pinned oracle")
    group.addoption(SUITE_OPTION, help="collect parity items from this suite (smoke, ci, nightly, gpu)")
    group.addoption(
        "--parity-port",
        help="port under test: per_request, equal_share, mutant:NAME, cmd:COMMAND or package.module:attr "
        "(default per_request)",
    )
    group.addoption("--parity-level", help=f"parity level: {', '.join(LEVELS)} or all (default all)")
    group.addoption(
        "--parity-size",
        metavar="N",
        help="the suite's scale, >= 0: N generated layout cases and every other part its share (parity's --size)",
    )
    group.addoption(
        "--parity-timeout",
        metavar="SECONDS",
        help=f"seconds a port call may take, > 0 (default {DEFAULT_PORT_TIMEOUT_S:g})",
    )
    group.addoption("--parity-shard", metavar="K/N", help="collect only shard K of N")
    group.addoption("--parity-baseline", metavar="FILE", help="expected divergences: xfail the items they expect")
    group.addoption(
        "--parity-allow-oracle-drift", action="store_true", default=None, help="run despite fingerprint drift"
    )
    group.addoption("--parity-device", help="where L2 and L3 run: cpu or cuda (default cpu)")
    group.addoption(
        "--parity-no-oracle-cache",
        action="store_true",
        default=None,
        help="ask the oracle afresh: neither read nor write the oracle cache (as parity's --no-oracle-cache)",
    )


def _option(config: pytest.Config, option: str) -> Any:
    """The option's value as given, else its default (None where it has none)."""
    value = config.getoption(option)
    return DEFAULTS.get(option) if value is None else value


def _active(config: pytest.Config) -> bool:
    return config.getoption(SUITE_OPTION, default=None) is not None


def _check_parity_mode(config: pytest.Config) -> bool:
    """Whether this run compares: ``--parity-suite`` names a suite. A blank suite,
    or another ``--parity-*`` option without one, would otherwise run the
    repository's own tests and could pass having compared nothing."""
    suite = config.getoption(SUITE_OPTION, default=None)
    if suite is not None:
        if not suite.strip():
            raise pytest.UsageError(f"{SUITE_OPTION}: empty value (an unset variable?): name a suite")
        return True
    for option in OPTIONS_NEEDING_A_SUITE:
        if config.getoption(option, default=None) is not None:
            raise pytest.UsageError(f"{option} needs {SUITE_OPTION}: without a suite the plugin compares nothing")
    return False


@dataclass(frozen=True)
class _Plan:
    """What this run collects, decided once per process before collection:
    ``items`` are (suite index, kind, payload) for the shard's items, never empty;
    ``port`` is the port under test, loaded (so known to load) before any item."""

    suite: Suite
    items: tuple[tuple[int, str, Any], ...]
    entries: tuple[BaselineEntry, ...]
    port_spec: str
    port: Port
    timeout_s: float
    size: int | None = None


class _BadOption(Exception):
    """One option's bad value; the message names the option and why."""

    def __init__(self, option: str, why: object) -> None:
        super().__init__(f"{option}: {why}")


def _option_value(config: pytest.Config, option: str, parse: Callable[[str], _T]) -> _T:
    try:
        return parse(_option(config, option))
    except ValueError as exc:
        raise _BadOption(option, exc) from None


def _one_of(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


def _check_device(device: str) -> None:
    """A CUDA run on a machine without CUDA would fail every item; refuse it here."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _BadOption("--parity-device", f"cuda: torch {torch.__version__} sees no CUDA device on this machine")


def _make_plan(config: pytest.Config) -> _Plan:
    """Every check that can refuse the run, as one usage line (pytest exits 4).
    Cheap option values first, then the suite, the selection, the port, and the
    baseline against both."""
    from harness.cases.fields import CaseError
    from harness.cases.suites import load_suite
    from harness.engine import UsageError, describe_selection, prepare_device, refuse_empty
    from harness.engine.values import non_negative_int, positive_seconds
    from harness.protocol.port import PortLoadError
    from harness.sides.items import computes_tensors, selected_levels
    from harness.sides.loading import load_port

    # Torch and pandas (a baseline's reader imports both) only past the cheap
    # checks: a refused option costs a second less.
    try:
        level = _option_value(config, "--parity-level", _one_of((*LEVELS, "all")))
        device = _option_value(config, "--parity-device", _one_of(("cpu", "cuda")))
        size_text = config.getoption("--parity-size")
        size = None if size_text is None else _option_value(config, "--parity-size", non_negative_int)
        timeout_s = _option_value(config, "--parity-timeout", positive_seconds)
        shard_text = config.getoption("--parity-shard")
        shard = None if shard_text is None else _option_value(config, "--parity-shard", Shard.parse)
        _check_device(device)
        try:
            suite = load_suite(config.getoption(SUITE_OPTION), size=size)
        except CaseError as exc:
            raise _BadOption(SUITE_OPTION, exc) from None
        levels = selected_levels(level)
        items = tuple(
            (index, kind, payload)
            for index, (kind, payload) in enumerate(plan_items(suite, levels))
            if shard is None or shard.owns(index)
        )
        refuse_empty(len(items), describe_selection(suite, levels, shard))
        port_spec: str = _option(config, "--parity-port")
        # The device's recipe before the port loads: a port module that imports
        # Triton fixes its mode (TRITON_INTERPRET on a CPU) at import.
        try:
            prepare_device(device)
        except UsageError as exc:
            raise _BadOption("--parity-device", str(exc).removeprefix("--device ")) from None
        if computes_tensors(levels):
            from harness.engine import prepare_tensor_levels

            prepare_tensor_levels()
        try:
            port = load_port(port_spec, timeout_s)
        except PortLoadError as exc:
            raise _BadOption("--parity-port", exc) from None
        baseline_path = config.getoption("--parity-baseline")
        try:
            from harness.verdicts.baseline import load_baseline

            entries = tuple(load_baseline(Path(baseline_path))) if baseline_path else ()
            if entries:
                from harness.verdicts.gate import check_gate_baseline

                check_gate_baseline(list(entries), suite, port.name, port_spec)
        except CaseError as exc:
            _close(port)
            raise _BadOption("--parity-baseline", exc) from None
    except (_BadOption, UsageError) as exc:
        raise pytest.UsageError(str(exc)) from None
    return _Plan(suite, items, entries, port_spec, port, timeout_s, size)


def _close(port: Port) -> None:
    """An external port's processes end with the session that started them."""
    from harness.engine import close_port

    close_port(port)


def pytest_configure(config: pytest.Config) -> None:
    # Refuse bad usage here rather than at collection: under pytest-xdist the
    # controller never collects, so only this hook reports one line and exit 4.
    if _check_parity_mode(config):
        config._parity_plan = _make_plan(config)  # type: ignore[attr-defined]
        if not hasattr(config, "workerinput"):  # the process that sees every item's report
            config.pluginmanager.register(_SessionChecks(config._parity_plan), "parity-session-checks")  # type: ignore[attr-defined]


class _SessionChecks:
    """What only the whole session can say, in the process that sees every
    item's report (the controller under pytest-xdist): an error entry that
    expected more items than it counts fails the session, as the gate's count
    does (fewer is the gate's to say: a session may select a part of the
    suite); an external port whose prefill ran on another layout than its L1
    answer for the case fails it (harness.verdicts.summary.check_prefill_layouts); and
    it says what each L3 level compared of the port."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.expected: dict[str, int] = {}
        self.layouts: dict[tuple[str, str], str] = {}  # (kind, case) -> the port's layout digest

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == "baseline_entry" and report.when == "call":
                self.expected[str(value)] = self.expected.get(str(value), 0) + 1
            if key == "port_layout" and report.when == "call":
                kind, name, digest = str(value).split(":", 2)
                self.layouts[kind, name] = digest

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        counted = {e.where: e for e in self.plan.entries if e.items is not None}
        beyond = [(counted[w], n) for w, n in self.expected.items() if w in counted and n > (counted[w].items or 0)]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for entry, n in beyond:
            line = f"parity: beyond baseline: {n} items where {entry.where} counts {entry.items} ({entry.label})"
            if reporter is not None:
                reporter.write_line(line, red=True)
        from harness.verdicts.summary import REPLANNED, planned_over

        over = planned_over()
        replanned = [
            (kind, name)
            for (kind, name), digest in sorted(self.layouts.items())
            if kind in over and self.layouts.get((over[kind], name), digest) != digest
        ]
        for kind, name in replanned:
            line = f"parity: {self.plan.suite.name}/{name}[{kind}]: {REPLANNED}"
            if reporter is not None:
                reporter.write_line(line, red=True)
        if beyond or replanned:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from harness.protocol.port import l3_compares

        kinds = {kind for _, kind, _ in self.plan.items}
        for level, what in l3_compares(self.plan.port).items():
            if level in kinds:
                terminalreporter.write_line(f"parity: {level} compared {what}")


def pytest_unconfigure(config: pytest.Config) -> None:
    plan: _Plan | None = getattr(config, "_parity_plan", None)
    if plan is not None:
        _close(plan.port)


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    # In parity mode the items come from the suite, never from test files.
    return True if _active(config) else None


class ParityFailure(Exception):
    def __init__(self, result: CaseResult, baseline_note: str = "") -> None:
        super().__init__(result.detail())
        self.result, self.baseline_note = result, baseline_note


class _Session:
    """Per-process state: the oracle (checked once) and the plan's port."""

    def __init__(self, config: pytest.Config) -> None:
        import gc

        from harness.engine import UsageError, open_oracle, select_device, select_host
        from harness.sides.items import computes_tensors, level_of

        plan: _Plan = config._parity_plan  # type: ignore[attr-defined]
        self.device: str = _option(config, "--parity-device")
        # select_device tunes the collector for the harness's own processes; this
        # one is the user's pytest session, whose collector stays as it was.
        thresholds = gc.get_threshold()
        # A session of host work alone (layouts, workspace sizes) never loads torch.
        levels = tuple({level_of(kind) for _, kind, _ in plan.items})
        self.kernels: SharedKernels | None = None
        try:
            try:
                if computes_tensors(levels):
                    self.kernels = select_device(self.device)
                else:
                    select_host(self.device)
            finally:
                gc.set_threshold(*thresholds)
            self.oracle, self.provenance = open_oracle(
                bool(config.getoption("--parity-allow-oracle-drift")),
                cache=not config.getoption("--parity-no-oracle-cache"),
            )
        except UsageError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.port, self.timeout_s = plan.port, plan.timeout_s


class ParityItem(pytest.Item):
    def __init__(self, *, kind: str, payload: Any, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind, self.payload, self.index = kind, payload, index

    def _state(self) -> _Session:
        state: _Session | None = getattr(self.config, "_parity_session", None)
        if state is None:
            state = _Session(self.config)
            self.config._parity_session = state  # type: ignore[attr-defined]
        return state

    def runtest(self) -> None:
        from harness.verdicts.baseline import EXPECTED, judge_item, port_names
        from harness.verdicts.summary import result_row

        state = self._state()
        plan: _Plan = self.config._parity_plan  # type: ignore[attr-defined]
        # run_item makes an item at a level the port does not implement not-run.
        result = run_item(
            state.oracle, state.port, self.kind, self.payload, state.kernels, state.device, state.timeout_s
        )
        result.index = self.index
        self.user_properties.append(("status", result.status.value))  # plain text: xdist sends only builtins
        if result.port_layout is not None:
            # The session checks an external port's prefill layout against its L1 answer.
            self.user_properties.append(("port_layout", f"{result.kind}:{result.name}:{result.port_layout.digest()}"))
        if result.ok:
            return
        if not plan.entries:
            raise ParityFailure(result)
        # Judged after the run: status, size and field are known only now. The
        # port is matched by its loaded name, whatever --parity-port spelled.
        verdict = judge_item(plan.entries, port_names(state.port.name, plan.port_spec), result_row(result))
        self.user_properties.append(("baseline", verdict.note))
        if verdict.label == EXPECTED:
            if verdict.entry is not None and verdict.entry.items is not None:
                # A counted entry expects no more items than it counts (_EntryCounts checks).
                self.user_properties.append(("baseline_entry", verdict.entry.where))
            pytest.xfail(f"baseline: {verdict.note}")
        raise ParityFailure(result, verdict.note)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            from harness.verdicts.reproduce import reproduce_command

            r, note = excinfo.value.result, excinfo.value.baseline_note
            plan: _Plan = self.config._parity_plan  # type: ignore[attr-defined]
            command = reproduce_command(
                r.id,
                self.kind,
                plan.suite.name,
                plan.port_spec,
                _option(self.config, "--parity-device"),
                size=plan.size,
                timeout_s=plan.timeout_s,
                allow_oracle_drift=bool(self.config.getoption("--parity-allow-oracle-drift")),
            )
            message = f"{r.status}: {r.id}: {r.detail()}" + (f" (baseline: {note})" if note else "")
            return f"{message}\nreproduce: {command}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "parity", None, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    plan: _Plan = config._parity_plan  # type: ignore[attr-defined]
    items.clear()
    for index, kind, payload in plan.items:
        sized = "" if plan.size is None else f":size={plan.size}"
        name = f"{plan.suite.name}{sized}/{payload.name.removeprefix('workspace/')}[{kind}]"
        items.append(ParityItem.from_parent(session, name=name, nodeid=name, kind=kind, payload=payload, index=index))
