"""A toy parity level, registered from this one module with no harness file
edited: the proof that a new level is one module plus the port's and the
oracle's answers for it (tests/test_toy_level.py runs it through every
entry point).

``chunk-count`` compares, for each layout case of a suite, how many chunks
the plan has: the port answers ``count_chunks(case)``; the oracle's answer is
the chunk count of its own layout. The ports here: :data:`PORT` (per_request
with the new method), :data:`BUG_PORT` (one chunk too many on batches of three
or more requests) and, run as a program, the same over the external protocol:

    python tests/toy_level.py [--bug]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":
    # Run as a program: the one copy of this module is the package's (a plug-in
    # module named in PARITY_PLUGINS is imported as tests.toy_level too).
    from tests.toy_level import main as run_program

    sys.exit(run_program(sys.argv[1:]))

from harness.cases.files import case_from_json
from harness.model import Case, WorkspaceConfig
from harness.model.levels import CoverageHook, KindSpec, LevelSpec, register_level
from harness.protocol.port import check_int
from harness.search.coverage_feature import Feature
from harness.sides.items import DIVERGENT, PARITY, CaseResult, both_sides
from ports.per_request import PORT as PER_REQUEST

LEVEL = KIND = "chunk-count"
OP = "chunk_count"


def _run(call: Any) -> CaseResult:
    """Both sides' chunk count of one case, typed as ints and compared exactly."""
    case: Case = call.item
    result = CaseResult(case.name, case.family, KIND, PARITY)
    answers = both_sides(
        result,
        lambda: check_int(call.oracle.plan_layout(case).num_chunks, "the oracle's chunk count"),
        lambda: check_int(call.port.count_chunks(case), "count_chunks returned"),
        call.port,
        call.timeout_s,
    )
    if answers is not None:
        result.answers = answers
        if answers[0] != answers[1]:
            from harness.compare.dense import Divergence

            result.status, result.divergence = DIVERGENT, Divergence("num_chunks", answers[0], answers[1])
    return result


def _count_over_protocol(port: Any, case: Case) -> int:
    """The ``chunk_count`` op: the case goes out, ``{"chunks": N}`` comes back."""
    chunks: int = port.request({"op": OP, "case": case.to_json()}).get("chunks")
    return chunks


def _serve_count(side: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The ``chunk_count`` op in a served side (``python -m oracle.serve``: a
    release as the oracle answers it with its own layout)."""
    return {"chunks": side.plan_layout(case_from_json(request["case"], "request")).num_chunks}


# What ``parity coverage`` measures of the toy level's items.
FEATURES = (Feature("chunk-count.most_chunks", "max", "most chunks the oracle plans for one case"),)


def _measure(tally: Any, suite: Any, oracle: Any) -> None:
    for case in suite.cases:
        tally.most("chunk-count.most_chunks", oracle.plan_layout(case).num_chunks)


TOY = register_level(
    LevelSpec(
        name=LEVEL,
        title="a toy: each case's number of chunks",
        kinds=(
            KindSpec(
                name=KIND,
                plan=lambda suite: suite.cases,
                run=_run,
                holds=lambda item: isinstance(item, Case),
                cost_s=0.003,
                row=lambda result: {"chunk_counts": list(result.answers) if result.answers else None},
                noun=lambda item: "a case",
            ),
        ),
        port_methods=("count_chunks",),
        host=True,
        floats=False,
        external={"count_chunks": _count_over_protocol},
        served={OP: _serve_count},
        # The project's targets file cannot know a plug-in's features: shown, not judged.
        coverage=CoverageHook(lambda: FEATURES, _measure, held=False),
    )
)


class ToyPort:
    """per_request, with the toy level's method; ``bug``: one chunk too many
    on a batch of three or more requests."""

    def __init__(self, bug: bool = False) -> None:
        self.bug = bug
        self.name = "toy-bug" if bug else "toy"

    def plan_layout(self, case: Case) -> Any:
        return PER_REQUEST.plan_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return PER_REQUEST.workspace_size(config)

    def count_chunks(self, case: Case) -> int:
        count: int = PER_REQUEST.plan_layout(case).num_chunks
        return count + 1 if self.bug and len(case.context_lens) >= 3 else count


PORT = ToyPort()
BUG_PORT = ToyPort(bug=True)


def serve(port: ToyPort) -> None:
    """The toy port over the external protocol (docs/external-port-protocol.md)."""
    for line in sys.stdin:
        request = json.loads(line)
        rid, op = request.get("id"), request.get("op")
        if op == "bye":
            return
        reply: dict[str, Any] = {"id": rid, "ok": True}
        if op == "hello":
            reply.update(protocol=1, name=f"cmd-{port.name}", levels=["layout", LEVEL])
        elif op == "layout":
            reply["layout"] = port.plan_layout(case_from_json(request["case"], "request")).to_json()
        elif op == "workspace_size":
            reply["workspace_size"] = port.workspace_size(WorkspaceConfig(**request["config"]))
        elif op == OP:
            reply["chunks"] = port.count_chunks(case_from_json(request["case"], "request"))
        else:
            reply = {"id": rid, "ok": False, "error": f"no op {op!r}"}
        print(json.dumps(reply), flush=True)


def main(argv: list[str]) -> int:
    serve(BUG_PORT if "--bug" in argv else PORT)
    return 0
