"""What several commands share: the oracle behind its fingerprint check, case
selection, the run loop with its results file, and the exit codes.

Exit codes everywhere: 0 every item at parity, 1 some item diverges or errors
(for ``coverage``: some target is missed), 2 bad input or usage (one line on
stderr naming the file, field and reason), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cases.files import load_cases
from harness.cases.suites import Suite, load_suite
from harness.kernels import SharedKernels
from harness.model import Case
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.sides.items import RunResult, reraise_interrupt, selected_levels
from harness.sides.loading import load_port
from harness.sides.runner import INTERRUPTED_WHY, LOST_WHY, Shard, unfinished_items

if TYPE_CHECKING:
    from harness.search.shrink import Progress
    from harness.sides.dcp_ranks import RealRanks
    from harness.sides.pool import PoolError, WorkerPool, WorkerSpec

EXIT_PARITY, EXIT_DIVERGENT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad input or usage; the message is the one line printed."""


# -- the oracle, behind its fingerprint check ---------------------------------------------


def open_oracle(allow_drift: bool, oracle: str | None = None, cache: bool = False) -> tuple[Port, dict[str, Any]]:
    """The oracle side and the provenance every output carries.

    ``cache``: the side answers from the oracle cache (:mod:`harness.sides.oracle_cache`:
    in memory, and on disk for a later run) whatever it has computed before for
    the same oracle; run, gate, nightly, mutants and explore ask for it unless
    ``--no-oracle-cache``.

    ``oracle`` is ``--oracle``: the pinned release in-process (None or its
    ``vllm==X``, the default), or ``vllm==X`` for any other release served from its own environment
    (:mod:`oracle.process`). Refuses (UsageError, one line naming the symbol)
    when an oracle symbol's fingerprint differs from that release's pin, or the
    release has no pin, unless ``allow_drift``.
    """
    from oracle.environment import OracleUnavailable
    from oracle.pin import load_pin

    pin = load_pin()
    release = None if oracle is None else release_of(oracle)
    if release is None or release == pin["release_version"]:
        from oracle.pin import check_fingerprints, installed_version

        try:
            from oracle.side import OracleSide

            version, commit = installed_version()
            statuses = [(s.symbol, s.status, s.expected, s.found) for s in check_fingerprints()]
            side: Port = OracleSide()
        except OracleUnavailable as exc:
            raise UsageError(str(exc)) from None
        identity = {k: pin[k] for k in ("upstream_commit", "upstream_pr", "release")}
    else:
        side, identity, version, commit, statuses = _oracle_process(release)
    bad = [s for s in statuses if s[1] != "ok"]
    if bad and not allow_drift:
        symbol, status, expected, found = bad[0]
        close_port(side)
        raise UsageError(
            f"oracle fingerprint {status}: {symbol} (pinned {expected}, installed {found or 'absent'}); "
            "pass --allow-oracle-drift to run anyway"
        )
    provenance = {
        **identity,
        "installed_vllm": version,
        "installed_commit_id": commit,
        "fingerprints": {symbol: status for symbol, status, _, _ in statuses},
        "oracle_drift_overridden": bool(bad),
    }
    if cache:
        from harness.sides.oracle_cache import with_oracle_cache

        side = with_oracle_cache(side, provenance)
    return side, provenance


def wants_oracle_cache(args: argparse.Namespace) -> bool:
    """Whether a command's ``args`` leave the oracle cache on (no ``--no-oracle-cache``)."""
    return not getattr(args, "no_oracle_cache", False)


def release_of(oracle: str) -> str:
    """``--oracle``'s release: ``vllm==X.Y.Z`` -> ``X.Y.Z`` (UsageError otherwise)."""
    from oracle.process import OracleSpecError, parse_release

    try:
        return parse_release(oracle)
    except OracleSpecError as exc:
        raise UsageError(str(exc)) from None


def _oracle_process(release: str) -> tuple[Port, dict[str, Any], str, str | None, list[tuple[str, str, str, Any]]]:
    """Another release's oracle process, its identity and its pin's statuses."""
    from oracle.environment import OracleUnavailable, prepare_environment
    from oracle.process import OracleProcessError, OracleSpecError, open_oracle_process

    try:
        # No vLLM is imported here, which would have set the device's recipe; the
        # port's kernels need it all the same.
        prepare_environment()
        side, hello = open_oracle_process(release)
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    except (OracleSpecError, OracleProcessError) as exc:
        raise UsageError(str(exc)) from None
    commit = hello.get("installed_commit_id")
    pin = hello.get("pin")
    identity = {
        "release": f"vllm=={release}",
        # A release has no upstream commit of its own beyond the one it was built from.
        "upstream_commit": (pin or {}).get("upstream_commit") or commit,
        "upstream_pr": (pin or {}).get("upstream_pr"),
        # Its own environment's versions: not this process's.
        "oracle_environment": hello.get("environment"),
    }
    if pin is None:
        statuses = [(f"oracle/pins/vllm-{release}.json", "missing", "a pin", None)]
    else:
        statuses = [(s["symbol"], s["status"], s["expected"], s["found"]) for s in hello.get("fingerprints", [])]
    return side, identity, str(hello.get("installed_vllm")), commit, statuses


def drift_banner(provenance: dict[str, Any]) -> str | None:
    """The warning every output of a run with overridden fingerprints carries."""
    if not provenance.get("oracle_drift_overridden"):
        return None
    drifted = [k for k, v in provenance["fingerprints"].items() if v != "ok"]
    return f"WARNING: oracle fingerprints overridden ({len(drifted)} drifted: {', '.join(drifted)})"


# Torch's intra-op threads in every process that compares. The shared kernels'
# float results depend on the thread count (a divergent item's ULP figures
# differ between 1 and 2 threads), so it is fixed: the same figures for any
# --jobs and any machine's core count, and N workers never oversubscribe N cores.
NUMERIC_THREADS = 1


def prepare_device(device: str) -> None:
    """Set ``device``'s recipe in this process before any port is loaded: a port
    module that imports Triton (the mutants do) fixes Triton's mode at import, and
    the oracle's interpreted kernels call Triton's library helpers, which must be
    built in the same mode."""
    from oracle.environment import OracleUnavailable, prepare_environment, use_device

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine")
    try:
        use_device(device)
    except OracleUnavailable as exc:
        raise UsageError(f"--device {device}: {exc}") from None
    prepare_environment()


def select_device(device: str) -> SharedKernels:
    """Prepare the oracle's recipe for ``device``, fix torch's threads at
    :data:`NUMERIC_THREADS` and return that device's shared kernels. Call
    before the oracle is opened (vLLM reads the recipe on import)."""
    import torch

    from harness.kernels import kernels_for
    from oracle.environment import OracleUnavailable, use_device

    torch.set_num_threads(NUMERIC_THREADS)

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine")
    try:
        use_device(device)
    except OracleUnavailable as exc:
        raise UsageError(f"--device {device}: {exc}") from None
    return kernels_for(device)


def dcp_backend_of(args: argparse.Namespace) -> str:
    """The run's ``--dcp-backend`` (one-process for a command without it)."""
    backend: str = getattr(args, "dcp_backend", "one-process")
    return backend


def dcp_settings(args: argparse.Namespace) -> dict[str, str]:
    """How the run played DCP ranks at L3, for its settings and provenance: on
    real ranks the backend and what the oracle's all-gather was; nothing for
    the default, one process, so a default run's records stay as they were
    (a results file written before the option resumes)."""
    backend = dcp_backend_of(args)
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
        if kind == "prefill" and (shard is None or shard.owns(index))
    ]
    largest = max(worlds, default=1)
    return largest if largest > 1 else 0


def real_ranks_of(args: argparse.Namespace) -> RealRanks | None:
    """``--dcp-backend`` as the runner takes it: None for one process, else how
    each rank runs (UsageError, one line, for a backend the device or the
    oracle cannot serve). A command without the option plays ranks in one process."""
    backend = dcp_backend_of(args)
    if backend == "one-process":
        return None
    from harness.sides.dcp_ranks import RealRanks
    from oracle.pin import load_pin

    wanted = {"nccl": "cuda", "gloo": "cpu"}[backend]
    if args.device != wanted:
        other = "gloo" if backend == "nccl" else "nccl"
        raise UsageError(
            f"--dcp-backend {backend} runs on --device {wanted}, not {args.device} (use --dcp-backend {other} "
            f"or one-process there)"
        )
    oracle = getattr(args, "oracle", None)
    if oracle is not None and release_of(oracle) != load_pin()["release_version"]:
        raise UsageError(
            f"--dcp-backend {backend}: real ranks run the pinned oracle only, not --oracle {oracle} "
            "(use --dcp-backend one-process)"
        )
    return RealRanks(backend, args.port)


# -- case selection ------------------------------------------------------------------------


def select_suite(args: argparse.Namespace) -> Suite:
    if args.cases:
        return Suite("cases", tuple(load_cases([Path(p) for p in args.cases])), ())
    return load_suite(args.suite, size=args.size)


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
        raise UsageError(f"{what} selects no items: nothing would be compared (choose another --level or --shard)")


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


# -- running a suite -----------------------------------------------------------------------


PROGRESS_EVERY_S = 60.0  # the longest a log without a terminal waits for a progress line
PROGRESS_QUIET_S = 5.0  # the shortest gap between two lines: a short run prints none


class ProgressLines:
    """Progress for logs without a terminal (CI): one line on stderr when a
    tenth of the items more is done, at most one per :data:`PROGRESS_QUIET_S`
    seconds and at least one per :data:`PROGRESS_EVERY_S`, so a long run shows
    it is alive without flooding the log and a short one stays quiet."""

    def __init__(self, total: int, what: str = "items", clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.what, self.clock = total, what, clock
        self.done = self.not_parity = 0
        self.started = self.last = clock()
        self.next_tenth = 1

    def advance(self, result: Any) -> None:
        self.done += 1
        if getattr(result, "status", "parity") != "parity":
            self.not_parity += 1
        now = self.clock()
        tenth = self.done * 10 // max(self.total, 1)
        quiet_for = now - self.last
        if (tenth >= self.next_tenth and quiet_for >= PROGRESS_QUIET_S) or quiet_for >= PROGRESS_EVERY_S:
            self.next_tenth = tenth + 1
            self.last = now
            percent = 100 * self.done // max(self.total, 1)
            print(
                f"parity: {self.done}/{self.total} {self.what} ({percent}%), {now - self.started:.0f} s, "
                f"{self.not_parity} not at parity",
                file=sys.stderr,
                flush=True,
            )

    def stop(self) -> None:
        pass


def progress_bar(total: int) -> tuple[Any, Any]:
    """A progress display for ``total`` items and the callback that advances it:
    a transient bar on a terminal, :class:`ProgressLines` in a log."""
    if not sys.stderr.isatty():
        lines = ProgressLines(total)
        return lines, lines.advance
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("comparing", total=total)
    bar.start()
    return bar, lambda _result: bar.advance(task)


@dataclass
class Execution:
    """What run and gate share: the table of every item (resumed ones included),
    the new results in full, and where they came from."""

    table: Any
    result: RunResult
    port: Port
    suite: Suite
    provenance: dict[str, Any]
    # Ctrl-C stopped the run: the table holds what finished, and every item that
    # did not is a ``not-run`` row, so the verdict can be no better than INCOMPLETE.
    interrupted: bool = False
    # This process's oracle, or how to open it: a run whose items all ran in
    # workers opens its own only if something asks for it (the gate's shrinking).
    opened_oracle: Port | None = None
    open_oracle_side: Callable[[], Port] | None = None

    @property
    def oracle(self) -> Port:
        if self.opened_oracle is None:
            assert self.open_oracle_side is not None
            self.opened_oracle = self.open_oracle_side()
        return self.opened_oracle


def reproduce_meta(args: argparse.Namespace, suite: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """What a run's reproduce lines are made from (:func:`harness.verdicts.reproduce.reproduce_from_meta`):
    the options that define its items and how they were compared, and how a
    pasted line starts (``launch``: the interpreter and PYTHONPATH this run used)."""
    from harness.verdicts.reproduce import program_words

    return {
        "suite": suite,
        "port_spec": args.port,
        "device": args.device,
        "size": getattr(args, "size", None),
        "cases": getattr(args, "cases", None),
        "timeout": getattr(args, "timeout", None),
        "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
        "oracle_drift_overridden": provenance["oracle_drift_overridden"],
        "launch": program_words(args.port),
    }


def harness_identity() -> dict[str, Any]:
    """The harness's version and commit, for results-file headers."""
    from importlib.metadata import PackageNotFoundError, version

    from harness.verdicts.provenance import repository_state, source_digest

    try:
        harness_version = version("mla-parity")
    except PackageNotFoundError:
        harness_version = None
    return {
        "harness_version": harness_version,
        "harness_commit": repository_state().get("commit"),
        "harness_sources": source_digest(),
    }


def execute(
    args: argparse.Namespace, before_run: Callable[[Port, Suite], None] | None = None, keep_layouts: bool = True
) -> Execution:
    """Load, check the oracle, run with progress; rows go to --results as they finish.

    ``before_run`` checks the loaded port and suite before any work (the gate's
    baseline against what the suite holds). With ``--jobs`` above 1 the items
    run in worker processes (:mod:`harness.sides.pool`), started before this process
    opens its oracle so their start-up overlaps it; the rows, the table and the
    results file are the same as in-process, in the same order.
    ``keep_layouts`` False (nothing will write the layouts' chunks: no JSON
    report) lets workers send only the figures a row needs of a matching layout."""
    import pandas as pd

    from harness.protocol.port import l3_compares
    from harness.sides.pool import PoolError, stream_items
    from harness.sides.runner import selected_item_ids
    from harness.verdicts.results_file import ResultsWriter, items_digest
    from harness.verdicts.summary import COLUMNS, apply_table_verdicts, check_prefill_layouts, result_row

    if args.resume and not args.results:
        raise UsageError("--resume needs --results FILE (the file to resume)")
    real_ranks = real_ranks_of(args)
    # An explicit --jobs N starts its workers first: their imports overlap loading the port and the suite.
    pool = start_pool(args, None, (), None, [args.port]) if (getattr(args, "jobs", None) or 1) > 1 else None
    try:
        prepare_device(args.device)
        port = load_port(args.port, args.timeout)
        suite = select_suite(args)
        levels = selected_levels(args.level)
        shard = parse_shard(args.shard)
        item_ids = selected_item_ids(suite, levels, shard)
        try:
            refuse_empty(len(item_ids), describe_selection(suite, levels, shard))
            if before_run is not None:
                before_run(port, suite)
        except Exception:
            close_port(port)
            raise
        note_unimplemented(port, levels)
        if pool is None:
            pool = start_pool(args, suite, levels, shard, [args.port])
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    try:
        kernels = select_device(args.device)
        if real_ranks is not None:
            from harness.sides.dcp_ranks import prestart

            # The rank workers import the oracle while this process opens its own.
            prestart(real_ranks, args.device, largest_dcp_world(suite, levels, shard))
        oracle: Port | None = None
        if pool is not None and real_ranks is None:
            # Every item runs in a worker: their oracle's provenance is the run's, and
            # this process does not import the oracle (seconds of CPU the workers need).
            provenance = pool.oracle_provenance()
        else:
            oracle, provenance = open_oracle(args.allow_oracle_drift, args.oracle, wants_oracle_cache(args))
            if pool is not None:
                pool.expect_provenance(provenance)
        banner = drift_banner(provenance)
        if banner:
            print(banner, file=sys.stderr)
        writer = None
        if args.results:
            header = {
                "items_digest": items_digest(item_ids),
                "items": len(item_ids),
                "suite": suite.name,
                "levels": list(levels),
                "size": args.size,
                "shard": args.shard,
                "port_spec": args.port,
                "port": port.name,
                "device": args.device,
                **dcp_settings(args),
                "pin": f"{provenance['release']} @ {provenance['upstream_commit']}",
                "oracle_drift_overridden": provenance["oracle_drift_overridden"],
                **harness_identity(),
            }
            writer = ResultsWriter(Path(args.results), header, args.resume, item_ids)
        skip = writer.done_ids if writer else frozenset()
        bar, advance = progress_bar(len(item_ids) - len(skip))
        result = RunResult(suite=suite.name, port=port.name, levels=levels)
        started = time.perf_counter()
        interrupted = False

        def record(item: Any) -> None:
            result.results.append(item)
            if writer is not None:
                writer.write(result_row(item))
            if advance is not None:
                advance(item)

        stream = stream_items(
            oracle, port, args.port, suite, levels, shard, kernels, skip, args.device, args.timeout, real_ranks,
            pool, keep_layouts,
        )  # fmt: skip
        try:
            for item in stream:
                record(item)
        except KeyboardInterrupt:
            interrupted = True
            # What workers finished beyond the last row in order is kept too.
            for item in stream.unreported():
                record(item)
            todo = len(item_ids) - len(skip)
            print(f"\nparity: interrupted after {len(result.results)} of {todo} items", file=sys.stderr)
        finally:
            stream.close()
            if bar is not None:
                bar.stop()
            if writer is not None:
                writer.close()
    except PoolError as exc:
        raise pool_failure(exc) from None
    finally:
        if pool is not None:
            pool.close()
    result.seconds = time.perf_counter() - started
    result.provenance = {**provenance, **dcp_settings(args)}
    rows = (writer.done if writer else []) + [result_row(r) for r in result.results]
    finished = skip | {r.id for r in result.results}
    if interrupted or not finished.issuperset(item_ids):
        # Every selected item has its row: one the run never compared (interrupted,
        # or lost to a harness fault) is not-run, and the verdict cannot be PASS.
        why = INTERRUPTED_WHY if interrupted else LOST_WHY
        rows += [result_row(r) for r in unfinished_items(suite, levels, shard, finished, why)]
    table = pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("index", kind="stable").reset_index(drop=True)
    table = check_prefill_layouts(table)
    apply_table_verdicts(table, result.results)
    result.l3_compares = l3_compares(port)
    return Execution(
        table, result, port, suite, provenance, interrupted, oracle,
        lambda: open_oracle(args.allow_oracle_drift, args.oracle)[0],
    )  # fmt: skip


def open_worker_sides(spec: WorkerSpec) -> tuple[Port, dict[str, Any], SharedKernels]:
    """A worker's oracle, its provenance and the device's kernels, opened as
    :func:`execute` opens them in one process (:class:`harness.sides.pool.WorkerSpec`)."""
    from harness.sides.pool import SidesRefused

    try:
        kernels = select_device(spec.device)
        oracle, provenance = open_oracle(spec.allow_drift, spec.oracle, not spec.no_oracle_cache)
    except UsageError as exc:
        raise SidesRefused(str(exc)) from None
    return oracle, provenance, kernels


def worker_spec(
    args: argparse.Namespace, ports: list[str] | tuple[str, ...] = (), timeout_s: float | None = None
) -> WorkerSpec:
    """The spec workers open their sides from, for a command's parsed ``args``
    (options it lacks take their defaults) and the ports its tasks name."""
    from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S
    from harness.sides.pool import WorkerSpec

    return WorkerSpec(
        open_sides=open_worker_sides,
        oracle=getattr(args, "oracle", None),
        allow_drift=bool(getattr(args, "allow_oracle_drift", False)),
        device=getattr(args, "device", "cpu"),
        timeout_s=timeout_s if timeout_s is not None else getattr(args, "timeout", DEFAULT_PORT_TIMEOUT_S),
        ports=tuple(ports),
        no_oracle_cache=bool(getattr(args, "no_oracle_cache", False)),
    )


def pool_failure(exc: PoolError) -> UsageError:
    """What the user reads when the workers cannot go on: a usage error a
    worker met opening the oracle (a drifted fingerprint, say) as the command
    words it in one process; anything else, one line naming ``--jobs``."""
    from harness.sides.pool import PoolStartError

    if isinstance(exc, PoolStartError):
        return UsageError(str(exc) if exc.usage else f"--jobs: a worker process could not start: {exc}")
    return UsageError(f"--jobs: {exc}")


def start_pool(
    args: argparse.Namespace, suite: Suite | None, levels: tuple[str, ...], shard: Shard | None, port_specs: list[str]
) -> WorkerPool | None:
    """The run's worker processes, started (not yet ready), or None for one
    process: ``--jobs`` for these items (:func:`harness.sides.pool.resolve_jobs`), or
    without a ``suite`` (not loaded yet) an explicit ``--jobs`` as given."""
    from harness.sides.pool import WorkerPool, capped_jobs, estimated_seconds, planned_items, resolve_jobs

    if suite is None:
        jobs = capped_jobs(getattr(args, "jobs", None) or 1)
    else:
        planned = planned_items(suite, levels, shard)
        estimate = estimated_seconds(k for _, k, _ in planned) * len(port_specs)
        jobs = resolve_jobs(getattr(args, "jobs", 1), estimate, len(planned))
    if jobs <= 1:
        return None
    pool = WorkerPool(jobs, worker_spec(args, port_specs))
    pool.start()
    return pool


def close_port(port: Port) -> None:
    """An external port's processes end with the command that used it. What
    ``close`` raises (``sys.exit`` included) is reported, never the exit code."""
    from harness.sides.items import printable

    close = getattr(port, "close", None)
    if callable(close):
        try:
            close()
        except BaseException as exc:
            reraise_interrupt(exc)
            print(f"parity: warning: port {port.name}: close() raised {printable(repr(exc))}", file=sys.stderr)


def verdict_code(verdict: str) -> int:
    """0 only for a pass; a failing or INCOMPLETE run exits 1."""
    return EXIT_PARITY if verdict == "pass" else EXIT_DIVERGENT


def write_output(write: Any, where: str) -> bool:
    """Write a report; a failure is one line on stderr, never a traceback that
    replaces the verdict's exit code (the results file already holds every row)."""
    try:
        write()
    except Exception as exc:
        print(f"parity: error: {where}: cannot write the report ({type(exc).__name__}: {exc})", file=sys.stderr)
        return False
    return True


# -- shrinking a kill ----------------------------------------------------------------------


def guarded_shrink(
    oracle: Port,
    port: Port,
    case: Case,
    out: Path,
    level: str = "layout",
    kernels: Any = None,
    deadline: float | None = None,
    progress: Progress | None = None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> str:
    """Shrinking for the gate and the kill matrix: a failure there is reported in
    the shrunk column, never raised, so the outputs and the exit code stand."""
    try:
        return shrink_to_file(oracle, port, case, level, kernels, out, deadline, progress, timeout_s)
    except BaseException as exc:
        reraise_interrupt(exc)
        return f"not shrunk ({type(exc).__name__}: {' '.join(str(exc).split())})"


def shrink_to_file(
    oracle: Port,
    port: Port,
    case: Case,
    level: str,
    kernels: Any,
    out: Path,
    deadline: float | None = None,
    progress: Progress | None = None,
    timeout_s: float = DEFAULT_PORT_TIMEOUT_S,
) -> str:
    """Shrink a kill and write it; the kill matrix and gate summary show the result.
    Each port call is limited to ``timeout_s``, and before a ``deadline`` to no
    more than the time left (at least 1 s): an in-process port by the harness's
    own limit, a port that enforces its own timeout (an external process) by
    its per-request limit. One hanging call cannot outlast the time box."""
    from harness.cases.files import write_case_file
    from harness.search.shrink import checker, describe_case, shrink

    def limit() -> float:
        return timeout_s if deadline is None else max(1.0, min(timeout_s, deadline - time.monotonic()))

    budget = 60 if level == "prefill" else 600
    check = checker(oracle, port, level, kernels, limit)
    if deadline is not None and getattr(port, "enforces_timeout", False):
        check = _within(limit, port, check)
    outcome = shrink(case, check, budget=budget, deadline=deadline, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    note = f"; cut short: {outcome.cut_short}, the smallest found so far" if outcome.cut_short else ""
    write_case_file(outcome.case, out, f"shrunk from {case.name} for {port.name}: {outcome.result.detail()}{note}")
    cut = f" [cut short: {outcome.cut_short}; the smallest found so far]" if outcome.cut_short else ""
    return f"{describe_case(outcome.case)} ({out}){cut}"


def _within(limit: Callable[[], float], port: Any, check: Callable[[Case], Any]) -> Callable[[Case], Any]:
    """``check`` with an external port's own per-request timeout cut to ``limit()``."""

    def bounded(case: Case) -> Any:
        given = port.timeout_s
        port.timeout_s = min(given, limit())
        try:
            return check(case)
        finally:
            port.timeout_s = given

    return bounded
