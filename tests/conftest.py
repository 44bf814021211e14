from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.model import Case
from harness.protocol.port import Port
from harness.sides.loading import load_port


@pytest.fixture(scope="session")
def cpp_port(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ reference port, built by ``make cpp-port`` (the one build line) with -Werror added."""
    assert shutil.which("g++") and shutil.which("make"), "g++ and make are needed to build the C++ reference port"
    binary = tmp_path_factory.mktemp("cpp") / "cpp-port"
    root = Path(__file__).resolve().parent.parent
    build = ["make", "-s", "-C", str(root), "cpp-port", f"CPP_PORT={binary}", "CPP_PORT_EXTRA_FLAGS=-Werror"]
    subprocess.run(build, check=True)
    return binary


@pytest.fixture(scope="session")
def oracle() -> Port:
    from oracle.side import OracleSide

    return OracleSide()


@pytest.fixture(scope="session")
def cached_oracle() -> Port:
    """The pinned oracle behind the oracle cache (this session's folder, shared by
    the xdist workers): tests split so xdist balances them ask it the same items."""
    from harness.engine import open_oracle

    return open_oracle(allow_drift=False, cache=True)[0]


@pytest.fixture(scope="session")
def legacy_oracle() -> Iterator[Port]:
    """vllm==0.27.1 served from its environment (oracle.process), started once a
    worker (each start imports that vLLM: seconds) and closed at the end."""
    from oracle.process import open_oracle_process

    served, _ = open_oracle_process("0.27.1")
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="session")
def per_request() -> Port:
    return load_port("per_request")


@pytest.fixture(scope="session")
def equal_share() -> Port:
    return load_port("equal_share")


def make_case(context_lens: list[int], query_lens: list[int] | None = None, **kwargs: object) -> Case:
    fields: dict[str, object] = {"block_size": 16, "workspace_size": 2048, "name": "t"}
    fields.update(kwargs)
    return Case(
        context_lens=tuple(context_lens),
        query_lens=tuple(query_lens or [5] * len(context_lens)),
        **fields,  # type: ignore[arg-type]
    )


# PARITY_TEST_DEVICE=cuda (on a GPU machine, for tests/test_gpu.py) keeps CUDA
# visible and Triton compiled; otherwise every test runs on the CPU recipe.
TEST_DEVICE = os.environ.get("PARITY_TEST_DEVICE", "cpu")


# An xdist worker runs on one core of its own, and so does everything it starts:
# a run that picks its own worker count (``--jobs`` not given) sees one core and
# runs in process, as on a one-core machine, instead of two workers' processes
# competing with the other test worker. Results are the same for any --jobs
# (tests/test_jobs.py); tests marked ``all_cores`` get the machine's cores back.
ALL_CORES: set[int] = set()
OWN_CORES: set[int] = set()


def _pin_xdist_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return
    ALL_CORES.update(cores)
    OWN_CORES.add(cores[int(worker[2:]) % len(cores)])
    os.sched_setaffinity(0, OWN_CORES)


@pytest.fixture(autouse=True)
def _cores_of_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    if not (OWN_CORES and request.node.get_closest_marker("all_cores")):
        yield
        return
    os.sched_setaffinity(0, ALL_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, OWN_CORES)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "all_cores: the test runs with every core of the machine (--jobs tests)")
    _pin_xdist_worker()
    # The tests' oracle cache is a folder of this session's (inherited by the CLI
    # runs and xdist workers it starts), never the user's.
    if "PARITY_ORACLE_CACHE" not in os.environ:
        os.environ["PARITY_ORACLE_CACHE"] = tempfile.mkdtemp(prefix="parity-test-oracle-cache-")
    # Printed lines name a port's checkout $PORT_DIR on a CI runner (harness/verdicts/launch.py):
    # the tests paste lines into fresh shells, the same on CI as here; the test of CI's lines sets CI itself.
    os.environ.pop("CI", None)
    # The recipe (TRITON_INTERPRET among it) before anything imports Triton or vLLM.
    from oracle.environment import prepare_cpu_environment, use_device

    if TEST_DEVICE == "cuda":
        use_device("cuda")
    else:
        prepare_cpu_environment()
    import torch

    # One intra-op thread, as every comparing process of the harness (select_device)
    # and the served oracle run: a test's in-process reference then has their bits
    # whatever ran before it in this worker.
    torch.set_num_threads(1)
    # And the collector's thresholds, as select_device sets them in the harness's own comparing processes.
    import gc

    from harness.engine.device import GC_THRESHOLDS

    gc.set_threshold(*GC_THRESHOLDS)


# The longest tests (pytest --durations, docs/figures.md) start first, so that
# pytest-xdist's workers end together instead of one waiting on a long tail.
LONGEST_FIRST = (
    "tests/test_external.py::test_cpp_port_is_at_parity_at_every_level_on_ci",
    "tests/test_reproduce_shell.py",
    "tests/test_mutants.py::test_ci_kills_every_mutant",
    "tests/test_determinism.py::test_sigkill_leaves_readable_rows_and_resume_finishes",
    "tests/test_nightly.py::test_report_and_history",
    "tests/test_determinism.py::test_byte_identical_results_across_runs_and_hash_seeds",
    "tests/test_readme_commands.py::test_make_gate_installs_the_console_script_and_runs_the_ci_gate",
    "tests/test_mutant_reach.py::test_the_reach_pass_changes_no_kill",
    "tests/test_own_port_recipe.py::test_the_recipe_runs_as_written",
    "tests/test_report_browser.py",
    "tests/test_sparse_prefill.py::test_equal_share_sparse_l3_matches_0_27_1",
    "tests/test_bounded_work.py",
    "tests/test_nightly.py::test_interrupted_run_leaves_incomplete_report",
    "tests/test_jobs.py::test_gate_writes_the_same_outputs_for_any_jobs",
    "tests/test_jobs.py::test_run_writes_the_same_results_and_json_for_any_jobs",
    "tests/test_mutants.py::test_smoke_kills_every_mutant_but_the_wide_ones",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)
