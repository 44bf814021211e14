"""The oracle served from another environment (oracle/serve.py, oracle/process.py).

The pinned release served as a process must give, bit for bit, what it gives
in-process at every level: the transport (tensors as storages plus views, the
case and layout as JSON) adds nothing and loses nothing. A release the harness
cannot serve, or one without a pin, is refused in one line.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from harness.cases.suites import load_suite
from harness.cli import main
from harness.engine import UsageError, open_oracle
from harness.kernels import CpuKernels
from harness.protocol.port import Port
from harness.sides.items import PARITY
from harness.sides.runner import run_items
from oracle.pin import load_pin
from oracle.process import OracleProcess, OracleProcessError

PINNED = load_pin()["release_version"]


@pytest.fixture(scope="module")
def served_pin() -> Iterator[OracleProcess]:
    """The pinned release, served by this very environment's python as a process."""
    process = OracleProcess(PINNED, Path(sys.executable))
    yield process
    process.close()


def test_hello_names_the_release_and_its_pin(served_pin: OracleProcess) -> None:
    hello = served_pin.hello
    assert hello["installed_vllm"] == PINNED
    # The served environment's own versions (the oracle cache keys on them): this one is the harness's.
    assert hello["environment"]["torch"] == version("torch") and hello["environment"]["numpy"] == version("numpy")
    assert hello["pin"]["release"] == f"vllm=={PINNED}"
    statuses = {s["symbol"]: s["status"] for s in hello["fingerprints"]}
    assert set(statuses) >= set(load_pin()["fingerprints"]) and set(statuses.values()) == {"ok"}
    assert served_pin.levels == ("layout", "merge", "prefill", "sparse-layout", "sparse-mask", "sparse-prefill")


@pytest.mark.parametrize("level", ["layout", "merge"])
def test_served_pin_is_the_pin_bit_for_bit(oracle: Port, served_pin: OracleProcess, level: str) -> None:
    """In-process oracle against the served one: every smoke item of the level at parity."""
    results = list(
        run_items(oracle, served_pin, load_suite("smoke"), (level,), None, CpuKernels(), frozenset(), "cpu", 300)
    )
    assert results and all(r.status == PARITY for r in results), [
        (r.id, r.status, r.detail()) for r in results if r.status != PARITY
    ]


def test_served_pin_prefill_fp32_is_the_pin_bit_for_bit(oracle: Port, served_pin: OracleProcess) -> None:
    """L3, fp32 included: a tensor handed to the process misaligned in memory takes
    another CPU matmul path, 23 ULP away (measured); the server re-allocates."""
    smoke = load_suite("smoke")
    cases = tuple(c for c in smoke.cases if c.numeric is not None and "continuation" in c.name)
    suite = dataclasses.replace(smoke, cases=cases)
    assert "fp32" in {c.numeric.dtype for c in cases if c.numeric} and len(cases) >= 3
    results = list(run_items(oracle, served_pin, suite, ("prefill",), None, CpuKernels(), frozenset(), "cpu", 300))
    assert len(results) == len(cases)
    assert all(r.status == PARITY for r in results), [(r.id, r.detail()) for r in results if r.status != PARITY]


def test_a_refusal_is_the_oracles_one_line(served_pin: OracleProcess) -> None:
    """An exception in the release's code comes back as the oracle's error, not the port's."""
    from harness.model import WorkspaceConfig

    with pytest.raises(OracleProcessError, match=rf"^vllm=={PINNED}: ") as caught:
        served_pin._call(served_pin._request, {"op": "no-such-op"})
    assert "\n" not in str(caught.value) and "unknown op" in str(caught.value)
    # The process is still usable after a refusal.
    assert served_pin.workspace_size(WorkspaceConfig(2048, 4, 16)) > 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0.27.1", "expected vllm==X.Y.Z"),
        ("vllm>=0.27", "expected vllm==X.Y.Z"),
        ("vllm==9.9.9", "no requirements/vllm-9.9.9.txt"),
    ],
)
def test_an_oracle_that_cannot_be_served_is_refused(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--suite", "smoke", "--level", "layout", "--oracle", spec])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_a_release_without_a_pin_is_refused_unless_drift_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pin file: nothing says which code ran, so it is drift, refused by default."""

    class Unpinned:
        name = "oracle vllm==9.8.7"
        closed = False

        def close(self) -> None:
            self.closed = True

    served = Unpinned()
    hello: dict[str, object] = {
        "installed_vllm": "9.8.7",
        "installed_commit_id": "gabc",
        "pin": None,
        "fingerprints": [],
    }
    monkeypatch.setattr("oracle.process.open_oracle_process", lambda release: (served, hello))
    with pytest.raises(UsageError, match=r"missing: oracle/pins/vllm-9\.8\.7\.json"):
        open_oracle(False, "vllm==9.8.7")
    assert served.closed
    side, provenance = open_oracle(True, "vllm==9.8.7")
    assert side is served  # type: ignore[comparison-overlap]
    assert provenance["oracle_drift_overridden"] is True
    assert provenance["release"] == "vllm==9.8.7" and provenance["upstream_commit"] == "gabc"


def test_the_pinned_release_by_name_is_the_in_process_oracle() -> None:
    from oracle.side import OracleSide

    side, provenance = open_oracle(False, f"vllm=={PINNED}")
    assert isinstance(side, OracleSide) and provenance["release"] == f"vllm=={PINNED}"


def test_a_run_against_another_release_sets_the_device_recipe_here(tmp_path: Path) -> None:
    """With the oracle in its own process no vLLM is imported here, yet the port's
    Triton merge kernel needs the CPU recipe (TRITON_INTERPRET) in this process:
    without it every merge item was a port-error ("0 active drivers")."""
    import os
    import subprocess

    from oracle.process import environment_python

    if not environment_python("0.27.1").is_file():
        pytest.skip("the legacy oracle's environment .tox/vllm-0.27.1 is not built (make test builds it)")
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VLLM_TARGET_DEVICE")}
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--suite", "smoke", "--level", "merge",
         "--port", "equal_share", "--oracle", "vllm==0.27.1", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, env=clean, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["provenance"]["release"] == "vllm==0.27.1"
    statuses = {r["status"] for r in report["cases"]}
    assert statuses == {"parity"} and len(report["cases"]) >= 40
