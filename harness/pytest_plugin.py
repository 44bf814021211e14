"""pytest plugin: parity items from a suite, for JUnit, ``-k`` and pytest-xdist.

``pytest --parity-suite ci --parity-port per_request`` collects one item per
(case, level), with ids such as ``ci/skew-0031[prefill]``, instead of the test
files: the harness's own unit tests are never mixed with parity items. A failing
item's message is the first-divergence text ``parity diff`` prints.

Rules (the same as ``parity gate``'s, by construction):

- A selection of zero items (a level the suite lacks, an empty shard) is a usage
  error, one line: nothing compared is never a pass.
- An item at a level the port does not implement (a port's ``levels``, e.g. an
  external ``cmd:`` port declaring only ``("layout",)``) fails as ``not-run``,
  unless ``--parity-level`` leaves that level out.
- With ``--parity-baseline FILE`` the file is checked before any item runs (bad
  input, or an entry naming a case, family or port the run cannot have, is a
  usage error), and each failing item is judged *after* it ran, by
  :func:`harness.baseline.judge_item`, the gate's own rule, matching entries by
  the loaded port's ``name`` (or the ``--parity-port`` spelling): an expected
  item is ``xfail`` with the entry's reason; one beyond its entry fails and
  says why. An oracle error is never ``xfail``. Stale entries are the gate's job.

Registered through the ``pytest11`` entry point, so it is active wherever the
package is installed; without ``--parity-suite`` it does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.runner import LEVELS, CaseResult, Shard, plan_items, run_item

if TYPE_CHECKING:
    from harness.baseline import BaselineEntry
    from harness.suites import Suite


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "MLA chunked-context parity against the pinned oracle")
    group.addoption("--parity-suite", help="collect parity items from this suite (smoke, ci, nightly)")
    group.addoption("--parity-port", default="per_request", help="port under test (name or package.module:attr)")
    group.addoption("--parity-level", default="all", choices=(*LEVELS, "all"), help="parity level(s)")
    group.addoption("--parity-size", type=int, help="generated layout cases (overrides the suite's count)")
    group.addoption("--parity-shard", metavar="K/N", help="collect only shard K of N")
    group.addoption("--parity-baseline", metavar="FILE", help="expected divergences: xfail the items they expect")
    group.addoption("--parity-allow-oracle-drift", action="store_true", help="run despite fingerprint drift")
    group.addoption("--parity-device", default="cpu", choices=("cpu", "cuda"), help="where L2 and L3 run")


def _active(config: pytest.Config) -> bool:
    return bool(config.getoption("--parity-suite", default=None))


@dataclass(frozen=True)
class _Plan:
    """What this run collects, decided once per process before collection:
    ``items`` are (suite index, kind, payload) for the shard's items, never empty."""

    suite: Suite
    items: tuple[tuple[int, str, Any], ...]
    entries: tuple[BaselineEntry, ...]
    port_spec: str


def _make_plan(config: pytest.Config) -> _Plan:
    """Every check that can refuse the run, as one usage line (pytest exits 4)."""
    from harness.baseline import load_baseline
    from harness.cases import CaseError
    from harness.cli import UsageError, describe_selection, refuse_empty, selected_levels
    from harness.suites import load_suite

    try:
        suite = load_suite(config.getoption("--parity-suite"), size=config.getoption("--parity-size"))
        levels = selected_levels(config.getoption("--parity-level"))
        shard_text = config.getoption("--parity-shard")
        try:
            shard = Shard.parse(shard_text) if shard_text else None
        except ValueError as exc:
            raise UsageError(f"--parity-shard: {exc}") from None
        items = tuple(
            (index, kind, payload)
            for index, (kind, payload) in enumerate(plan_items(suite, levels))
            if shard is None or shard.owns(index)
        )
        refuse_empty(len(items), describe_selection(suite, levels, shard))
        baseline_path = config.getoption("--parity-baseline")
        entries = tuple(load_baseline(Path(baseline_path))) if baseline_path else ()
        port_spec: str = config.getoption("--parity-port")
        if entries:
            _check_baseline(entries, suite, port_spec)
    except (CaseError, UsageError) as exc:
        raise pytest.UsageError(str(exc)) from None
    return _Plan(suite, items, entries, port_spec)


def _check_baseline(entries: tuple[BaselineEntry, ...], suite: Suite, port_spec: str) -> None:
    """The gate's check (:func:`harness.gate.check_gate_baseline`). The port's
    ``name`` is needed only when an entry names neither a known port nor the
    ``--parity-port`` spelling, so only then is the port loaded here."""
    from harness.baseline import known_port_spellings
    from harness.cli import UsageError, close_port
    from harness.gate import check_gate_baseline
    from harness.port import PortLoadError, load_port

    if all(e.port == port_spec or e.port in known_port_spellings() for e in entries):
        check_gate_baseline(list(entries), suite, port_spec, port_spec)
        return
    try:
        port = load_port(port_spec)
    except PortLoadError as exc:
        raise UsageError(str(exc)) from None
    try:
        check_gate_baseline(list(entries), suite, port.name, port_spec)
    finally:
        close_port(port)


def pytest_configure(config: pytest.Config) -> None:
    # Refuse bad usage here rather than at collection: under pytest-xdist the
    # controller never collects, so only this hook reports one line and exit 4.
    if _active(config):
        config._parity_plan = _make_plan(config)  # type: ignore[attr-defined]


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    # In parity mode the items come from the suite, never from test files.
    return True if _active(config) else None


class ParityFailure(Exception):
    def __init__(self, result: CaseResult, baseline_note: str = "") -> None:
        super().__init__(result.detail())
        self.result, self.baseline_note = result, baseline_note


class _Session:
    """Per-process state: the oracle (checked once) and the port."""

    def __init__(self, config: pytest.Config) -> None:
        from harness.cli import UsageError, open_oracle, select_device
        from harness.port import load_port

        self.device: str = config.getoption("--parity-device")
        try:
            self.kernels = select_device(self.device)
            self.oracle, self.provenance = open_oracle(config.getoption("--parity-allow-oracle-drift"))
        except UsageError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.port = load_port(config.getoption("--parity-port"))


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
        from harness.baseline import EXPECTED, judge_item, port_names
        from harness.summary import result_row

        state = self._state()
        plan: _Plan = self.config._parity_plan  # type: ignore[attr-defined]
        # run_item makes an item at a level the port does not implement not-run.
        result = run_item(state.oracle, state.port, self.kind, self.payload, state.kernels, state.device)
        result.index = self.index
        self.user_properties.append(("status", result.status))
        if result.ok:
            return
        if not plan.entries:
            raise ParityFailure(result)
        # Judged after the run: status, size and field are known only now. The
        # port is matched by its loaded name, whatever --parity-port spelled.
        verdict = judge_item(plan.entries, port_names(state.port.name, plan.port_spec), result_row(result))
        self.user_properties.append(("baseline", verdict.note))
        if verdict.label == EXPECTED:
            pytest.xfail(f"baseline: {verdict.note}")
        raise ParityFailure(result, verdict.note)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            r, note = excinfo.value.result, excinfo.value.baseline_note
            return f"{r.status}: {r.id}: {r.detail()}" + (f" (baseline: {note})" if note else "")
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "parity", None, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    plan: _Plan = config._parity_plan  # type: ignore[attr-defined]
    items.clear()
    for index, kind, payload in plan.items:
        name = f"{plan.suite.name}/{payload.name.removeprefix('workspace/')}[{kind}]"
        items.append(ParityItem.from_parent(session, name=name, nodeid=name, kind=kind, payload=payload, index=index))
