"""pytest plugin: parity items from a suite, for JUnit, ``-k`` and pytest-xdist.

``pytest --parity-suite ci --parity-port per_request`` collects one item per
(case, level), with ids such as ``ci/skew-0031[prefill]``, instead of the test
files: the harness's own unit tests are never mixed with parity items. A failing
item's message is the first-divergence text ``parity diff`` prints. With
``--parity-baseline FILE``, items the baseline expects to diverge are marked
``xfail`` (non-strict; ``parity gate`` is where stale entries fail).

Registered through the ``pytest11`` entry point, so it is active wherever the
package is installed; without ``--parity-suite`` it does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.runner import LEVELS, CaseResult, Shard, plan_items, run_item


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "MLA chunked-context parity against the pinned oracle")
    group.addoption("--parity-suite", help="collect parity items from this suite (smoke, ci, nightly)")
    group.addoption("--parity-port", default="per_request", help="port under test (name or package.module:attr)")
    group.addoption("--parity-level", default="all", choices=(*LEVELS, "all"), help="parity level(s)")
    group.addoption("--parity-size", type=int, help="generated layout cases (overrides the suite's count)")
    group.addoption("--parity-shard", metavar="K/N", help="collect only shard K of N")
    group.addoption("--parity-baseline", metavar="FILE", help="expected divergences: xfail those items")
    group.addoption("--parity-allow-oracle-drift", action="store_true", help="run despite fingerprint drift")
    group.addoption("--parity-device", default="cpu", choices=("cpu", "cuda"), help="where L2 and L3 run")


def _active(config: pytest.Config) -> bool:
    return bool(config.getoption("--parity-suite", default=None))


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    # In parity mode the items come from the suite, never from test files.
    return True if _active(config) else None


class ParityFailure(Exception):
    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.detail())
        self.result = result


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
        state = self._state()
        result = run_item(state.oracle, state.port, self.kind, self.payload, state.kernels, state.device)
        result.index = self.index
        self.user_properties.append(("status", result.status))
        if not result.ok:
            raise ParityFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ParityFailure):
            r = excinfo.value.result
            return f"{r.status}: {r.id}: {r.detail()}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "parity", None, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    from harness.baseline import find_entry, load_baseline
    from harness.cli import selected_levels
    from harness.suites import load_suite

    suite = load_suite(config.getoption("--parity-suite"), size=config.getoption("--parity-size"))
    levels = selected_levels(config.getoption("--parity-level"))
    shard_text = config.getoption("--parity-shard")
    shard = Shard.parse(shard_text) if shard_text else None
    baseline_path = config.getoption("--parity-baseline")
    entries = load_baseline(Path(baseline_path)) if baseline_path else []
    port_name = config.getoption("--parity-port")
    items.clear()
    for index, (kind, payload) in enumerate(plan_items(suite, levels)):
        if shard is not None and not shard.owns(index):
            continue
        name = f"{suite.name}/{payload.name.removeprefix('workspace/')}[{kind}]"
        item = ParityItem.from_parent(session, name=name, nodeid=name, kind=kind, payload=payload, index=index)
        level = "layout" if kind == "workspace" else kind
        family = getattr(payload, "family", "workspace-size")
        expected = find_entry(entries, port_name, level, payload.name, family)
        if expected is not None:
            item.add_marker(pytest.mark.xfail(reason=f"baseline: {expected.reason}", strict=False))
        items.append(item)
