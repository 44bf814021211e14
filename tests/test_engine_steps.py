"""The engine's run in three steps (harness.engine.execution: prepare, run,
tabulate): whichever step fails after the port is loaded, the port is closed,
and the oracle too once it is open; on success both are handed on, open."""

from __future__ import annotations

from typing import Any

import pytest

from harness.cases.suites import Suite
from harness.engine import RunRequest, execution
from harness.model import Case, Layout, WorkspaceConfig

CLOSED: list[str] = []


class ClosingPort:
    """per_request's planner, recording when it is closed."""

    name = "closing-port"
    levels = ("layout",)

    def plan_layout(self, case: Case) -> Layout:
        from ports.per_request import PORT as per_request

        layout: Layout = per_request.plan_layout(case)
        return layout

    def workspace_size(self, config: WorkspaceConfig) -> int:
        from ports.per_request import PORT as per_request

        size: int = per_request.workspace_size(config)
        return size

    def close(self) -> None:
        CLOSED.append(self.name)


class ClosingOracle(ClosingPort):
    name = "closing-oracle"


PORT = ClosingPort()
REQUEST = RunRequest(port="tests.test_engine_steps:PORT", suite="smoke", level="layout", jobs=1)


@pytest.fixture(autouse=True)
def closing_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.oracle_cache_fakes import pinned_provenance

    provenance = pinned_provenance()
    CLOSED.clear()
    monkeypatch.setattr(execution, "open_oracle", lambda *args, **kwargs: (ClosingOracle(), provenance))


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a step failed")


def test_a_failure_while_preparing_after_the_port_loads_closes_the_port() -> None:
    def before_run(port: Any, suite: Suite) -> None:
        assert port is PORT
        refuse()

    with pytest.raises(RuntimeError, match="a step failed"):
        execution.execute(REQUEST, before_run=before_run)
    assert CLOSED == ["closing-port"]


@pytest.mark.parametrize("failing", ["drift_banner", "run_prepared", "tabulate"])
def test_a_failure_after_the_oracle_opens_closes_the_oracle_then_the_port(
    failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drift_banner: the last thing prepare does; run_prepared and tabulate: the next two steps."""
    monkeypatch.setattr(execution, failing, refuse)
    with pytest.raises(RuntimeError, match="a step failed"):
        execution.execute(REQUEST)
    assert CLOSED == ["closing-oracle", "closing-port"]


def test_on_success_the_port_and_the_oracle_are_handed_on_open() -> None:
    done = execution.execute(REQUEST)
    assert CLOSED == [] and done.port is PORT and done.oracle.name == "closing-oracle"
    assert len(done.table) == len(done.result.results) > 50
    assert set(done.table["status"]) == {"parity"}
    # What run and gate do when they are done with it: the port, then the oracle this process opened.
    done.close()
    assert CLOSED == ["closing-port", "closing-oracle"]


def test_an_unknown_item_kind_is_the_harnesss_error_never_another_levels_comparison() -> None:
    from harness.cases.suites import load_suite
    from harness.model.levels import KINDS
    from harness.sides.runner import run_item

    case = load_suite("smoke").cases[0]
    with pytest.raises(ValueError, match="no runner for item kind 'prefil'"):
        run_item(ClosingOracle(), PORT, "prefil", case, None)
    assert set(KINDS) == {"layout", "workspace", "merge", "prefill"} | {
        f"sparse-{k}" for k in ("layout", "workspace", "mask", "prefill")
    }


def test_a_layout_comparison_that_fails_is_not_run_never_charged_to_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cases.suites import load_suite
    from harness.sides import runner

    monkeypatch.setattr(runner, "first_layout_divergence", refuse)
    result = runner.compare_case(ClosingOracle(), PORT, load_suite("smoke").cases[0])
    assert result.status == "not-run" and result.error is not None
    assert result.error.startswith("the harness could not compare the layouts:") and "a step failed" in result.error


def test_a_port_error_at_layout_still_shows_the_oracles_plan() -> None:
    """The row of a port that fails keeps the oracle's layout (its chunks and
    rows in the table, the JSON, the night's unplannable counts)."""
    from harness.cases.suites import load_suite
    from harness.sides import runner

    class Failing(ClosingPort):
        def plan_layout(self, case: Case) -> Layout:
            raise ValueError("no plan")

    case = load_suite("smoke").cases[0]
    result = runner.compare_case(ClosingOracle(), Failing(), case)
    assert result.status == "port-error" and result.error == "ValueError: no plan"
    assert result.oracle_layout == PORT.plan_layout(case) and result.port_layout is None


def test_the_closed_sets_show_as_their_text(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's "choose from" and {kind!r} print what a user types, not the enum."""
    from harness.cli import main
    from harness.sides.items import Kind, Level, Status

    assert [repr(x) for x in (Kind.SPARSE_MASK, Level.PREFILL, Status.NOT_RUN)] == [
        "'sparse-mask'",
        "'prefill'",
        "'not-run'",
    ]
    with pytest.raises(SystemExit) as exited:
        main(["run", "--suite", "smoke", "--level", "bogus"])
    assert exited.value.code == 2
    assert "(choose from 'layout', 'merge', 'prefill', 'sparse-layout'" in capsys.readouterr().err


class ClosingPool:
    """A worker pool that records when it is closed (every item runs in it, so
    this process opens no oracle: its provenance is the workers')."""

    def __init__(self, provenance: dict[str, Any]) -> None:
        self.provenance = provenance

    def oracle_provenance(self) -> dict[str, Any]:
        return self.provenance

    def close(self) -> None:
        CLOSED.append("closing-pool")


@pytest.mark.parametrize("failing", ["drift_banner", "run_prepared"])
def test_a_failure_with_a_pool_closes_the_pool_and_the_port(failing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.oracle_cache_fakes import pinned_provenance

    pool = ClosingPool(pinned_provenance())
    monkeypatch.setattr(execution, "start_pool", lambda *args: pool)
    monkeypatch.setattr(execution, failing, refuse)
    with pytest.raises(RuntimeError, match="a step failed"):
        execution.execute(RunRequest(port=REQUEST.port, suite="smoke", level="layout", jobs=2))
    # The pool is on the stack that always unwinds; the port on the one that unwinds on failure.
    assert sorted(CLOSED) == ["closing-pool", "closing-port"]


def test_ctrl_c_in_a_step_closes_the_oracle_and_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(execution, "tabulate", interrupt)
    with pytest.raises(KeyboardInterrupt):
        execution.execute(REQUEST)
    assert CLOSED == ["closing-oracle", "closing-port"]


class InterruptedPort(ClosingPort):
    """Ctrl-C arrives while its tenth layout is planned."""

    name = "interrupted-port"
    calls = 0

    def plan_layout(self, case: Case) -> Layout:
        InterruptedPort.calls += 1
        if InterruptedPort.calls == 10:
            raise KeyboardInterrupt
        return super().plan_layout(case)


INTERRUPTED = InterruptedPort()


def test_ctrl_c_while_items_run_keeps_what_finished_and_hands_the_sides_on(tmp_path: Any) -> None:
    from harness.verdicts.results_file import read_rows

    InterruptedPort.calls = 0
    results = tmp_path / "r.jsonl"
    request = RunRequest(port="tests.test_engine_steps:INTERRUPTED", suite="smoke", level="layout", jobs=1,
                         results=str(results))  # fmt: skip
    done = execution.execute(request)
    assert done.interrupted and CLOSED == []
    statuses = list(done.table["status"])
    assert statuses[:9] == ["parity"] * 9 and set(statuses[9:]) == {"not-run"}
    assert len(read_rows(results)[1]) == 9
    done.close()
    assert CLOSED == ["interrupted-port", "closing-oracle"]


def test_a_failure_after_the_dcp_ranks_start_ends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.sides import dcp_ranks

    monkeypatch.setattr(execution, "real_ranks_of", lambda request: object())
    monkeypatch.setattr(dcp_ranks, "prestart", lambda *args: None)
    monkeypatch.setattr(dcp_ranks, "close_pools", lambda: CLOSED.append("closing-rank-pools"))
    monkeypatch.setattr(execution, "tabulate", refuse)
    with pytest.raises(RuntimeError, match="a step failed"):
        execution.execute(REQUEST)
    assert CLOSED == ["closing-oracle", "closing-rank-pools", "closing-port"]
