"""What the commands share on top of the engine (:mod:`harness.engine`): the
request a command's parsed options make, and the exit codes.

Exit codes everywhere: 0 every item at parity, 1 some item diverges or errors
(for ``coverage``: some target is missed), 2 bad input or usage (one line on
stderr naming the file, field and reason), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.engine import RunRequest, open_oracle
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.sides.oracle_cache_store import default_cache_directory

EXIT_PARITY, EXIT_DIVERGENT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def run_request(args: argparse.Namespace) -> RunRequest:
    """The engine's request for a command's parsed ``args``; an option the
    command lacks takes the request's default."""
    cases = getattr(args, "cases", None)
    return RunRequest(
        # A command over several ports (nightly, mutants) names each task's port itself.
        port=getattr(args, "port", None) or "per_request",
        suite=getattr(args, "suite", None) or "ci",
        size=getattr(args, "size", None),
        cases=tuple(cases) if cases else None,
        level=getattr(args, "level", "all"),
        shard=getattr(args, "shard", None),
        oracle=getattr(args, "oracle", None),
        allow_oracle_drift=bool(getattr(args, "allow_oracle_drift", False)),
        oracle_cache=wants_oracle_cache(args),
        oracle_cache_dir=oracle_cache_dir(),
        device=getattr(args, "device", "cpu"),
        dcp_backend=dcp_backend_of(args),
        jobs=getattr(args, "jobs", None),
        executor=getattr(args, "executor", "local"),
        ray_address=getattr(args, "ray_address", None),
        timeout=getattr(args, "timeout", DEFAULT_PORT_TIMEOUT_S),
        time_limit=getattr(args, "time_limit", None),
        results=getattr(args, "results", None),
        resume=bool(getattr(args, "resume", False)),
    )


def wants_oracle_cache(args: argparse.Namespace) -> bool:
    """Whether a command's ``args`` leave the oracle cache on (no ``--no-oracle-cache``)."""
    return not getattr(args, "no_oracle_cache", False)


def dcp_backend_of(args: argparse.Namespace) -> str:
    """The run's ``--dcp-backend`` (one-process for a command without it)."""
    backend: str = getattr(args, "dcp_backend", "one-process")
    return backend


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


def oracle_cache_dir() -> str:
    """The oracle cache's folder for this command: ``PARITY_ORACLE_CACHE``, else
    the user's cache folder (:func:`harness.sides.oracle_cache_store.default_cache_directory`)."""
    return str(default_cache_directory())


def open_command_oracle(args: argparse.Namespace) -> tuple[Port, dict[str, Any]]:
    """The oracle as a command's options ask for it (:func:`harness.engine.open_oracle`):
    ``--oracle``, ``--allow-oracle-drift``, ``--no-oracle-cache`` and the cache's folder."""
    return open_oracle(args.allow_oracle_drift, args.oracle, wants_oracle_cache(args), oracle_cache_dir())
