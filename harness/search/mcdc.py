"""Modified condition/decision coverage (MC/DC) of the planner's decisions.

A *decision* is a place where upstream chooses between outcomes from a few
*conditions* (``max_seq_len <= index_topk``, ``force_mqa``...). The suite
shows a condition matters when it holds an *independence pair*: two items
whose condition values differ in that condition and whose outcomes, as the
oracle answered them, differ too. This is the standard DO-178C asks of flight
software (level A), in its two accepted forms:

- **unique-cause**: every other condition has the same value in both items,
  or was not evaluated in one of them (short-circuited: ``None``);
- **masking**: the other conditions may differ, but in each item the
  condition is *determinant*: flipping it alone, with the others as they are,
  flips the decision's declared formula. Conditions that cannot change alone
  (coupled: ``seq_len <= 2048`` implies ``seq_len <= 4096``) can only be shown
  this way, and each says so (:attr:`Condition.coupled`).

A relational condition that a port could get wrong by one (``<`` for ``<=``,
a minimum off by one) is an *edge* condition: its pair must sit on the edge,
one item at distance 0 from it and the other one ``step`` away (see
:attr:`Observation.distances`), so the pair kills a port whose edge moved.

Invariants a reader must keep:

* Outcomes are the oracle's. Conditions are computed by the harness from the
  item and from the oracle's own answers (a decision's operand may itself be
  an earlier decision's outcome); the outcome is what the oracle decided.
* The table is checked. Every observation's outcome must equal the decision's
  declared formula on its conditions; one that does not is a *disagreement*
  (the table does not describe upstream) and fails the measurement. Where the
  oracle's outcome is itself the harness's transcription of upstream code that
  is no function of its own (:attr:`Decision.transcribed`), the check compares
  two readings of that transcription, and the report says so; the pin holds
  the transcribed code (its source is fingerprinted at every start).
* Nothing is dropped. A condition is ``unique-cause``, ``masking``,
  ``infeasible`` (no input can make it matter: the decision says why, from its
  own arithmetic) or ``unmet``. Only ``unmet`` and disagreements fail.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Values = Mapping[str, "bool | None"]


class NotEvaluated(Exception):
    """A formula read a condition that was not evaluated in this item."""


class _Reading(Mapping[str, bool]):
    """The condition values a formula reads; a ``None`` (not evaluated) raises."""

    def __init__(self, values: Values) -> None:
        self._values = values

    def __getitem__(self, name: str) -> bool:
        value = self._values[name]
        if value is None:
            raise NotEvaluated(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True)
class Condition:
    """One operand of a decision.

    ``edge``: the step of a relational condition's edge (its pair must sit at
    distance 0 and ``edge`` from it), 0 for none. ``coupled``: why it cannot
    change alone, where it cannot (its pair is then a masking pair).
    """

    name: str
    text: str
    edge: int = 0
    coupled: str = ""


@dataclass(frozen=True)
class Decision:
    """A decision of upstream's, its conditions and its declared formula.

    ``formula`` maps the conditions' values to the outcome; it reads them
    through a mapping that raises :class:`NotEvaluated` on a ``None``, so a
    short-circuited operand is never read. ``infeasible`` names the conditions
    no input can make matter, each with the reason.
    """

    id: str
    path: str  # "sparse" or "dense"
    text: str
    upstream: str
    conditions: tuple[Condition, ...]
    formula: Callable[[Mapping[str, bool]], Hashable]
    infeasible: Mapping[str, str] = field(default_factory=dict)
    # Where the oracle's outcome is its own transcription of upstream code that
    # is no function of its own (oracle/sparse.py), what it transcribes: the
    # disagreement check then compares two readings of one transcription, and
    # what holds it to upstream is the pin (that code's source is fingerprinted).
    transcribed: str = ""

    def evaluate(self, values: Values) -> Hashable:
        return self.formula(_Reading(values))


@dataclass(frozen=True)
class Observation:
    """One evaluation of a decision: the item (with the step within it, for a
    decision made several times per item), its conditions' values, each edge
    condition's distance from its edge (``None``: not measured), and the outcome
    the oracle gave."""

    item: str
    values: Mapping[str, bool | None]
    outcome: Hashable
    distances: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Pair:
    form: str  # "unique-cause" or "masking"
    items: tuple[str, str]
    values: tuple[dict[str, bool | None], dict[str, bool | None]]
    outcomes: tuple[Hashable, Hashable]


@dataclass(frozen=True)
class ConditionResult:
    decision: str
    condition: Condition
    status: str  # "unique-cause", "masking", "infeasible" or "unmet"
    pair: Pair | None = None
    reason: str = ""

    @property
    def met(self) -> bool:
        return self.status != "unmet"


@dataclass(frozen=True)
class DecisionResult:
    decision: Decision
    observations: int
    outcomes: tuple[Hashable, ...]
    conditions: tuple[ConditionResult, ...]
    disagreements: tuple[str, ...]  # the first few, each one line

    @property
    def met(self) -> bool:
        return not self.disagreements and all(c.met for c in self.conditions)


def _determinant(decision: Decision, obs: Observation, name: str) -> bool:
    """Whether flipping ``name`` alone in ``obs`` flips the declared formula."""
    value = obs.values.get(name)
    if value is None:
        return False
    try:
        before = decision.evaluate(obs.values)
        after = decision.evaluate({**obs.values, name: not value})
    except NotEvaluated:
        return False
    return before != after


def _on_edge(condition: Condition, a: Observation, b: Observation) -> bool:
    if not condition.edge:
        return True
    da, db = a.distances.get(condition.name), b.distances.get(condition.name)
    if da is None or db is None:
        return False
    return {abs(da), abs(db)} == {0, condition.edge} and abs(da - db) == condition.edge


def _unique_cause(decision: Decision, name: str, a: Observation, b: Observation) -> bool:
    for other in decision.conditions:
        if other.name == name:
            continue
        va, vb = a.values.get(other.name), b.values.get(other.name)
        if va is not None and vb is not None and va != vb:
            return False
    return True


def _signature(decision: Decision, obs: Observation) -> tuple[Any, ...]:
    """What pair search reads of an observation: values, near-edge distances, outcome."""
    near = tuple(_near(c, obs.distances.get(c.name)) for c in decision.conditions)
    return (tuple(obs.values.get(c.name) for c in decision.conditions), near, obs.outcome)


def _near(condition: Condition, distance: int | None) -> int | None:
    """An edge condition's distance where a pair could use it (within one step), else None."""
    if not condition.edge or distance is None or abs(distance) > condition.edge:
        return None
    return distance


def find_pair(
    decision: Decision, condition: Condition, observations: list[Observation], edges: bool = True
) -> Pair | None:
    """The first independence pair of ``condition`` (a unique-cause pair if any);
    ``edges=False`` accepts an edge condition's pair off its edge."""
    name = condition.name
    true = [o for o in observations if o.values.get(name) is True]
    false = [o for o in observations if o.values.get(name) is False]
    masking: Pair | None = None
    for a in true:
        determinant_a: bool | None = None
        for b in false:
            if a.outcome == b.outcome or (edges and not _on_edge(condition, a, b)):
                continue
            if _unique_cause(decision, name, a, b):
                return _pair("unique-cause", a, b)
            if masking is None:
                if determinant_a is None:
                    determinant_a = _determinant(decision, a, name)
                if determinant_a and _determinant(decision, b, name):
                    masking = _pair("masking", a, b)
    return masking


def witness_pair(decision: Decision, condition: Condition, observations: list[Observation], item: str) -> Pair | None:
    """An independence pair of ``condition`` one side of which is an observation
    of ``item`` (its id, or a step of it: ``item@...``), or None: whether the item
    that killed a mutant aimed at ``condition`` is one of the condition's witnesses
    (on or off an edge condition's edge: a dropped operand dies anywhere)."""
    distinct: dict[tuple[Any, ...], Observation] = {}
    for obs in observations:
        if _agrees(decision, obs):
            distinct.setdefault(_signature(decision, obs), obs)
    for mine in observations:
        value = mine.values.get(condition.name)
        if value is None or not (mine.item == item or mine.item.startswith(item + "@")) or not _agrees(decision, mine):
            continue
        # The only observation with its value of the condition: every pair found has it on one side.
        others = [o for o in distinct.values() if o.values.get(condition.name) is (not value)]
        pair = find_pair(decision, condition, [mine, *others], edges=False)
        if pair is not None:
            return pair
    return None


def _agrees(decision: Decision, obs: Observation) -> bool:
    try:
        return decision.evaluate(obs.values) == obs.outcome
    except NotEvaluated:
        return False


def _pair(form: str, a: Observation, b: Observation) -> Pair:
    return Pair(form, (a.item, b.item), (dict(a.values), dict(b.values)), (a.outcome, b.outcome))


def judge_decision(decision: Decision, observations: Iterable[Observation], shown: int = 3) -> DecisionResult:
    """Every condition of ``decision`` with its pair, or why it has none."""
    distinct: dict[tuple[Any, ...], Observation] = {}
    disagreements: list[str] = []
    count = 0
    outcomes: set[Hashable] = set()
    for obs in observations:
        count += 1
        outcomes.add(obs.outcome)
        try:
            declared = decision.evaluate(obs.values)
        except NotEvaluated as missing:
            declared = f"<reads {missing} not evaluated>"
        if declared != obs.outcome:
            if len(disagreements) < shown:
                disagreements.append(f"{obs.item}: the table says {declared!r}, the oracle {obs.outcome!r}")
            continue
        distinct.setdefault(_signature(decision, obs), obs)
    kept = list(distinct.values())
    results = []
    for condition in decision.conditions:
        reason = decision.infeasible.get(condition.name)
        if reason is not None:
            results.append(ConditionResult(decision.id, condition, "infeasible", reason=reason))
            continue
        pair = find_pair(decision, condition, kept)
        status = pair.form if pair else "unmet"
        results.append(ConditionResult(decision.id, condition, status, pair))
    return DecisionResult(decision, count, tuple(sorted(outcomes, key=repr)), tuple(results), tuple(disagreements))


@dataclass(frozen=True)
class McdcReport:
    """MC/DC of every declared decision on one suite."""

    suite: str
    decisions: tuple[DecisionResult, ...]

    @property
    def conditions(self) -> list[ConditionResult]:
        return [c for d in self.decisions for c in d.conditions]

    @property
    def unmet(self) -> list[ConditionResult]:
        return [c for c in self.conditions if not c.met]

    @property
    def disagreeing(self) -> list[DecisionResult]:
        return [d for d in self.decisions if d.disagreements]

    @property
    def met(self) -> bool:
        return not self.unmet and not self.disagreeing

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "conditions": len(self.conditions),
            "unmet": len(self.unmet),
            "disagreements": sum(len(d.disagreements) for d in self.decisions),
            "decisions": [
                {
                    "decision": d.decision.id,
                    "path": d.decision.path,
                    "text": d.decision.text,
                    "upstream": d.decision.upstream,
                    "transcribed": d.decision.transcribed,
                    "observations": d.observations,
                    "outcomes": [repr(o) for o in d.outcomes],
                    "disagreements": list(d.disagreements),
                    "conditions": [_condition_json(c) for c in d.conditions],
                }
                for d in self.decisions
            ],
        }


def _condition_json(result: ConditionResult) -> dict[str, Any]:
    row: dict[str, Any] = {
        "condition": result.condition.name,
        "text": result.condition.text,
        "status": result.status,
    }
    if result.condition.edge:
        row["edge_step"] = result.condition.edge
    if result.condition.coupled:
        row["coupled"] = result.condition.coupled
    if result.reason:
        row["reason"] = result.reason
    if result.pair is not None:
        row["pair"] = {
            "form": result.pair.form,
            "items": list(result.pair.items),
            "outcomes": [repr(o) for o in result.pair.outcomes],
        }
    return row
