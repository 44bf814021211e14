"""``--jobs N``: the same bytes for any N, Ctrl-C and the port timeout in workers.

Every CLI run compared here is a subprocess with the oracle cache off: each
run's oracle and workers are its own, so nothing one run computed can stand in
for the other's. The ports below record the pid of every process that plans a
layout (in the file ``$PARITY_TEST_PID_FILE``), so a test can tell that
``--jobs 2`` really compared in worker processes and ``--jobs 1`` in the CLI's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.cli import main
from harness.kernels import SharedKernels
from harness.model import Case, Layout
from harness.protocol.port import Port
from harness.sides.pool import PoolStartError, Task, WorkerPool
from harness.sides.pool_worker import WorkerSides, WorkerSpec
from tests.fault_ports import HangingPort, RaisingPort, SlowPort
from tests.test_cli_interfaces import as_from_a_terminal, signal_state

# They pass --jobs or read the machine's cores: every core, not one xdist worker's (conftest).
pytestmark = pytest.mark.all_cores

ROOT = Path(__file__).resolve().parent.parent
PID_FILE = "PARITY_TEST_PID_FILE"
# A third of the smoke suite: layout cases (a DCP one among them), workspace
# configs, merge and prefill cases; RecordingPort fails some layouts.
# An eighth of smoke that holds every kind of item and a DCP prefill (the tests
# below assert both). The run's pair asks the oracle afresh (--no-oracle-cache), so
# the pool's workers run the oracle themselves; the other pairs read the session's cache.
MIXED = ["--suite", "smoke", "--shard", "4/8"]


def _record_pid() -> None:
    path = os.environ.get(PID_FILE)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")


class RecordingPort(RaisingPort):
    """RaisingPort (a port-error on every case with an odd context total), recording its pid."""

    name = "recording"

    def plan_layout(self, case: Case) -> Layout:
        _record_pid()
        return super().plan_layout(case)


class MisbehavingPort(HangingPort):
    """Hangs on giant-middle (HangingPort), kills its process on exact-plus-one."""

    name = "misbehaving"

    def plan_layout(self, case: Case) -> Layout:
        _record_pid()
        if case.name.endswith("exact-plus-one"):
            os._exit(3)
        return super().plan_layout(case)


class RecordingSlowPort(SlowPort):
    name = "recording-slow"

    def plan_layout(self, case: Case) -> Layout:
        _record_pid()
        return super().plan_layout(case)


def parity(*argv: str, pids: Path | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI; its outcome and its pid."""
    return side_by_side([list(argv)], [pids])[0]


def side_by_side(argvs: list[list[str]], pids: list[Path | None]) -> list[tuple[subprocess.CompletedProcess[str], int]]:
    """Run CLI commands at the same time (a pair to compare takes the wall
    time of one); each one's outcome and pid, in order."""
    started = []
    for argv, pid_file in zip(argvs, pids, strict=True):
        env = {**os.environ, PID_FILE: str(pid_file) if pid_file else ""}
        command = [sys.executable, "-m", "harness", *argv]
        popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append((command, popen))
    done = []
    for command, popen in started:
        out, err = popen.communicate(timeout=600)
        done.append((subprocess.CompletedProcess(command, popen.returncode, out, err), popen.pid))
    return done


def recorded(pids: Path) -> set[int]:
    return {int(line) for line in pids.read_text(encoding="utf-8").split()}


def jobs_pair(
    tmp_path: Path, argv: list[str], outputs: list[str], recording: bool = True, afresh: bool = False
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """``parity ARGV --jobs 1`` and ``--jobs 2``, each writing the files
    ``outputs`` names under its own folder (``{out}`` in ARGV); each run's
    files, the folder's path in them written ``{out}``. Checked on the way for
    a ``recording`` port: ``--jobs 1`` compares in the CLI's own process,
    ``--jobs 2`` never does. ``afresh``: each run asks the oracle itself
    (``--no-oracle-cache``), in its workers too."""
    for attempt in range(2):
        folders = [tmp_path / f"attempt{attempt}-jobs{jobs}" for jobs in (1, 2)]
        argvs = []
        for jobs, folder in zip((1, 2), folders, strict=True):
            folder.mkdir()
            cache = ["--no-oracle-cache"] if afresh else []
            argvs.append([a.replace("{out}", str(folder)) for a in argv] + ["--jobs", str(jobs), *cache])
        runs = side_by_side(argvs, [folder / "pids" for folder in folders])
        files = []
        for (proc, cli), folder, jobs in zip(runs, folders, (1, 2), strict=True):
            assert proc.returncode in (0, 1), proc.stderr[-3000:]
            if recording:
                planners = recorded(folder / "pids")
                assert planners == {cli} if jobs == 1 else (planners and cli not in planners), (jobs, planners, cli)
            path = str(folder).encode()
            files.append({name: (folder / name).read_bytes().replace(path, b"{out}") for name in outputs})
        # A helper editing the tree while they ran changes the source digest they record: run them again.
        if _sources(files[0]) == _sources(files[1]) or attempt:
            break
    return files[0], files[1]


def _sources(files: dict[str, bytes]) -> list[str]:
    text = b"".join(files.values()).decode("utf-8", "replace")
    return [part.split('"', 1)[0] for part in text.split('"harness_sources": "')[1:]]


def test_run_writes_the_same_results_and_json_for_any_jobs(tmp_path: Path) -> None:
    argv = ["run", *MIXED, "--port", "tests.test_jobs:RecordingPort", "--results", "{out}/rows.jsonl",
            "--json", "{out}/doc.json"]  # fmt: skip
    one, two = jobs_pair(tmp_path, argv, ["rows.jsonl", "doc.json"], afresh=True)
    assert one == two
    records = [json.loads(line) for line in one["rows.jsonl"].decode().splitlines()[1:]]
    assert {r["kind"] for r in records} == {
        "layout",
        "workspace",
        "merge",
        "prefill",
        "sparse-layout",
        "sparse-workspace",
        "sparse-mask",
        "sparse-prefill",
    }
    assert any(r["status"] == "port-error" for r in records) and any(r["status"] == "parity" for r in records)
    assert any(r["kind"] == "prefill" and "dcp" in r["name"] for r in records)
    assert [r["index"] for r in records] == sorted(r["index"] for r in records)


def test_gate_writes_the_same_outputs_for_any_jobs(tmp_path: Path) -> None:
    files = ["gate.json", "summary.md", "junit.xml", "results.parquet"]
    argv = ["gate", *MIXED, "--port", "tests.test_jobs:RecordingPort", "--out", "{out}"]
    one, two = jobs_pair(tmp_path, argv, files)
    for name in files:
        assert one[name] == two[name], name
    assert b"port-error" in one["summary.md"]


def test_mutants_write_the_same_matrix_and_shrunk_cases_for_any_jobs(tmp_path: Path) -> None:
    only = "query-start-not-rebased,workspace-floor"
    argv = ["mutants", "--suite", "smoke", "--only", only, "--level", "layout", "--out", "{out}"]
    shrunk = ["shrunk/query-start-not-rebased-layout.json"]  # workspace-floor dies on a workspace item: no case
    one, two = jobs_pair(tmp_path, argv, ["kill-matrix.json", "kill-matrix.md", *shrunk], recording=False)
    assert one == two
    assert b'"killed": true' in one["kill-matrix.json"] and b"shrunk:" in one["kill-matrix.md"]


def test_ctrl_c_keeps_finished_rows_and_leaves_no_worker(tmp_path: Path) -> None:
    rows, pids = tmp_path / "rows.jsonl", tmp_path / "pids"
    argv = ["run", "--suite", "smoke", "--level", "layout", "--port", "tests.test_jobs:RecordingSlowPort",
            "--jobs", "2", "--results", str(rows)]  # fmt: skip
    env = {**os.environ, PID_FILE: str(pids)}
    proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # Some rows written and both workers at work.
        if rows.exists() and len(rows.read_text(encoding="utf-8").splitlines()) > 6 and len(recorded(pids)) == 2:
            break
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    workers = recorded(pids)
    assert len(workers) == 2 and workers <= {child.pid for child in children}
    state = signal_state(proc.pid)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"{err[-3000:]}\n(when signalled: {state})"
    assert "interrupted" in out
    lines = rows.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines[1:]]
    # Every row finished before Ctrl-C is kept, complete, once; the rest were not compared.
    assert 5 < len(records) < 124 and all(r["status"] == "parity" for r in records)
    assert len({r["id"] for r in records}) == len(records)
    gone = time.monotonic() + 10
    while time.monotonic() < gone and any(_alive(child) for child in children):
        time.sleep(0.1)
    assert not [child.pid for child in children if _alive(child)]


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def test_a_hanging_port_times_out_and_a_crash_is_not_run_in_a_worker(tmp_path: Path) -> None:
    rows, pids = tmp_path / "rows.jsonl", tmp_path / "pids"
    smoke = ROOT / "cases" / "smoke"
    names = ("exact-at", "giant-middle", "exact-plus-one", "exact-minus-one")
    cases = [str(smoke / f"{name}.json") for name in names]
    proc, cli = parity("run", "--cases", *cases, "--level", "layout", "--port", "tests.test_jobs:MisbehavingPort",
                       "--timeout", "2", "--jobs", "2", "--results", str(rows), pids=pids)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    records = [json.loads(line) for line in rows.read_text().splitlines()[1:]]
    statuses = {r["name"].removeprefix("smoke-"): (r["status"], r["detail"]) for r in records}
    assert list(statuses) == list(names)
    # The worker's SIGALRM ended the hung call; the crash took its worker, whose other items ran on.
    assert statuses["giant-middle"][0] == "port-error" and "time limit" in statuses["giant-middle"][1]
    # Nothing was compared on the item whose worker died: not-run, so the run cannot pass.
    assert statuses["exact-plus-one"][0] == "not-run" and "died (exit code 3)" in statuses["exact-plus-one"][1]
    assert statuses["exact-at"][0] == statuses["exact-minus-one"][0] == "parity"
    assert recorded(pids) and cli not in recorded(pids)


def test_a_bad_jobs_value_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exit_info:
            main(["gate", "--suite", "smoke", "--jobs", value])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and "--jobs" in err, err


def test_a_divergent_port_through_the_cache_gives_the_same_json_for_any_jobs(tmp_path: Path) -> None:
    """equal_share's prefill items diverge by ULP figures that depend on torch's
    thread count; one process and two workers must still agree to the byte, the
    first run filling the oracle cache and the second reading it. Both from a
    shell without the CPU recipe (TRITON_INTERPRET ...): the second run's
    workers never import vLLM (every answer is cached), and the port's Triton
    merge must still run in the interpreter."""
    from oracle.environment import CPU_ENVIRONMENT

    cache = tmp_path / "cache"
    shell = {name: value for name, value in os.environ.items() if name not in CPU_ENVIRONMENT}
    docs = []
    for jobs in (1, 2):
        doc = tmp_path / f"jobs{jobs}.json"
        argv = ["run", "--suite", "smoke", "--level", "prefill", "--port", "equal_share", "--jobs", str(jobs),
                "--json", str(doc)]  # fmt: skip
        env = {**shell, "PARITY_ORACLE_CACHE": str(cache)}
        command = [sys.executable, "-m", "harness", *argv]
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 1, proc.stderr[-3000:]
        docs.append(doc.read_bytes())
    assert docs[0] == docs[1]
    rows = json.loads(docs[0])["cases"]
    assert any(r["status"] == "divergent" for r in rows) and any(r["status"] == "parity" for r in rows)
    assert any(cache.rglob("*.safetensors")), "the first run wrote no oracle results to the cache"


def sides_naming_their_process(spec: WorkerSpec) -> tuple[Port, dict[str, Any], SharedKernels]:
    """A worker's sides whose provenance differs from process to process (as two
    installs of vLLM would): per_request stands in for the oracle."""
    from harness.kernels import CpuKernels
    from harness.sides.loading import load_port

    return load_port("per_request"), {"release": "vllm==0.28.0", "process": {"pid": os.getpid()}}, CpuKernels()


def nap(sides: WorkerSides, seconds: float) -> Iterator[float]:
    time.sleep(seconds)
    yield seconds


def test_a_worker_whose_oracle_differs_from_the_first_stops_the_pool() -> None:
    # A minute of work for one worker: the second is ready long before it ends.
    tasks = [Task(run=nap, payload=0.2, what="a nap") for _ in range(300)]
    with WorkerPool(2, WorkerSpec(open_sides=sides_naming_their_process)) as pool:
        first = pool.oracle_provenance()
        differs = r"another oracle than the run's: provenance\.process\.pid: \d+ != \d+"
        with pytest.raises(PoolStartError, match=differs):
            list(pool.run(tasks))
    assert first["release"] == "vllm==0.28.0"


def test_workers_whose_oracle_differs_from_this_process_stop_the_pool() -> None:
    with WorkerPool(1, WorkerSpec(open_sides=sides_naming_their_process)) as pool:
        pool.start()
        pool.expect_provenance({"release": "vllm==0.28.0", "process": {"pid": os.getpid()}})
        differs = r"another oracle than the run's: provenance\.process\.pid: \d+ != \d+"
        with pytest.raises(PoolStartError, match=differs):
            list(pool.run([Task(run=nap, payload=0.0, what="a nap")]))
    with WorkerPool(1, WorkerSpec(open_sides=sides_naming_their_process)) as pool:
        worker = pool.oracle_provenance()  # a worker already ready: checked at once
        with pytest.raises(PoolStartError, match=r"another oracle than this process: provenance\.process\.pid"):
            pool.expect_provenance({**worker, "process": {"pid": os.getpid()}})


@pytest.mark.parametrize("select", ["select_host", "select_device"])
def test_selecting_the_device_sets_its_recipe_in_the_environment(select: str) -> None:
    """A worker whose oracle answers (and fingerprint check) all come from the
    cache never imports vLLM, whose import used to be what set TRITON_INTERPRET:
    its port's Triton merge then found no driver ("0 active drivers"), on every
    merge item of a warm `--jobs 2` gate. Selecting the device sets the recipe."""
    from oracle.environment import CPU_ENVIRONMENT

    shell = {name: value for name, value in os.environ.items() if name not in CPU_ENVIRONMENT}
    code = (
        f"from harness.engine import {select}; {select}('cpu'); import os, sys; "
        "print(os.environ.get('TRITON_INTERPRET'), 'vllm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=shell, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr[-2000:]


def test_heavy_tasks_are_handed_out_first_and_the_rest_in_order() -> None:
    from harness.sides.pool import HEAVY_TASK_S, dispatch_order

    costs = [0.1, HEAVY_TASK_S, 0.2, 3 * HEAVY_TASK_S, 0.1, 2 * HEAVY_TASK_S]
    tasks = [Task(run=nap, payload=i, cost_s=cost) for i, cost in enumerate(costs)]
    tasks.insert(2, Task(inline=lambda: iter(()), cost_s=9.0))  # runs in the parent, never handed out
    # The first goes first (what is yielded in order decides when a run stops), then the heavy ones.
    assert dispatch_order(tasks) == [0, 4, 6, 1, 3, 5]


def test_a_pool_failure_names_the_option_that_asked_for_the_workers() -> None:
    from harness.engine.workers import pool_failure
    from harness.sides.pool import PoolError

    assert str(pool_failure(PoolError("a worker process died"))) == "--jobs: a worker process died"
    ray = pool_failure(PoolStartError("a Ray actor died during its start-up: gone"), "ray")
    assert str(ray) == "--executor ray: a worker could not start: a Ray actor died during its start-up: gone"
