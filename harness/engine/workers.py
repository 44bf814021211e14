"""Worker processes (:mod:`harness.sides.pool`) as a request starts them, what
each opens, and closing a port's processes when the run ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.cases.suites import Suite
from harness.engine.device import select_device, select_host
from harness.engine.errors import UsageError
from harness.engine.oracles import open_oracle
from harness.engine.request import RunRequest
from harness.protocol.port import Port
from harness.sides.items import computes_tensors, selected_levels
from harness.sides.runner import Shard

if TYPE_CHECKING:
    from harness.kernels import SharedKernels
    from harness.sides.pool import Executor, PoolError
    from harness.sides.pool_worker import WorkerSpec


def open_worker_sides(spec: WorkerSpec) -> tuple[Port, dict[str, Any], SharedKernels | None]:
    """A worker's oracle, its provenance and the device's kernels, opened as
    :func:`execute` opens them in one process (:class:`harness.sides.pool_worker.WorkerSpec`)."""
    from harness.sides.pool_worker import SidesRefused

    try:
        kernels = None
        if spec.tensors:
            kernels = select_device(spec.device)
        else:
            select_host(spec.device)
        oracle, provenance = open_oracle(spec.allow_drift, spec.oracle, not spec.no_oracle_cache, spec.oracle_cache_dir)
    except UsageError as exc:
        raise SidesRefused(str(exc)) from None
    return oracle, provenance, kernels


def worker_spec(
    request: RunRequest, ports: list[str] | tuple[str, ...] = (), timeout_s: float | None = None
) -> WorkerSpec:
    """The spec workers open their sides from, for a command's parsed ``args``
    (options it lacks take their defaults) and the ports its tasks name."""
    from harness.sides.pool_worker import WorkerSpec

    return WorkerSpec(
        open_sides=open_worker_sides,
        oracle=request.oracle,
        allow_drift=bool(request.allow_oracle_drift),
        device=request.device,
        timeout_s=timeout_s if timeout_s is not None else request.timeout,
        ports=tuple(ports),
        no_oracle_cache=not request.oracle_cache,
        oracle_cache_dir=request.oracle_cache_dir,
        tensors=computes_tensors(selected_levels(request.level)),
    )


def pool_failure(exc: PoolError, executor: str = "local") -> UsageError:
    """What the user reads when the workers cannot go on: a usage error a
    worker met opening the oracle (a drifted fingerprint, say) as the command
    words it in one process; anything else, one line naming the option that
    asked for the workers (``--jobs``, or ``--executor ray``)."""
    from harness.sides.pool import PoolStartError

    option = "--executor ray" if executor == "ray" else "--jobs"
    if isinstance(exc, PoolStartError):
        return UsageError(str(exc) if exc.usage else f"{option}: a worker could not start: {exc}")
    return UsageError(f"{option}: {exc}")


def new_pool(request: RunRequest, jobs: int, spec: WorkerSpec) -> Executor | None:
    """The run's executor over ``jobs`` workers opened from ``spec``, not yet
    started: this machine's processes (None for ``jobs`` 1: the run stays in
    this process), or with ``--executor ray`` Ray actors, always (``jobs`` None:
    one per CPU of the cluster)."""
    if request.executor == "ray":
        from harness.sides.ray_pool import RayPool

        return RayPool(request.jobs or 0, spec, request.ray_address)
    if jobs <= 1:
        return None
    from harness.sides.pool import WorkerPool

    return WorkerPool(jobs, spec)


def start_pool(
    request: RunRequest, suite: Suite | None, levels: tuple[str, ...], shard: Shard | None, port_specs: list[str]
) -> Executor | None:
    """The run's worker processes, started (not yet ready), or None for one
    process: ``--jobs`` for these items (:func:`harness.sides.job_sizing.resolve_jobs`), or
    without a ``suite`` (not loaded yet) an explicit ``--jobs`` as given."""
    from harness.sides.item_stream import planned_items
    from harness.sides.job_sizing import capped_jobs, estimated_seconds, resolve_jobs

    if suite is None:
        jobs = capped_jobs(request.jobs or 1)
    else:
        planned = planned_items(suite, levels, shard)
        estimate = estimated_seconds(k for _, k, _ in planned) * len(port_specs)
        jobs = resolve_jobs(request.jobs, estimate, len(planned))
    pool = new_pool(request, jobs, worker_spec(request, port_specs))
    if pool is not None:
        pool.start()
    return pool
