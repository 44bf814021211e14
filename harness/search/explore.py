"""``parity explore``: a property-based search for inputs on which a port and the oracle differ.

The fixed suites draw cases from named families; a bug that lives where no family
goes passes them all. Explore draws inputs from the case model's own validity rules
instead, runs each through the runner, and lets hypothesis shrink what fails.
:func:`explore` is the entry point: it splits the budget between the properties
of a level and runs their searches, in process or in a worker pool, then writes
``explore.json`` and ``summary.md``.

The parts, each its own module:

* :mod:`harness.search.explore_strategies`: the input space and the properties;
* :mod:`harness.search.explore_search`: one property's search (budget, rounds,
  the example database and its replay);
* :mod:`harness.search.explore_finds`: finishing, writing and reading back finds;
* :mod:`harness.search.explore_results`: the results, the verdict and its forms.

Invariants:

* Budget shares. ``budget_s`` is shared between the properties the port
  implements in fixed parts (:attr:`~harness.search.explore_strategies.Property.share`),
  so a long shrink in one never starves the next. One port call may take
  ``timeout_s``, and no more than :data:`MAX_CALL_S` unless the budget is longer.
* Workers. Properties are independent (each its own seed, database and budget
  share): with a worker pool (:mod:`harness.sides.pool`, ``--jobs``) they run side by
  side, each with the share of the budget it has in one process, so the search
  is the same one, finished sooner; the results are listed in property order.
  What crosses to a worker (:class:`PropertySearch`, :func:`search_property`)
  is picklable and names the port by spec and the property by name.
* Never a false clean. A level the port does not implement is a ``not-run``
  property, so the result is at best incomplete
  (:attr:`~harness.search.explore_results.ExploreResult.verdict`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port, port_levels
from harness.search.explore_results import ExploreResult, PropertyRun
from harness.search.explore_search import explore_property
from harness.search.explore_strategies import Property, properties, properties_for
from harness.sides.items import selected_levels

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.sides.pool import Executor
    from harness.sides.pool_worker import WorkerSides

# A single port call may take this long at most during a search (and never longer
# than the CLI's --timeout): one hung call must not eat a whole night's budget.
MAX_CALL_S = 60.0


def explore(
    oracle: Port,
    port: Port,
    port_spec: str,
    level: str,
    budget_s: float,
    seed: int,
    out_dir: Path,
    kernels: SharedKernels,
    device: str = "cpu",
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
    pool: Executor | None = None,
) -> ExploreResult:
    """Search each property of ``level`` (layout, merge, prefill or all) for
    ``budget_s`` seconds in all; write the finds, ``explore.json`` and
    ``summary.md`` under ``out_dir``. A level the port does not implement is a
    ``not-run`` property (the result is then at best incomplete). One port call
    may take ``timeout_s`` seconds, and no more than the search's budget allows.
    With ``pool`` the properties run in its workers (which load the port from
    ``port_spec``), side by side, each with the same share of the budget."""

    started = time.monotonic()
    result = ExploreResult(port.name, port_spec, level, seed, budget_s, str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    props = properties_for(selected_levels(level))
    implemented = port_levels(port)
    result.notes += [note for note in (p.note() for p in props) if note]
    call_limit_s = min(timeout_s, max(MAX_CALL_S, budget_s))
    # Fixed shares of the budget: a long shrink in one property never starves the next.
    shares = sum(p.share for p in props if p.level in implemented)
    searches = [
        PropertySearch(port_spec, prop.name, budget_s * prop.share / shares, seed, out_dir, call_limit_s)
        for prop in props
        if prop.level in implemented
    ]
    if pool is None:
        runs = [
            explore_property(
                oracle, port, _property(s.name), s.share_s, seed, out_dir, port_spec, kernels, device, call_limit_s
            )
            for s in searches
        ]
    else:
        from harness.sides.pool import Task

        tasks = [Task(run=search_property, payload=s, what=f"the {s.name} search") for s in searches]
        runs = list(pool.run(tasks))
    searched = iter(runs)
    for prop in props:
        if prop.level not in implemented:
            result.runs.append(PropertyRun(prop.name, 0.0, ended_by="not-run"))
        else:
            result.runs.append(next(searched))
    result.seconds = time.monotonic() - started
    (out_dir / "explore.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(result.to_markdown(), encoding="utf-8")
    return result


@dataclass(frozen=True)
class PropertySearch:
    """One property's search, as a worker takes it: the port by spec, the
    property by name, its share of the budget, the seed, the output folder."""

    port_spec: str
    name: str
    share_s: float
    seed: int
    out_dir: Path
    call_limit_s: float


def _property(name: str) -> Property:
    return next(p for p in properties() if p.name == name)


def search_property(sides: WorkerSides, search: PropertySearch) -> Iterator[PropertyRun]:
    """In a worker: one property's search (:func:`explore_property`) on its own sides."""
    yield explore_property(
        sides.oracle,
        sides.port(search.port_spec),
        _property(search.name),
        search.share_s,
        search.seed,
        search.out_dir,
        search.port_spec,
        sides.kernels,
        sides.device,
        search.call_limit_s,
    )
