"""The legacy oracle (vllm==0.27.1, oracle/legacy.py) against equal_share, across environments.

0.27.1 runs in its own environment (``.tox/vllm-0.27.1``, built by ``make test``);
these tests run in the pinned one and reach it as a subprocess, as the harness's
``--oracle vllm==0.27.1`` does. What 0.27.1 computes comes back as JSON (layouts,
sizes, refusals) or as saved tensors (L2, L3); equal_share computes its side here,
and the two are compared exactly (tensors as bit patterns). Both environments
carry the same CPU torch, so the shared kernels give the same bits in both.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.compare import first_layout_divergence
from harness.kernels import kernels_for, kernels_for_case
from harness.model import PRESETS, Case, Layout, layout_from_json
from harness.numeric import materialise_merge, materialise_prefill
from harness.suites import load_suite, workspace_grids
from ports.equal_share import PORT

ROOT = Path(__file__).resolve().parent.parent
LEGACY_PYTHON = ROOT / ".tox" / "vllm-0.27.1" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not LEGACY_PYTHON.is_file(), reason=f"the 0.27.1 environment is not built ({LEGACY_PYTHON}): tox -e vllm-0.27.1"
)

# The smoke suite plus a slice of the ci suite's generated layout cases: every
# generator family, DCP worlds and interleaves, alignment off.
GENERATED = 120


def run_legacy(script: str, argument: Any, timeout_s: float = 600) -> Any:
    """Run ``script`` in the 0.27.1 environment: it reads ``ARGUMENT`` (JSON) and
    sets ``RESULT`` (JSON-able), which comes back here."""
    program = "\n".join(
        [
            "import json, sys",
            "from oracle.environment import prepare_cpu_environment",
            "prepare_cpu_environment()",
            "ARGUMENT = json.loads(sys.stdin.read())",
            textwrap.dedent(script),
            "sys.stdout.write('\\nRESULT ' + json.dumps(RESULT))",
        ]
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [str(LEGACY_PYTHON), "-c", program],
        input=json.dumps(argument),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("\nRESULT ", 1)[1])


def layout_cases() -> tuple[Case, ...]:
    smoke = load_suite("smoke").cases
    generated = load_suite("ci", size=GENERATED, numeric_size=0).cases
    return tuple({case.name: case for case in (*smoke, *generated)}.values())


PLAN_SCRIPT = """
from harness.suites import load_suite
from oracle.legacy import LegacyOracleSide, LegacyRefusal
side = LegacyOracleSide()
cases = {c.name: c for c in (*load_suite("smoke").cases, *load_suite("ci", size=ARGUMENT, numeric_size=0).cases)}
RESULT = {}
for name, case in cases.items():
    try:
        RESULT[name] = side.plan_layout(case).to_json()
    except LegacyRefusal as exc:
        RESULT[name] = {"refused": str(exc)}
"""


@pytest.fixture(scope="module")
def legacy_layouts() -> dict[str, Any]:
    result: dict[str, Any] = run_legacy(PLAN_SCRIPT, GENERATED)
    return result


def test_equal_share_plans_what_0_27_1_plans(legacy_layouts: dict[str, Any]) -> None:
    from oracle.legacy import LOOP_FAILS, REFUSALS

    cases = layout_cases()
    assert set(legacy_layouts) == {case.name for case in cases}
    planned = refused = 0
    for case in cases:
        legacy = legacy_layouts[case.name]
        if "refused" in legacy:
            reason = legacy["refused"]
            assert reason in REFUSALS.values() or reason.startswith(LOOP_FAILS), reason
            refused += 1
            continue
        expected = layout_from_json(legacy)
        divergence = first_layout_divergence(expected, PORT.plan_layout(case))
        assert divergence is None, f"{case.name}: {divergence.message()}"
        planned += 1
    # Both kinds occur: the grid is compared, and the refusals are classified.
    assert planned > refused > 0
    dcp_planned = [c for c in cases if c.dcp_world_size > 1 and "refused" not in legacy_layouts[c.name]]
    assert dcp_planned, "no DCP case that 0.27.1 runs: the DCP translation goes unchecked"


def test_the_pinned_oracle_plans_otherwise(legacy_layouts: dict[str, Any]) -> None:
    """The comparison can tell grids apart: 0.27.1's grid is not the pinned
    per-request planner's on the same cases."""
    from oracle.side import OracleSide

    pinned = OracleSide()
    differing = [
        case.name
        for case in layout_cases()
        if "refused" not in legacy_layouts[case.name]
        and first_layout_divergence(layout_from_json(legacy_layouts[case.name]), pinned.plan_layout(case))
    ]
    assert differing


WORKSPACE_SCRIPT = """
from harness.suites import workspace_grids
from oracle.legacy import LegacyOracleSide
side = LegacyOracleSide()
RESULT = [side.workspace_size(config) for config in workspace_grids(["full", "wide"])]
"""


def test_workspace_size_is_0_27_1s_on_the_whole_grid() -> None:
    configs = workspace_grids(["full", "wide"])
    legacy = run_legacy(WORKSPACE_SCRIPT, None)
    assert len(legacy) == len(configs)
    differing = [
        (c.name, a, PORT.workspace_size(c)) for c, a in zip(configs, legacy, strict=True) if a != PORT.workspace_size(c)
    ]
    assert not differing, differing[:5]


REFUSAL_SCRIPT = """
from oracle.legacy import LegacyOracleSide, LegacyRefusal, refusal_cases
side = LegacyOracleSide()
RESULT = []
for case in refusal_cases():
    try:
        side.plan_layout(case)
        RESULT.append(None)
    except LegacyRefusal as exc:
        RESULT.append(str(exc))
"""


def test_refusals_name_their_class() -> None:
    """Each of 0.27.1's refusals on its own case, with the class's stable reason."""
    from oracle.legacy import LOOP_FAILS, REFUSALS

    reasons = run_legacy(REFUSAL_SCRIPT, None)
    assert reasons == [
        REFUSALS["share-zero"],
        REFUSALS["share-not-divisible"],
        f"{LOOP_FAILS} _context_parallel_compute_prefill_context: `assert toks <= allgather_offset`",
        REFUSALS["workspace-not-divisible"],
    ]


# -- L2, L3 ---------------------------------------------------------------------------------


NUMERIC_SCRIPT = """
import torch
from harness.kernels import kernels_for, kernels_for_case
from harness.merge_cases import generate_merge
from harness.model import Case, MergeCase, NumericSpec
from harness.numeric import materialise_merge, materialise_prefill
from oracle.legacy import LegacyOracleSide, LegacyRefusal
side = LegacyOracleSide()
out, refused = {}, {}
for i, data in enumerate(ARGUMENT["merge"]):
    case = MergeCase(**data)
    output, lse = side.merge_states(materialise_merge(case))
    out[f"merge{i}"] = {"output": output, "lse": lse}
for i, data in enumerate(ARGUMENT["prefill"]):
    numeric = NumericSpec(**data.pop("numeric"))
    case = Case(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}, numeric=numeric)
    inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, numeric)
    try:
        out[f"prefill{i}"] = side.prefill(case, inputs, kernels_for_case(kernels_for("cpu"), case))
    except LegacyRefusal as exc:
        refused[f"prefill{i}"] = str(exc)
torch.save(out, ARGUMENT["path"])
RESULT = refused
"""


def prefill_cases() -> list[Case]:
    """The smoke suite's L3 cases, and a batch whose zero-context request comes
    before one with context: 0.27.1's final merge stops at ``qsl[1]`` there, so
    the second request's tokens lose their context."""
    smoke = [case for case in load_suite("smoke").cases if case.numeric is not None]
    zero_first = Case("legacy-zero-context-first", (0, 40), (3, 2), 16, 32, numeric=replace(PRESETS["tiny"], seed=5))
    return [*smoke, zero_first]


def bits(tensor: torch.Tensor) -> torch.Tensor:
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[tensor.dtype]
    return tensor.contiguous().view(view)


def case_argument(case: Case) -> dict[str, Any]:
    data = case.to_json()
    assert case.numeric is not None
    data["numeric"] = {**case.numeric.to_json(), "keyless_rows": case.numeric.keyless_rows}
    return data


@pytest.fixture(scope="module")
def legacy_numeric(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("legacy") / "numeric.pt"
    merge = [case.to_json() for case in load_suite("smoke").merge_cases[:6]]
    argument = {"merge": merge, "prefill": [case_argument(c) for c in prefill_cases()], "path": str(path)}
    refused = run_legacy(NUMERIC_SCRIPT, argument)
    loaded: dict[str, Any] = torch.load(path)
    return {**loaded, **{name: {"refused": reason} for name, reason in refused.items()}}


def test_merge_is_bit_exact_with_0_27_1(legacy_numeric: dict[str, Any]) -> None:
    for i, case in enumerate(load_suite("smoke").merge_cases[:6]):
        output, lse = PORT.merge_states(materialise_merge(case))
        expected = legacy_numeric[f"merge{i}"]
        assert torch.equal(bits(output), bits(expected["output"])), case.name
        assert torch.equal(bits(lse), bits(expected["lse"])), case.name


def test_prefill_is_bit_exact_with_0_27_1s_loop(legacy_numeric: dict[str, Any]) -> None:
    compared = 0
    for i, case in enumerate(prefill_cases()):
        assert case.numeric is not None
        inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric)
        expected = legacy_numeric[f"prefill{i}"]
        if "refused" in expected:
            # 0.27.1 refuses the batch (oracle-error in a run); the grid refuses it too.
            with pytest.raises(ValueError, match="equal share of a"):
                PORT.prefill(case, inputs, kernels_for_case(kernels_for("cpu"), case))
            continue
        got = PORT.prefill(case, inputs, kernels_for_case(kernels_for("cpu"), case))
        assert set(got) == set(expected), case.name
        for name, tensor in expected.items():
            assert torch.equal(bits(got[name]), bits(tensor)), f"{case.name}: {name}"
        compared += 1
    assert compared > len(prefill_cases()) // 2


def test_zero_context_first_loses_context_in_0_27_1(legacy_numeric: dict[str, Any]) -> None:
    """The legacy final merge is 0.27.1's, not the pinned oracle's: on the batch
    with its zero-context request first the two oracles' outputs differ."""
    from oracle.numeric import prefill as pinned_prefill

    case = prefill_cases()[-1]
    assert case.numeric is not None
    inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric)
    pinned = pinned_prefill(case, inputs, kernels_for("cpu"))
    legacy = legacy_numeric[f"prefill{len(prefill_cases()) - 1}"]
    first = case.query_lens[0]
    assert torch.equal(bits(pinned["output"][:first]), bits(legacy["output"][:first]))
    assert not torch.equal(bits(pinned["output"][first:]), bits(legacy["output"][first:]))


# -- the pin --------------------------------------------------------------------------------

PIN_SCRIPT = """
from oracle.legacy import trace_legacy
from oracle.pin import OTHER_PINS, check_fingerprints
path = OTHER_PINS / "vllm-0.27.1.json"
RESULT = {
    "traced": sorted(trace_legacy()),
    "statuses": [(s.symbol, s.status) for s in check_fingerprints(path)],
}
"""


def test_the_0_27_1_pin_holds_every_symbol_it_runs() -> None:
    pin = json.loads((ROOT / "oracle" / "pins" / "vllm-0.27.1.json").read_text(encoding="utf-8"))
    result = run_legacy(PIN_SCRIPT, None)
    assert sorted(pin["fingerprints"]) == result["traced"]
    assert all(status == "ok" for _, status in result["statuses"]), result["statuses"]
    assert pin["release_version"] == "0.27.1" and pin["upstream_commit"] is None


def test_layout_json_round_trips(legacy_layouts: dict[str, Any]) -> None:
    """What crosses the process boundary is the whole layout."""
    some = next(v for v in legacy_layouts.values() if v.get("chunks"))
    assert isinstance(layout_from_json(some), Layout) and layout_from_json(some).to_json() == some
