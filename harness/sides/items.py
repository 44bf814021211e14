"""What one compared item is: its statuses and levels, the :class:`CaseResult`
it ends as, and the steps every level's comparison shares (both sides called
under one time limit, sizes and tensors judged, the harness's own inputs built
outside either side's error handler). The runners of each level
(:mod:`harness.sides.runner`, :mod:`harness.sides.sparse_runner`, the DCP ranks)
build on it; it imports none of them.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from harness.compare.dense import Divergence
from harness.model import Layout

# The levels and kinds (their one list), under the names the runners have always used.
from harness.model.levels import HOST_LEVELS as HOST_LEVELS
from harness.model.levels import LEVELS as LEVELS
from harness.model.levels import Kind as Kind
from harness.model.levels import Level as Level
from harness.model.levels import TextEnum, kind_spec
from harness.model.levels import level_of as level_of
from harness.protocol.port import (
    HarnessFault,
    Port,
    check_int,
    check_tensor,
)
from harness.sides.time_limits import limit_for, time_limit

if TYPE_CHECKING:
    from harness.compare.bits import TensorComparison
    from harness.kernels import SharedKernels
    from harness.model.sparse import SparseLayout


class Status(TextEnum):
    """How an item ended: the closed set every row's ``status`` is one of (a
    ``str``, so rows, JSON and tables hold the plain text)."""

    PARITY = "parity"
    DIVERGENT = "divergent"
    ORACLE_ERROR = "oracle-error"
    PORT_ERROR = "port-error"
    # An item at a level the port does not implement, or one the harness could
    # not compare: compared with nothing, so never parity. A run holding one is
    # INCOMPLETE unless ``--level`` leaves that level out.
    NOT_RUN = "not-run"


PARITY, DIVERGENT, ORACLE_ERROR, PORT_ERROR, NOT_RUN = Status


def computes_tensors(levels: Sequence[str]) -> bool:
    """Whether any of ``levels`` compares tensors (is not one of :data:`HOST_LEVELS`)."""
    return any(level not in HOST_LEVELS for level in levels)


def device_kernels(kernels: SharedKernels | None, kind: str) -> SharedKernels:
    """``kernels`` for an item of ``kind`` that runs them. None here is the
    harness's bug, never the port's: its caller selected no device for tensors."""
    if kernels is None:
        raise RuntimeError(f"a {kind} item without shared kernels: the run selected no device for its tensors")
    return kernels


@dataclass
class CaseResult:
    """The outcome of one item: a case's layout, or a workspace configuration."""

    name: str
    family: str
    # One of the registry's kinds (harness.model.levels): a Kind, or a plug-in level's text.
    kind: str
    status: Status
    oracle_layout: Layout | None = None
    port_layout: Layout | None = None
    row_budget: int = 0
    divergence: Divergence | None = None
    error: str | None = None
    oracle_workspace: int | None = None
    port_workspace: int | None = None
    tensors: list[TensorComparison] = field(default_factory=list)
    # Position in the suite's full item order (stable across shards).
    index: int = -1

    # The sparse layouts of a sparse-layout item (None for every other kind).
    oracle_sparse: SparseLayout | None = None
    port_sparse: SparseLayout | None = None
    # A plug-in level's two answers (oracle, port), for its own row (KindSpec.row).
    answers: tuple[Any, Any] | None = None

    @property
    def level(self) -> str:
        return level_of(self.kind)

    @property
    def id(self) -> str:
        return item_id(self.kind, self.name)

    def detail(self) -> str:
        """The one-line reason a failing item failed."""
        if self.error:
            return self.error
        if self.divergence:
            return self.divergence.message()
        bad = [t for t in self.tensors if not t.exact]
        return "; ".join(t.summary() for t in bad[:2]) if bad else ""

    @property
    def ok(self) -> bool:
        return self.status == PARITY

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "family": self.family, "kind": self.kind, "status": self.status}
        if self.tensors:
            out["tensors"] = [t.to_json() for t in self.tensors]
        # The columns of its kind (harness.model.levels.KindSpec.row).
        out.update(kind_spec(self.kind)[0].row(self))
        out["divergence"] = self.divergence.to_json() if self.divergence else None
        out["error"] = self.error
        return out


def selected_levels(level: str) -> tuple[str, ...]:
    """The levels ``--level`` names: one of :data:`LEVELS`, or ``all`` of them."""
    return tuple(LEVELS) if level == "all" else (level,)


def item_id(kind: str, name: str) -> str:
    """An item's id, unique in a suite: ``skew-0031[prefill]``, ``workspace/...[workspace]``."""
    return f"{name}[{kind}]"


def reraise_interrupt(exc: BaseException) -> None:
    """What a side raises is that item's error, whatever it is: an error,
    ``SystemExit`` (a port's ``sys.exit(0)`` must never end a run as a success),
    or a test framework's outcome (``pytest.skip`` inside a port must not turn
    an item into a skip). Only the user's Ctrl-C stops a run."""
    if isinstance(exc, KeyboardInterrupt | GeneratorExit):
        raise exc


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe for one line of a summary, a JSON row and JUnit's XML:
    whitespace runs folded, control characters and lone surrogates escaped."""
    text = " ".join(text.split())
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException as inner:
        reraise_interrupt(inner)
        text = "(its message cannot be printed)"
    text = printable(text)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def both_sides(
    result: CaseResult,
    ask_oracle: Callable[[], Any],
    ask_port: Callable[[], Any],
    port: Port,
    timeout_s: float,
) -> tuple[Any, Any] | None:
    """The oracle's answer, then the port's (within ``timeout_s``), each call
    also checking what it got; a side that raises marks ``result``
    ``oracle-error`` or ``port-error`` and gives None, except where the
    harness failed building what it hands the port (:class:`HarnessFault`):
    then the item is ``not-run``, never charged to the port."""
    try:
        expected = ask_oracle()
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = ORACLE_ERROR, one_line(exc)
        return None
    try:
        with time_limit(limit_for(port, timeout_s)):
            got = ask_port()
    except HarnessFault as exc:
        result.status, result.error = NOT_RUN, f"the harness could not build the inputs: {one_line(exc)}"
        return None
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = PORT_ERROR, one_line(exc)
        return None
    return expected, got


def compare_sizes(result: CaseResult, method: str, item: Any, oracle: Port, port: Port, timeout_s: float) -> CaseResult:
    """A workspace-size item: both sides' ``method(item)`` typed as ints (no
    coercion), compared exactly; a difference is field ``method``."""
    answers = both_sides(
        result,
        lambda: check_int(getattr(oracle, method)(item), f"the oracle's {method} returned"),
        lambda: check_int(getattr(port, method)(item), f"{method} returned"),
        port,
        timeout_s,
    )
    if answers is not None:
        result.oracle_workspace, result.port_workspace = answers
        if result.oracle_workspace != result.port_workspace:
            result.status = DIVERGENT
            result.divergence = Divergence(method, result.oracle_workspace, result.port_workspace)
    return result


@dataclass
class RunResult:
    """Everything one run produced, in item order."""

    suite: str
    port: str
    levels: tuple[str, ...] = field(default_factory=lambda: tuple(LEVELS))
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict)
    # What its prefill items compared of the port (harness.protocol.port.l3_compares).
    l3_compares: dict[str, str] | None = None


def tensor_verdict(
    result: CaseResult,
    oracle_out: dict[str, Any],
    port_out: dict[str, Any],
    inputs_at: Callable[[int, int, int | None], str] | None = None,
) -> CaseResult:
    """Judge the port's tensors against the oracle's. ``inputs_at(token, head,
    dim)`` says what the merge read at an element, for the message of a NaN the
    oracle does not have there (an unmapped +inf shows at once)."""
    from harness.compare.bits import compare_bits, first_new_nan

    axes = {"output": ("token", "head", "dim"), "lse": ("token", "head")}
    for name in oracle_out:
        if name not in port_out:
            result.status, result.error = PORT_ERROR, f"port returned no {name!r}"
            return result
        role = "lse" if name.endswith("lse") else "output"
        a, b = oracle_out[name], port_out[name]
        try:
            check_tensor(a, f"the oracle's {name!r}")
        except BaseException as exc:
            reraise_interrupt(exc)
            result.status, result.error = ORACLE_ERROR, one_line(exc)
            return result
        try:
            check_tensor(b, f"port's {name!r}", a.device)
            if role == "lse":  # [heads, tokens] compared token-major, so rows are tokens
                a, b = a.transpose(0, 1), b.transpose(0, 1) if b.dim() == 2 else b
            result.tensors.append(compare_bits(name, a, b, axes[role]))
        except BaseException as exc:
            reraise_interrupt(exc)
            result.status, result.error = PORT_ERROR, one_line(exc)
            return result
    shape_errors = [t for t in result.tensors if t.error]
    new_nan = [t for t in result.tensors if t.nan_port > t.nan_oracle]
    if shape_errors:
        result.status, result.error = PORT_ERROR, shape_errors[0].summary()
    elif new_nan:
        t = new_nan[0]
        result.status = PORT_ERROR
        where = first_new_nan(oracle_out[t.name], port_out[t.name], t.name, inputs_at)
        result.error = f"port returned NaN in {t.name!r} ({t.nan_port} elements, oracle {t.nan_oracle}){where}"
    elif not all(t.exact for t in result.tensors):
        result.status = DIVERGENT
        first = next(t for t in result.tensors if not t.exact)
        _note_inputs(first, inputs_at)
    return result


def _note_inputs(tensor: Any, inputs_at: Callable[[int, int, int | None], str] | None) -> None:
    """The inputs at a tensor's first differing element, beside its two values
    (``first_mismatch["inputs"]``); nothing when the level cannot say, or fails to."""
    index = (tensor.first_mismatch or {}).get("index", {})
    if inputs_at is None or "token" not in index or "head" not in index:
        return
    try:
        tensor.first_mismatch["inputs"] = inputs_at(int(index["token"]), int(index["head"]), index.get("dim"))
    except Exception as exc:
        reraise_interrupt(exc)


def token_inputs(context_lens: Sequence[int], query_lens: Sequence[int]) -> Callable[[int, int, int | None], str]:
    """What an L3 token is among a batch's inputs: its request, its row among
    that request's queries and the context it attends with."""
    starts = list(itertools.accumulate(query_lens, initial=0))

    def inputs_at(token: int, head: int, dim: int | None) -> str:
        request = bisect.bisect_right(starts, token) - 1
        return (
            f"token {token} is request {request}'s query row {token - starts[request]} of "
            f"{query_lens[request]}, context {context_lens[request]}"
        )

    return inputs_at


_Built = TypeVar("_Built")


def harness_inputs(result: CaseResult, build: Callable[[], _Built]) -> _Built | None:
    """Inputs the harness builds for a side, built outside either side's error
    handler: a fault there (a MemoryError) is the harness's, never blamed on the
    oracle or the port. The item is then not run (nothing was compared, so it
    cannot pass) and says why; None."""
    try:
        return build()
    except BaseException as exc:
        reraise_interrupt(exc)
        result.status, result.error = NOT_RUN, f"the harness could not build the inputs: {one_line(exc)}"
        return None
