"""One property's search (:func:`explore_property`): hypothesis runs, in rounds,
under a time budget, against an example database that replays earlier finds.

Each example is compared by the runner's :func:`~harness.sides.runner.run_item`
(a port fault is a ``port-error``, never a crash); a property fails on a
``divergent`` or ``port-error`` item; an input the oracle refuses is not upstream
input and is discarded (counted as refused).

Invariants:

* Budget. ``budget_s`` bounds the search (wall seconds from the property's first
  example, so hypothesis's start-up is not search time); the example under way
  when it runs out finishes, and shrinking a find may take up to as long again
  (at least :data:`MIN_SHRINK_S`); a database replay runs to its end.
  Hypothesis has no time budget of its own: the search ends by raising
  :class:`_BudgetSpent` from the property, which no hypothesis handler treats as
  a failure; the example database ignores writes from then on
  (:class:`_GuardedDatabase`), so the call that ends the search is never saved
  as a find.
* Reproducibility. Each round's generation is seeded from ``seed``, the
  property's name and the round (:func:`property_seed`); the examples tried are
  a prefix of one fixed sequence, whose length the budget decides.
* Replay. Hypothesis's example database lives under ``out_dir`` (one
  :class:`~hypothesis.database.DirectoryBasedExampleDatabase` per property). A
  run first replays what the database holds (its finds that still fail are
  reported as replayed), then searches with the rest of the budget. Hypothesis
  keys the database by the source text of the test function nested in
  :func:`_run_hypothesis`: editing that function (or its decorators) orphans
  every database written before.
* Rounds, one failure at a time. A hypothesis run ends at its first failure and
  shrinks it (it may slip to a smaller failure of another signature: status and
  where it shows, :func:`harness.search.shrink.signature`); while budget is left,
  the next round, seeded afresh, looks past the signatures reported so far, so
  one common failure does not hide the others. Failures are told apart by one
  exception class per signature (:func:`_failure_class`).
* Never a false clean. A search that compared no example (all refused, budget
  gone before the first one, hypothesis gave up) or in which hypothesis itself
  failed is not complete (:attr:`~harness.search.explore_results.PropertyRun.complete`),
  and neither is the run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import Unsatisfiable

from harness.model import Case, MergeCase, WorkspaceConfig
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.search.explore_finds import polish, write_find
from harness.search.explore_results import DATABASE_DIR, PropertyRun
from harness.search.explore_strategies import Property
from harness.search.shrink import signature
from harness.sides.items import NOT_RUN, ORACLE_ERROR, PARITY, CaseResult, printable, reraise_interrupt
from harness.sides.runner import run_item

if TYPE_CHECKING:
    from harness.kernels import SharedKernels

# Shrinking a find may run this long past the search budget at least.
MIN_SHRINK_S = 20.0
MAX_REFUSALS_KEPT = 5


class _BudgetSpent(BaseException):
    """Raised from a property when its time is up. A BaseException, so that no
    hypothesis handler takes it for a test failure; it ends the run where it is."""


class _PropertyFailed(Exception):
    """A failing example: the item and its comparison. Subclassed once per failure
    signature (:func:`_failure_class`), so that hypothesis's report and database
    tell the kinds of failure apart."""

    def __init__(self, item: Any, result: CaseResult) -> None:
        super().__init__(f"{result.status}: {result.detail()}")
        self.item = item
        self.result = result


_FAILURE_CLASSES: dict[tuple[str, str], type[_PropertyFailed]] = {}


def _failure_class(key: tuple[str, str]) -> type[_PropertyFailed]:
    if key not in _FAILURE_CLASSES:
        _FAILURE_CLASSES[key] = type(f"PropertyFailed_{len(_FAILURE_CLASSES)}", (_PropertyFailed,), {})
    return _FAILURE_CLASSES[key]


class _GuardedDatabase(ExampleDatabase):
    """A directory database that stops taking writes once the search is over:
    hypothesis saves the input of any call that raises, and the call that ends a
    search on time (:class:`_BudgetSpent`) is no find."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.inner = DirectoryBasedExampleDatabase(path)
        self.sealed = False

    def save(self, key: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if not self.sealed:
            self.inner.move(src, dest, value)


def property_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:explore:{name}".encode()).digest()[:8], "big")


def item_size(item: Any) -> tuple[int, ...]:
    """Smaller is simpler: requests, then rows, then everything else."""
    if isinstance(item, Case):
        return (
            item.num_requests,
            sum(item.context_lens),
            sum(item.query_lens),
            item.workspace_size,
            item.block_size,
            item.dcp_world_size,
        )
    if isinstance(item, MergeCase):
        return (item.num_tokens, item.num_heads, item.head_size)
    if isinstance(item, WorkspaceConfig):
        return (item.max_model_len, item.max_num_seqs, item.block_size, item.dcp_world_size)
    return ()


@dataclass
class _Search:
    """What one property's test function shares with the code that drives it."""

    oracle: Port
    port: Port
    prop: Property
    kernels: SharedKernels | None
    device: str
    database: _GuardedDatabase
    seed: int
    budget_s: float
    # The limit on one port call (the harness's --timeout, no more than the search allows).
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S
    # Set at the property's first example, so hypothesis's own start-up is not
    # search time: the search ends at the first example past search_deadline; a
    # shrink in progress then, at the first past hard_deadline.
    search_deadline: float | None = None
    hard_deadline: float | None = None
    # A replay of the database runs to its end, whatever the budget.
    replaying: bool = False
    run: PropertyRun = field(default_factory=lambda: PropertyRun("", 0.0))
    # The smallest failing item per signature in this hypothesis run, for a
    # shrink that runs out of time.
    smallest: dict[tuple[str, str], tuple[Any, CaseResult]] = field(default_factory=dict)
    # Signatures an earlier run of this search reported: a later run looks past
    # them for failures of other kinds.
    known: set[tuple[str, str]] = field(default_factory=set)

    def time_left(self) -> bool:
        return self.search_deadline is None or time.monotonic() < self.search_deadline

    def check(self, item: Any) -> None:
        now = time.monotonic()
        if self.search_deadline is None or self.hard_deadline is None:
            self.search_deadline = now + self.budget_s
            self.hard_deadline = self.search_deadline + max(self.budget_s, MIN_SHRINK_S)
        # Once this run has a failure, hypothesis gets until the hard deadline to shrink it.
        searching = not self.smallest and not self.replaying
        if (searching and now >= self.search_deadline) or now >= self.hard_deadline:
            self.database.sealed = True
            raise _BudgetSpent
        result = run_item(self.oracle, self.port, self.prop.kind, item, self.kernels, self.device, self.timeout_s)
        if result.status == ORACLE_ERROR:
            # Not an input upstream takes: neither a find nor an example.
            self.run.refused += 1
            message = printable(result.error or "")[:200]
            if len(self.run.refusals) < MAX_REFUSALS_KEPT and message not in self.run.refusals:
                self.run.refusals.append(message)
            reject()
        self.run.examples += 1
        if result.status == PARITY:
            return
        if result.status == NOT_RUN:  # checked before the search: the port lacks the level
            raise RuntimeError(result.error or "not-run")
        key = signature(result)
        if key in self.known:
            return
        if self.run.examples_before_find is None:
            self.run.examples_before_find = self.run.examples
            self.run.seconds_to_find = round(now - (self.search_deadline - self.budget_s), 3)
        known = self.smallest.get(key)
        if known is None or item_size(item) < item_size(known[0]):
            self.smallest[key] = (item, result)
        raise _failure_class(key)(item, result)


def _hypothesis_settings(database: ExampleDatabase, phases: tuple[Phase, ...]) -> settings:
    """A search stops generating at its first failure; a replay of the database
    (no generation) reports every entry that still fails."""
    return settings(
        database=database,
        phases=phases,
        # The budget ends the search, never the count.
        max_examples=10**9,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=Phase.generate not in phases,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def _failures_in(error: BaseException) -> list[_PropertyFailed]:
    if isinstance(error, _PropertyFailed):
        return [error]
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _failures_in(e)]
    return []


def _run_hypothesis(
    search: _Search, phases: tuple[Phase, ...], round_number: int
) -> tuple[list[_PropertyFailed], bool]:
    """One hypothesis run; its failures (minimal ones, as hypothesis reports them)
    and whether they are flaky. ``search.run.ended_by`` says why it stopped."""
    from hypothesis.errors import FlakyFailure

    # @seed alone turns the database off; settings applied over it turn it back on.
    @_hypothesis_settings(search.database, phases)
    @hypothesis_seed(property_seed(search.seed, f"{search.prop.name}:{round_number}"))
    @given(search.prop.strategy())
    def prop(item: Any) -> None:
        search.check(item)

    try:
        prop()
    except _BudgetSpent:
        search.run.ended_by = "budget"
        return [], False
    except Unsatisfiable:
        search.run.ended_by = "gave-up"
        search.run.error = "hypothesis found no input the oracle accepts"
        return [], False
    except BaseException as exc:
        reraise_interrupt(exc)
        failures = _failures_in(exc)
        if failures:
            return failures, isinstance(exc, FlakyFailure)
        search.run.ended_by = "error"
        search.run.error = printable(f"{type(exc).__name__}: {exc}")[:300]
        return [], False
    search.run.ended_by = "exhausted"
    return [], False


def explore_property(
    oracle: Port,
    port: Port,
    prop: Property,
    budget_s: float,
    seed: int,
    out_dir: Path,
    port_spec: str,
    kernels: SharedKernels | None,
    device: str,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> PropertyRun:
    """Replay the property's database, then search in rounds until ``budget_s``
    is spent: each round is one hypothesis run that ends on the budget or with
    shrunk finds; the next round, seeded afresh, looks past the kinds of failure
    found so far."""
    started = time.monotonic()
    run = PropertyRun(prop.name, round(budget_s, 3))
    database = _GuardedDatabase(out_dir / DATABASE_DIR / prop.name)
    search = _Search(oracle, port, prop, kernels, device, database, seed, budget_s, timeout_s, run=run)

    def record(failures: list[_PropertyFailed], flaky: bool, replayed: bool) -> bool:
        cut_short = not failures and bool(search.smallest)
        if cut_short:
            # Shrinking ran out of time: the smallest failing input seen of each kind.
            failures = [_failure_class(key)(item, result) for key, (item, result) in search.smallest.items()]
        for failure in failures:
            key = signature(failure.result)
            if key not in search.known:
                search.known.add(key)
                item, result, steps = polish(oracle, port, failure.item, failure.result, timeout_s)
                find = write_find(item, result, prop, out_dir, port_spec, replayed, flaky, cut_short)
                find.polish_steps = steps
                run.finds.append(find)
        search.smallest.clear()
        return bool(failures)

    # The database first: its finds that still fail are reported before any new search.
    if any(path.is_file() for path in database.inner.path.rglob("*")):
        search.replaying = True
        record(*_run_hypothesis(search, (Phase.reuse, Phase.shrink), 0), replayed=True)
        search.replaying = False
    found = True
    while found and search.time_left():
        run.rounds += 1
        database.sealed = False
        # Ends on the budget, exhausted inputs or an error (ended_by says which), or with finds.
        found = record(*_run_hypothesis(search, (Phase.generate, Phase.shrink), run.rounds), replayed=False)
    if found:
        run.ended_by = "budget"  # the deadline passed while a round was shrinking, or before any round
    run.seconds = round(time.monotonic() - started, 3)
    return run
