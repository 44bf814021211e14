"""L3 of DCP cases on real ranks (``--dcp-backend gloo``): one process per rank
over torch.distributed gives the same bits as one process playing every rank,
for the oracle and for per_request; a rank that disagrees is its side's error.

The rank workers are spawned once (each imports the pinned vLLM) and shared by
every test here, the CLI's run included (it runs in this process).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cases.files import write_case_file
from harness.cases.prefill_generate import generate_prefill
from harness.compare.bits import identical_bits
from harness.kernels import kernels_for, kernels_for_case
from harness.kernels.numeric import PrefillInputs, case_prefill_inputs
from harness.model import Case
from harness.model.dcp import DCP_BACKENDS
from harness.protocol.port import Port
from harness.sides.dcp_ranks import DCP_BACKEND_CHOICES, RealRanks, close_pools, prefill_on_ranks, prestart
from harness.sides.items import PARITY, PORT_ERROR
from harness.sides.loading import load_port
from harness.sides.runner import compare_prefill

GLOO = RealRanks("gloo", "per_request")


def _dcp_cases() -> list[Case]:
    """The ci suite's first DCP L3 cases of world sizes 2 and 3, each with a
    request longer than a chunk (a continuation across chunks)."""
    chosen: dict[int, Case] = {}
    for case in generate_prefill(20260825, 48, "tiny", families=["dcp"]):
        if case.dcp_world_size in (2, 3) and case.dcp_world_size not in chosen:
            chosen[case.dcp_world_size] = case
    return [chosen[2], chosen[3]]


CASES = _dcp_cases()


@pytest.fixture(scope="session", autouse=True)
def _rank_workers() -> Iterator[None]:
    # Session-wide so it comes before the oracle fixture: the workers' imports
    # of the pinned vLLM overlap this process's.
    prestart(GLOO, "cpu", max(c.dcp_world_size for c in CASES))
    yield
    close_pools()


def _one_process(side: Any, case: Case) -> dict[str, torch.Tensor]:
    kernels = kernels_for_case(kernels_for("cpu"), case)
    out: dict[str, torch.Tensor] = side.prefill(case, case_prefill_inputs(case, "cpu"), kernels)
    return out


def _assert_same_bits(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor] | None, what: str) -> None:
    assert got is not None, what
    assert list(got) == list(expected), what
    for name, tensor in expected.items():
        assert identical_bits(tensor, got[name]), f"{what}: {name} differs from one process's"


def test_cases_span_worlds_and_continue_across_chunks() -> None:
    assert [c.dcp_world_size for c in CASES] == [2, 3]
    for case in CASES:
        # A request longer than the workspace is split: a continuation chunk.
        assert max(case.context_lens) > case.workspace_size, case.name


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gloo_ranks_match_one_process_bit_for_bit(case: Case, oracle: Port, per_request: Port) -> None:
    outcome = prefill_on_ranks(case, GLOO, "cpu", 300.0)
    assert outcome.oracle_error is None and outcome.port_error is None, outcome
    _assert_same_bits(_one_process(oracle, case), outcome.oracle, f"{case.name} oracle")
    _assert_same_bits(_one_process(per_request, case), outcome.port, f"{case.name} per_request")


class RankOneFlipsABit:
    """per_request, except that DCP rank 1 flips the lowest bit of its first output element."""

    name = "rank-one-flips-a-bit"

    def __init__(self) -> None:
        self.inner: Any = load_port("per_request")

    def plan_layout(self, case: Case) -> Any:
        return self.inner.plan_layout(case)

    def workspace_size(self, config: Any) -> int:
        size: int = self.inner.workspace_size(config)
        return size

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: Any) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = self.inner.prefill(case, inputs, kernels)
        if inputs.dcp is not None and inputs.dcp.rank == 1:
            output = out["output"].clone()
            bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
            output.view(bits[output.dtype]).view(-1)[0] ^= 1
            out = {**out, "output": output}
        return out


def test_a_rank_that_disagrees_is_a_port_error_naming_it(oracle: Port) -> None:
    case = CASES[0]
    flipping = RealRanks("gloo", f"{__name__}:RankOneFlipsABit")
    # Rank 0's tensors alone are at parity: only the ranks' agreement catches it.
    outcome = prefill_on_ranks(case, flipping, "cpu", 300.0)
    assert outcome.oracle_error is None and outcome.port is None
    assert outcome.port_error is not None and "DCP rank 1's output differs from rank 0's" in outcome.port_error
    result = compare_prefill(oracle, RankOneFlipsABit(), case, kernels_for("cpu"), real_ranks=flipping)
    assert result.status == PORT_ERROR and "DCP rank 1" in (result.error or "")
    # One process asks the port as rank 0 only: parity there, so the check above is what caught it.
    assert compare_prefill(oracle, RankOneFlipsABit(), case, kernels_for("cpu")).status == PARITY


def test_cli_run_with_gloo_ranks_exits_0_at_parity(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from harness.cli import main

    path = tmp_path / "dcp.json"
    write_case_file(CASES[1], path)
    code = main(["run", "--cases", str(path), "--level", "prefill", "--dcp-backend", "gloo"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "DCP ranks over gloo" in out and "PASS" in out.upper()


def test_the_cli_offers_every_backend() -> None:
    assert DCP_BACKEND_CHOICES == DCP_BACKENDS


def test_nccl_needs_cuda_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from harness.cli import main

    path = tmp_path / "dcp.json"
    write_case_file(CASES[0], path)
    assert main(["run", "--cases", str(path), "--dcp-backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dcp-backend nccl runs on --device cuda" in err


def test_a_crashed_rank_is_that_sides_error() -> None:
    # Last: the pool ends with the crash (the other rank may be inside a collective).
    case = dataclasses.replace(CASES[0], name="crash")
    crashing = RealRanks("gloo", f"{__name__}:RankOneExits")
    outcome = prefill_on_ranks(case, crashing, "cpu", 300.0)
    assert outcome.oracle_error is None
    assert outcome.port_error is not None and "DCP rank 1's process ended (exit code 3)" in outcome.port_error


class RankOneExits(RankOneFlipsABit):
    """Rank 1's process ends inside the port's prefill."""

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: Any) -> dict[str, torch.Tensor]:
        if inputs.dcp is not None and inputs.dcp.rank == 1:
            import os

            os._exit(3)
        return super().prefill(case, inputs, kernels)
