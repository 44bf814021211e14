"""``--executor ray`` on a real two-node Ray cluster on this machine (a head and
a second node, each its own raylet process on 127.0.0.1, one CPU each): the same
bytes as ``--jobs 2``, faults that lose nothing and count nothing twice, and
the one-line refusal without Ray.

Every harness run here is a subprocess connected to the module's cluster
(``--ray-address``); the ports record the pid of every process that plans a
layout, so a test can tell the work ran in the cluster's actors.
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

import pytest

from harness.model import Case, Layout
from ports.per_request import PerRequestPort
from tests.test_jobs import MIXED, PID_FILE, recorded

pytestmark = pytest.mark.all_cores
ray = pytest.importorskip("ray", reason="the ray extra is not installed (tox builds .tox/oracle with it)")

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "cases" / "smoke"
# Layout cases of smoke: the one whose worker dies every time, the one whose node is taken away, and others.
CRASHES_ON = "exact-plus-one"
NODE_GOES_ON = "giant-middle"
NAMES = ("exact-at", CRASHES_ON, "exact-minus-one", NODE_GOES_ON, "giant-first", "giant-last")
# Files the node-fault port and the test signal each other through, and where it
# records every process that plans giant-middle.
MARKER, RELEASE, PLANNERS = "PARITY_TEST_NODE_MARKER", "PARITY_TEST_NODE_RELEASE", "PARITY_TEST_NODE_PLANNERS"


class FaultyPort(PerRequestPort):
    """per_request, but its process dies on exact-plus-one (every time), and
    the first time it plans giant-middle it says so (the marker file: its pid)
    and waits until the test has taken its process away (the release file, for
    a survivor)."""

    name = "faulty"

    def plan_layout(self, case: Case) -> Layout:
        path = os.environ.get(PID_FILE)
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()}\n")
        if case.name.endswith(CRASHES_ON):
            os._exit(3)
        marker, release = Path(os.environ[MARKER]), Path(os.environ[RELEASE])
        if case.name.endswith(NODE_GOES_ON):
            with open(os.environ[PLANNERS], "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()}\n")
        if case.name.endswith(NODE_GOES_ON) and not marker.exists():
            marker.write_text(str(os.getpid()))
            deadline = time.monotonic() + 60
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        return super().plan_layout(case)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    started = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    started.add_node(num_cpus=1)
    started.wait_for_nodes()
    try:
        yield started
    finally:
        started.shutdown()  # type: ignore[no-untyped-call]


def harness(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *argv],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def test_a_ray_run_writes_what_jobs_2_writes(cluster: Any, tmp_path: Path) -> None:
    """The same rows file and JSON document, byte for byte, as --jobs 2 on the same items."""
    argv = ["run", *MIXED, "--port", "tests.test_jobs:RecordingPort", "--no-oracle-cache"]
    outputs = {}
    runs = {}
    for name, how in (("jobs", ["--jobs", "2"]), ("ray", ["--executor", "ray", "--ray-address", cluster.address])):
        folder = tmp_path / name
        folder.mkdir()
        files = ["--results", str(folder / "rows.jsonl"), "--json", str(folder / "doc.json")]
        runs[name] = (folder, harness([*argv, *how, *files], {PID_FILE: str(folder / "pids")}))
    for name, (folder, proc) in runs.items():
        code, _, err = finished(proc)
        assert code == 1, err[-3000:]  # RecordingPort fails some items
        outputs[name] = {
            f: (folder / f).read_bytes().replace(str(folder).encode(), b"{out}") for f in ("rows.jsonl", "doc.json")
        }
        planners = recorded(folder / "pids")
        assert planners and proc.pid not in planners, (name, planners)
    assert outputs["ray"] == outputs["jobs"]
    records = [json.loads(line) for line in outputs["ray"]["rows.jsonl"].decode().splitlines()[1:]]
    assert any(r["status"] == "port-error" for r in records) and any(r["status"] == "parity" for r in records)


def test_faults_lose_nothing_and_count_nothing_twice(cluster: Any, tmp_path: Path) -> None:
    """The process comparing giant-middle goes away mid-item, and the node that
    is not the head with it: the item runs again elsewhere, each row once, the
    table as a run without the fault gives it. An item that kills its worker every time:
    not-run after MAX_ITEM_TRIES, the rest compared, no hang."""
    rows, planners = tmp_path / "rows.jsonl", tmp_path / "planners"
    marker, release = tmp_path / "marker", tmp_path / "release"
    env = {PID_FILE: str(tmp_path / "pids"), MARKER: str(marker), RELEASE: str(release), PLANNERS: str(planners)}
    cases = [str(SMOKE / f"{name}.json") for name in NAMES]
    argv = ["run", "--cases", *cases, "--level", "layout", "--port", "tests.test_ray_executor:FaultyPort",
            "--executor", "ray", "--ray-address", cluster.address, "--jobs", "2", "--results", str(rows)]  # fmt: skip
    proc = harness(argv, env)
    deadline = time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[1][-3000:]
    pid = marker.read_text()
    other = next(node for node in cluster.list_all_nodes() if node is not cluster.head_node)
    # The process at work on the item goes (a removed node's worker can outlive its raylet
    # for a moment, and a result it sends then goes straight to the run: killed, it sends none).
    os.kill(int(pid), signal.SIGKILL)
    # The node that is not the head goes too, whatever its actor was doing (the one killed above, or the other).
    cluster.remove_node(other, allow_graceful=False)
    release.write_text("go")
    try:
        code, _, err = finished(proc)
    finally:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    assert code == 1, err[-3000:]
    records = [json.loads(line) for line in rows.read_text(encoding="utf-8").splitlines()[1:]]
    assert [r["name"].removeprefix("smoke-") for r in records] == list(NAMES)  # every item once, in order
    statuses = {r["name"].removeprefix("smoke-"): (r["status"], r["detail"]) for r in records}
    # giant-middle was planned again, by another process, after the first was taken away.
    assert len(set(planners.read_text().split())) >= 2
    status, detail = statuses.pop(CRASHES_ON)
    assert status == "not-run" and "died every time it was tried" in detail, detail
    assert all(status == "parity" for status, _ in statuses.values()), statuses


def test_without_ray_the_executor_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where it is not installed
    code = main(["run", "--suite", "smoke", "--level", "layout", "--executor", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Ray is not installed" in err and "[ray]" in err
