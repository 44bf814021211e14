"""The engine: the library every entry point runs the harness through.

A :class:`RunRequest` (frozen: what to run, on which port and oracle, where
rows go, in how many processes, on which device, under which limits) goes in;
:func:`execute` loads the port and the suite, opens the oracle behind its
fingerprint check (:func:`open_oracle`), prepares the device
(:func:`select_device`), runs the selected items in this process or in worker
processes (:func:`start_pool`) and returns the table every output is made
from. :func:`shrink_to_file` and :func:`guarded_shrink` shrink a kill within a
time box; :func:`close_port` ends a port's processes. A refusal is a
:class:`UsageError` with one line to print.

Every command of the command line (:mod:`harness.commands`) opens its oracle
and device here, and ``run`` and ``gate`` run through :func:`execute`; the
pytest plugin opens its oracle and device here and runs each item as a pytest
test (the runner's :func:`~harness.sides.runner.run_item`); the benchmarks
open the oracle here (``gpu_report``) or run a request (``worker_memory``),
and those that time one step call that step. This package imports the layers
below it (sides, verdicts, search) and never the command line, argparse, or
the reports; the contracts keep everything but the entry points off the
command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.engine.device import (
        prepare_device,
        prepare_tensor_levels,
        refuse_other_inputs,
        select_device,
        select_host,
    )
    from harness.engine.errors import UsageError
    from harness.engine.execution import Execution, execute, harness_identity, reproduce_meta
    from harness.engine.oracles import drift_banner, open_oracle, release_of
    from harness.engine.progress import ProgressLines, progress_bar
    from harness.engine.request import RunRequest
    from harness.engine.selection import (
        dcp_settings,
        describe_selection,
        largest_dcp_world,
        note_unimplemented,
        parse_shard,
        real_ranks_of,
        refuse_empty,
        select_suite,
    )
    from harness.engine.shrinking import guarded_shrink, shrink_to_file
    from harness.engine.workers import new_pool, open_worker_sides, pool_failure, start_pool, worker_spec
    from harness.sides.loading import close_port

# Each name of the API and the module that defines it, imported on first use:
# the device and the workers import torch (about a second), which an entry point
# that refuses its options first (the pytest plugin's usage errors) never needs.
_DEFINED_IN = {
    "prepare_device": "harness.engine.device",
    "select_device": "harness.engine.device",
    "select_host": "harness.engine.device",
    "UsageError": "harness.engine.errors",
    "Execution": "harness.engine.execution",
    "execute": "harness.engine.execution",
    "refuse_other_inputs": "harness.engine.device",
    "prepare_tensor_levels": "harness.engine.device",
    "harness_identity": "harness.engine.execution",
    "reproduce_meta": "harness.engine.execution",
    "drift_banner": "harness.engine.oracles",
    "open_oracle": "harness.engine.oracles",
    "release_of": "harness.engine.oracles",
    "ProgressLines": "harness.engine.progress",
    "progress_bar": "harness.engine.progress",
    "RunRequest": "harness.engine.request",
    "dcp_settings": "harness.engine.selection",
    "describe_selection": "harness.engine.selection",
    "largest_dcp_world": "harness.engine.selection",
    "note_unimplemented": "harness.engine.selection",
    "parse_shard": "harness.engine.selection",
    "real_ranks_of": "harness.engine.selection",
    "refuse_empty": "harness.engine.selection",
    "select_suite": "harness.engine.selection",
    "guarded_shrink": "harness.engine.shrinking",
    "shrink_to_file": "harness.engine.shrinking",
    "open_worker_sides": "harness.engine.workers",
    "new_pool": "harness.engine.workers",
    "pool_failure": "harness.engine.workers",
    "start_pool": "harness.engine.workers",
    "worker_spec": "harness.engine.workers",
    "close_port": "harness.sides.loading",
}


if not TYPE_CHECKING:  # mypy reads the imports above, and still refuses a name the API lacks

    def __getattr__(name: str) -> Any:
        module = _DEFINED_IN.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


__all__ = [
    "Execution",
    "ProgressLines",
    "RunRequest",
    "UsageError",
    "close_port",
    "dcp_settings",
    "describe_selection",
    "drift_banner",
    "execute",
    "guarded_shrink",
    "harness_identity",
    "largest_dcp_world",
    "new_pool",
    "note_unimplemented",
    "open_oracle",
    "open_worker_sides",
    "parse_shard",
    "pool_failure",
    "prepare_device",
    "prepare_tensor_levels",
    "progress_bar",
    "real_ranks_of",
    "refuse_empty",
    "refuse_other_inputs",
    "release_of",
    "reproduce_meta",
    "select_device",
    "select_host",
    "select_suite",
    "shrink_to_file",
    "start_pool",
    "worker_spec",
]
