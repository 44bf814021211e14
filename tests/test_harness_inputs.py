"""What the harness builds for a side is built outside that side's error
handler: a fault there (a MemoryError while materialising) is the harness's,
never an oracle-error or a port-error, and the item is not run (it cannot pass).
A port call past its time limit says so, and is recognised as a timeout."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import harness.kernels.numeric
import harness.kernels.sparse_prefill
from harness.cases.suites import load_suite
from harness.kernels import CpuKernels
from harness.protocol.port import Port
from harness.sides.items import NOT_RUN, PORT_ERROR
from harness.sides.runner import compare_merge, compare_prefill
from harness.sides.sparse_runner import compare_sparse_prefill
from harness.sides.time_limits import is_timeout
from ports.per_request import PerRequestPort


def fails_on_call(real: Any, failing_call: int) -> Any:
    calls = [0]

    def build(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == failing_call:
            raise MemoryError("no room for the inputs")
        return real(*args, **kwargs)

    return build


@pytest.mark.parametrize("failing_call", [1, 2])  # the oracle's inputs, then the port's
def test_a_fault_building_merge_inputs_is_the_harness_s(
    oracle: Port, per_request: Port, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    case = load_suite("smoke").merge_cases[0]
    monkeypatch.setattr(
        harness.kernels.numeric,
        "materialise_merge",
        fails_on_call(harness.kernels.numeric.materialise_merge, failing_call),
    )
    result = compare_merge(oracle, per_request, case)
    assert result.status == NOT_RUN, result.error
    assert result.error == "the harness could not build the inputs: MemoryError: no room for the inputs"


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_fault_building_prefill_inputs_is_the_harness_s(
    oracle: Port, per_request: Port, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    case = next(c for c in load_suite("smoke").cases if c.numeric is not None)
    build = fails_on_call(harness.kernels.numeric.case_prefill_inputs, failing_call)
    monkeypatch.setattr(harness.kernels.numeric, "case_prefill_inputs", build)
    result = compare_prefill(oracle, per_request, case, CpuKernels())
    assert result.status == NOT_RUN and result.error is not None and "could not build the inputs" in result.error


def test_a_fault_building_sparse_prefill_inputs_is_the_harness_s(
    oracle: Port, per_request: Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = next(c for c in load_suite("smoke").sparse_cases if c.numeric is not None)
    build = fails_on_call(harness.kernels.sparse_prefill.materialise_sparse_prefill, 2)
    monkeypatch.setattr(harness.kernels.sparse_prefill, "materialise_sparse_prefill", build)
    result = compare_sparse_prefill(oracle, per_request, case, CpuKernels(), "cpu", 300.0)
    if result.error and "routes it mqa" in result.error:
        pytest.fail("pick a smoke sparse L3 batch the oracle runs masked")
    assert result.status == NOT_RUN and result.error is not None and "could not build the inputs" in result.error


class SlowMerge(PerRequestPort):
    name = "slow-merge"

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(5)
        return super().merge_states(inputs)


def test_a_port_past_its_time_limit_is_a_timeout(oracle: Port) -> None:
    case = load_suite("smoke").merge_cases[0]
    result = compare_merge(oracle, SlowMerge(), case, timeout_s=0.5)
    assert result.status == PORT_ERROR and is_timeout(result.error), result.error
    assert not is_timeout("ValueError: equal share of a 96-row workspace")


def test_a_fault_in_the_harness_s_work_inside_an_external_prefill_is_the_harness_s(
    oracle: Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An external port is sent partials the harness computes on its layout: a
    MemoryError there is not the port's error."""
    import harness.kernels.context_chunks
    from harness.sides.loading import load_port

    program = shlex.join([sys.executable, str(Path(__file__).parent / "fake_external_port.py")])
    port = load_port(f"cmd:{program} --prefill --fault none")
    try:
        case = next(c for c in load_suite("smoke").cases if c.numeric is not None and c.context_lens[0] > 0)

        def no_memory(*args: Any, **kwargs: Any) -> Any:
            raise MemoryError("no room for the partials")

        monkeypatch.setattr(harness.kernels.context_chunks, "planned_chunk_partials", no_memory)
        result = compare_prefill(oracle, port, case, CpuKernels())
    finally:
        port.close()  # type: ignore[attr-defined]
    assert result.status == NOT_RUN, result.error
    assert result.error == "the harness could not build the inputs: HarnessFault: MemoryError: no room for the partials"
