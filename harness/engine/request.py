"""What the engine is asked to run: one frozen, typed :class:`RunRequest`.

Every entry point builds one from its own options (the command line from its
flags, the pytest plugin from ``--parity-*``, a benchmark from its arguments)
and the engine reads nothing else: no parsed command line, no module global.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S


@dataclass(frozen=True)
class RunRequest:
    """One run: what to compare, on which port and oracle, where the rows go,
    in how many processes, on which device and under which time limits.

    Invariants the engine relies on: ``cases`` (files or folders) replaces
    ``suite`` when given; ``resume`` needs ``results``; ``jobs`` None means
    decided by the work's estimate (:func:`harness.sides.job_sizing.resolve_jobs`);
    ``timeout`` bounds every port call (and the oracle's, for an oracle served
    from another environment); ``dcp_backend`` other than ``one-process`` runs
    DCP ranks as real processes on the device it names.
    """

    port: str
    suite: str = "ci"
    size: int | None = None
    cases: tuple[str, ...] | None = None
    level: str = "all"
    shard: str | None = None
    # The oracle: None is the pinned release in this process; vllm==X another one served.
    oracle: str | None = None
    allow_oracle_drift: bool = False
    oracle_cache: bool = True
    # Where the oracle cache keeps its entries: the entry point decides (the command line:
    # PARITY_ORACLE_CACHE, else the user's cache folder); None leaves that to the cache.
    oracle_cache_dir: str | None = None
    device: str = "cpu"
    dcp_backend: str = "one-process"
    jobs: int | None = None
    # Where the workers run: "local" (this machine's processes) or "ray" (actors on the
    # cluster at ray_address; None: RAY_ADDRESS, else a cluster started in this process).
    executor: str = "local"
    ray_address: str | None = None
    timeout: float = DEFAULT_PORT_TIMEOUT_S
    # Seconds the whole run may take (harness.sides.work_box): None, no limit.
    time_limit: float | None = None
    # Where each item's row goes as it finishes (JSON lines), and whether to finish that file's run.
    results: str | None = None
    resume: bool = False
