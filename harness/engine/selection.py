"""What a request selects: its suite (or case files), shard, levels and DCP
ranks, each refused in one line when it would compare nothing or cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.cases.files import load_run_files
from harness.cases.suites import Suite, load_suite
from harness.engine.errors import UsageError
from harness.engine.oracles import release_of
from harness.engine.request import RunRequest
from harness.model.levels import kind_spec
from harness.protocol.port import Port
from harness.sides.runner import Shard

if TYPE_CHECKING:
    from harness.sides.dcp_ranks import RealRanks


def dcp_settings(request: RunRequest) -> dict[str, str]:
    """How the run played DCP ranks at L3, for its settings and provenance: on
    real ranks the backend and what the oracle's all-gather was; nothing for
    the default, one process, so a default run's records stay as they were
    (a results file written before the option resumes)."""
    backend = request.dcp_backend
    if backend == "one-process":
        return {}
    from harness.sides.dcp_ranks import ORACLE_KV_GATHER

    return {"dcp_backend": backend, "dcp_oracle_kv_gather": ORACLE_KV_GATHER}


def largest_dcp_world(suite: Suite, levels: tuple[str, ...], shard: Shard | None) -> int:
    """The most DCP ranks any prefill item of this shard runs on (0: none is DCP)."""
    from harness.sides.runner import plan_items

    worlds = [
        item.dcp_world_size
        for index, (kind, item) in enumerate(plan_items(suite, levels))
        if kind_spec(kind)[0].real_ranks and (shard is None or shard.owns(index))
    ]
    largest = max(worlds, default=1)
    return largest if largest > 1 else 0


def real_ranks_of(request: RunRequest) -> RealRanks | None:
    """``--dcp-backend`` as the runner takes it: None for one process, else how
    each rank runs (UsageError, one line, for a backend the device or the
    oracle cannot serve). A command without the option plays ranks in one process."""
    backend = request.dcp_backend
    if backend == "one-process":
        return None
    from harness.sides.dcp_ranks import RealRanks
    from oracle.pin import load_pin

    wanted = {"nccl": "cuda", "gloo": "cpu"}[backend]
    if request.device != wanted:
        other = "gloo" if backend == "nccl" else "nccl"
        raise UsageError(
            f"--dcp-backend {backend} runs on --device {wanted}, not {request.device} (use --dcp-backend {other} "
            f"or one-process there)"
        )
    oracle = request.oracle
    if oracle is not None and release_of(oracle) != load_pin()["release_version"]:
        raise UsageError(
            f"--dcp-backend {backend}: real ranks run the pinned oracle only, not --oracle {oracle} "
            "(use --dcp-backend one-process)"
        )
    return RealRanks(backend, request.port)


def select_suite(request: RunRequest) -> Suite:
    """The request's suite, or a suite named ``cases`` of its ``--cases`` files,
    each read by its kind (:func:`harness.cases.files.load_run_files`): layout
    and prefill cases, sparse batches (sparse L3 cases those with a numeric
    section), sparse workspace configurations and top-k mask cases."""
    if request.cases:
        held = load_run_files([Path(p) for p in request.cases])
        return Suite(
            "cases",
            held.cases,
            (),
            sparse_cases=held.sparse_cases,
            sparse_workspace_configs=held.sparse_workspace_configs,
            mask_cases=held.mask_cases,
        )
    return load_suite(request.suite, size=request.size)


def parse_shard(text: str | None) -> Shard | None:
    if text is None:
        return None
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise UsageError(f"--shard: {exc}") from None


def refuse_empty(selected: int, what: str) -> None:
    """Zero selected items compare nothing: that is usage, never a pass."""
    if selected == 0:
        raise UsageError(
            f"{what} selects no items: nothing would be compared (choose another --level, --shard or --size)"
        )


def describe_selection(suite: Suite, levels: tuple[str, ...], shard: Shard | None) -> str:
    where = f" shard {shard}" if shard else ""
    return f"suite {suite.name} at level {', '.join(levels)}{where}"


def note_unimplemented(port: Port, levels: tuple[str, ...]) -> None:
    from harness.protocol.port import port_levels

    missing = [lv for lv in levels if lv not in port_levels(port)]
    if missing:
        print(
            f"note: port {port.name} implements {', '.join(port_levels(port))}; its items at "
            f"{', '.join(missing)} are not-run and the verdict is at best INCOMPLETE "
            f"(narrow the run with --level)"
        )
