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

from harness.cases.suites import load_suite, workspace_grids
from harness.compare.dense import first_layout_divergence
from harness.kernels import kernels_for, kernels_for_case
from harness.kernels.numeric import case_prefill_inputs, materialise_merge
from harness.model import PRESETS, Case, Layout, layout_from_json
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
    return run_legacy_parts({"only": (script, argument)}, timeout_s)["only"]


def run_legacy_parts(parts: dict[str, tuple[str, Any]], timeout_s: float = 600) -> dict[str, Any]:
    """Each part's script (as :func:`run_legacy`'s) in one process of the 0.27.1
    environment, one after another, each in a namespace of its own: the
    environment's start (its vLLM import) is paid once. Part name: its RESULT."""
    program = "\n".join(
        [
            "import json, sys",
            "from oracle.environment import prepare_cpu_environment",
            "prepare_cpu_environment()",
            # One intra-op thread, as this test process and the harness's processes run.
            "import torch",
            "torch.set_num_threads(1)",
            "PARTS = json.loads(sys.stdin.read())",
            "RESULTS = {}",
            "for name, (script, argument) in PARTS.items():",
            "    space = {'ARGUMENT': argument}",
            "    exec(script, space)",
            "    RESULTS[name] = space['RESULT']",
            "sys.stdout.write('\\nRESULT ' + json.dumps(RESULTS))",
        ]
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [str(LEGACY_PYTHON), "-c", program],
        input=json.dumps({name: [textwrap.dedent(script), argument] for name, (script, argument) in parts.items()}),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, Any] = json.loads(proc.stdout.rsplit("\nRESULT ", 1)[1])
    return results


def layout_cases() -> tuple[Case, ...]:
    smoke = load_suite("smoke").cases
    generated = load_suite("ci", size=GENERATED, numeric_size=0).cases
    return tuple({case.name: case for case in (*smoke, *generated)}.values())


PLAN_SCRIPT = """
from harness.cases.suites import load_suite
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
def legacy_layouts(legacy_answers: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = legacy_answers["plan"]
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
from harness.cases.suites import workspace_grids
from oracle.legacy import LegacyOracleSide
side = LegacyOracleSide()
RESULT = [side.workspace_size(config) for config in workspace_grids(["full", "wide"])]
"""


def test_workspace_size_is_0_27_1s_on_the_whole_grid(legacy_answers: dict[str, Any]) -> None:
    configs = workspace_grids(["full", "wide"])
    legacy = legacy_answers["workspace"]
    assert len(legacy) == len(configs)
    differing = [
        (c.name, a, PORT.workspace_size(c)) for c, a in zip(configs, legacy, strict=True) if a != PORT.workspace_size(c)
    ]
    assert not differing, differing[:5]


REFUSAL_SCRIPT = """
from oracle.legacy import LegacyOracleSide, LegacyRefusal
from oracle.legacy_pin import refusal_cases
side = LegacyOracleSide()
RESULT = []
for case in refusal_cases():
    try:
        side.plan_layout(case)
        RESULT.append(None)
    except LegacyRefusal as exc:
        RESULT.append(str(exc))
"""


def test_refusals_name_their_class(legacy_answers: dict[str, Any]) -> None:
    """Each of 0.27.1's refusals on its own case, with the class's stable reason."""
    from oracle.legacy import LOOP_FAILS, REFUSALS

    reasons = legacy_answers["refusals"]
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
from harness.cases.merge import generate_merge
from harness.model import Case, MergeCase, NumericSpec
from harness.kernels.numeric import case_prefill_inputs, materialise_merge
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
    inputs = case_prefill_inputs(case)
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
def legacy_numeric(legacy_answers: dict[str, Any]) -> dict[str, Any]:
    refused = legacy_answers["numeric"]
    loaded: dict[str, Any] = torch.load(legacy_answers["numeric_path"])
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
        inputs = case_prefill_inputs(case)
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
    inputs = case_prefill_inputs(case)
    pinned = pinned_prefill(case, inputs, kernels_for("cpu"))
    legacy = legacy_numeric[f"prefill{len(prefill_cases()) - 1}"]
    first = case.query_lens[0]
    assert torch.equal(bits(pinned["output"][:first]), bits(legacy["output"][:first]))
    assert not torch.equal(bits(pinned["output"][first:]), bits(legacy["output"][first:]))


# -- L3 under decode context parallelism ---------------------------------------------------------

DCP_SCRIPT = """
import torch
from harness.kernels import kernels_for, kernels_for_case
from harness.model import Case, NumericSpec
from harness.kernels.numeric import case_prefill_inputs
from oracle.legacy import LegacyOracleSide, LegacyRefusal
side = LegacyOracleSide()
out, RESULT = {}, {}
for i, data in enumerate(ARGUMENT["cases"]):
    numeric = NumericSpec(**data.pop("numeric"))
    case = Case(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}, numeric=numeric)
    layout = None
    try:
        layout = side.plan_layout(case)
    except LegacyRefusal as exc:
        layout = str(exc)
    try:
        out[str(i)] = side.prefill(case, case_prefill_inputs(case), kernels_for_case(kernels_for("cpu"), case))
        prefill = None
    except LegacyRefusal as exc:
        prefill = str(exc)
    RESULT[str(i)] = {
        "layout_refusal": layout if isinstance(layout, str) else None,
        "chunks": len(layout.chunks) if not isinstance(layout, str) else 0,
        "prefill_refusal": prefill,
    }
torch.save(out, ARGUMENT["path"])
"""


def dcp_cases() -> list[Case]:
    """DCP batches 0.27.1 plans and runs (worlds 2 and 3, interleaves 1 and 2,
    each several chunks, so every later chunk merges into the running partial)
    and one whose plan its DCP loop cannot run (local windows overflowing the
    all-gather slot)."""
    tiny = PRESETS["tiny"]
    return [
        Case("legacy-dcp-w2", (40, 23), (2, 3), 16, 64, dcp_world_size=2, numeric=replace(tiny, seed=11)),
        Case(
            "legacy-dcp-w2-i2",
            (70, 0, 33),
            (1, 2, 2),
            16,
            64,
            dcp_world_size=2,
            cp_kv_cache_interleave_size=2,
            numeric=replace(tiny, seed=12, dtype="fp32"),
        ),
        Case("legacy-dcp-w3", (50, 20), (3, 1), 16, 96, dcp_world_size=3, numeric=replace(tiny, seed=13)),
        Case(
            "legacy-dcp-loop-fails",
            (100, 37),
            (1, 1),
            16,
            64,
            dcp_world_size=2,
            cp_kv_cache_interleave_size=64,
            numeric=replace(tiny, seed=14),
        ),
    ]


@pytest.fixture(scope="module")
def legacy_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """0.27.1's plans, workspace sizes, refusals, merges and prefills (DCP's
    among them), from one process of its environment (one vLLM import)."""
    folder = tmp_path_factory.mktemp("legacy")
    merge = [case.to_json() for case in load_suite("smoke").merge_cases[:6]]
    numeric = {"merge": merge, "prefill": [case_argument(c) for c in prefill_cases()], "path": str(folder / "n.pt")}
    dcp = {"cases": [case_argument(c) for c in dcp_cases()], "path": str(folder / "dcp.pt")}
    parts = {
        "plan": (PLAN_SCRIPT, GENERATED),
        "workspace": (WORKSPACE_SCRIPT, None),
        "refusals": (REFUSAL_SCRIPT, None),
        "numeric": (NUMERIC_SCRIPT, numeric),
        "dcp": (DCP_SCRIPT, dcp),
    }
    return {**run_legacy_parts(parts), "numeric_path": numeric["path"], "dcp_path": dcp["path"]}


@pytest.fixture(scope="module")
def legacy_dcp(legacy_answers: dict[str, Any]) -> dict[str, Any]:
    return {"result": legacy_answers["dcp"], "tensors": torch.load(legacy_answers["dcp_path"])}


def test_dcp_prefill_is_bit_exact_with_0_27_1s_dcp_loop(legacy_dcp: dict[str, Any]) -> None:
    """0.27.1's own DCP loop (once per rank, on every rank's cache) and equal_share
    agree bit for bit wherever 0.27.1 runs the plan, several chunks included."""
    compared = set()
    for i, case in enumerate(dcp_cases()):
        outcome = legacy_dcp["result"][str(i)]
        if outcome["prefill_refusal"] is not None:
            continue
        assert case.numeric is not None and outcome["chunks"] > 1, case.name
        inputs = case_prefill_inputs(case)
        assert inputs.dcp is not None and inputs.dcp.world_size == case.dcp_world_size
        expected = legacy_dcp["tensors"][str(i)]
        got = PORT.prefill(case, inputs, kernels_for_case(kernels_for("cpu"), case))
        assert set(got) == set(expected) == {"context_output", "context_lse", "output", "lse"}, case.name
        for name, tensor in expected.items():
            assert torch.equal(bits(got[name]), bits(tensor)), f"{case.name}: {name}"
        compared.add(case.dcp_world_size)
    assert compared == {2, 3}


def test_dcp_prefill_needs_the_other_ranks_rows(legacy_dcp: dict[str, Any]) -> None:
    """The legacy context partial depends on every rank's cache: with one other
    rank's context rows changed, equal_share's partial moves, so the bit-exact
    match above is not a match of rank 0's rows alone."""
    case = dcp_cases()[0]
    inputs = case_prefill_inputs(case)
    assert inputs.dcp is not None
    other = inputs.dcp.cache(1)
    shifted = replace(other, kv_cache=other.kv_cache * 2)
    caches = (inputs.dcp.caches[0], shifted)
    moved = replace(inputs, dcp=replace(inputs.dcp, caches=caches))
    kernels = kernels_for_case(kernels_for("cpu"), case)
    expected = legacy_dcp["tensors"]["0"]
    got = PORT.prefill(case, moved, kernels)
    assert not torch.equal(bits(got["context_output"]), bits(expected["context_output"]))


def test_dcp_prefill_refuses_as_the_layout_level_does(legacy_dcp: dict[str, Any]) -> None:
    """A plan 0.27.1's DCP loop cannot run is refused at L3 with the class the
    layout level gives it; a plan it runs is refused at neither."""
    from oracle.legacy import LOOP_FAILS

    refused = 0
    for i, case in enumerate(dcp_cases()):
        outcome = legacy_dcp["result"][str(i)]
        assert outcome["prefill_refusal"] == outcome["layout_refusal"], case.name
        if outcome["prefill_refusal"] is not None:
            assert outcome["prefill_refusal"].startswith(LOOP_FAILS), case.name
            refused += 1
    assert refused == 1


def test_served_dcp_prefill_rebuilds_the_ranks_and_checks_the_sent_cache() -> None:
    """Through the served process (as ``--oracle vllm==0.27.1`` runs it): the
    result is the in-process one's bits, and a cache that is not the case's
    own fails the item loudly, never as a refusal."""
    from oracle.process import OracleProcessError, OracleRefusal, open_oracle_process

    case = dcp_cases()[2]
    kernels = kernels_for_case(kernels_for("cpu"), case)
    process, _ = open_oracle_process("0.27.1")
    try:
        served = process.prefill(case, case_prefill_inputs(case), kernels)
        expected = PORT.prefill(case, case_prefill_inputs(case), kernels)
        for name, tensor in expected.items():
            assert torch.equal(bits(served[name]), bits(tensor)), name
        inputs = case_prefill_inputs(case)
        tampered = inputs.kv_cache.clone()
        tampered.view(-1)[torch.isfinite(tampered.view(-1)).nonzero()[0]] += 1
        with pytest.raises(OracleProcessError, match="rebuilt here differs") as raised:
            process.prefill(case, replace(inputs, kv_cache=tampered), kernels)
        assert not isinstance(raised.value, OracleRefusal)
    finally:
        process.close()


# -- the pin --------------------------------------------------------------------------------

PIN_SCRIPT = """
import pathlib, tempfile
from oracle.legacy_pin import trace_legacy
from oracle.pin import OTHER_PINS, check_fingerprints
from oracle.serve import hello
from tests.edited_vllm import edited_module
path = OTHER_PINS / "vllm-0.27.1.json"
RESULT = {
    "traced": sorted(trace_legacy()),
    "statuses": [(s.symbol, s.status) for s in check_fingerprints(path)],
}
# What this release's process answers a start with while one sparse symbol is
# edited in a copy of its module.
with tempfile.TemporaryDirectory() as folder, edited_module(ARGUMENT, pathlib.Path(folder)):
    RESULT["edited_hello"] = hello()
"""

# A sparse symbol of 0.27.1 the legacy oracle's sparse-mask level and L3 run.
EDITED = "vllm.model_executor.layers.attention.sparse_mla_attention:SparseMLACommonImpl._remap_topk_to_ranges"


@pytest.fixture(scope="module")
def legacy_pin_run() -> dict[str, Any]:
    """0.27.1's trace, its pin's statuses, and its hello with ``EDITED`` edited
    in a copy of its module (one process, in the 0.27.1 environment)."""
    result: dict[str, Any] = run_legacy(PIN_SCRIPT, EDITED)
    return result


def test_the_0_27_1_pin_holds_every_symbol_it_runs(legacy_pin_run: dict[str, Any]) -> None:
    from oracle.pin import READ_VALUES, TRANSCRIBED

    pin = json.loads((ROOT / "oracle" / "pins" / "vllm-0.27.1.json").read_text(encoding="utf-8"))
    # Every symbol it runs, the sparse levels' included, and the code its sparse oracle transcribes.
    assert sorted(pin["fingerprints"]) == sorted({*legacy_pin_run["traced"], *TRANSCRIBED, *READ_VALUES})
    assert EDITED in pin["fingerprints"]
    assert all(status == "ok" for _, status in legacy_pin_run["statuses"]), legacy_pin_run["statuses"]
    assert pin["release_version"] == "0.27.1" and pin["upstream_commit"] is None


def test_a_sparse_symbol_edited_in_0_27_1_refuses_its_start(
    legacy_pin_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 0.27.1 process's hello, with one sparse symbol edited in a copy of its
    module, names it drifted; a start on that hello is refused naming it."""
    from harness.engine import UsageError, open_oracle

    hello = legacy_pin_run["edited_hello"]
    drifted = [(s["symbol"], s["status"]) for s in hello["fingerprints"] if s["status"] != "ok"]
    assert drifted == [(EDITED, "mismatch")]

    class Served:
        name = "oracle vllm==0.27.1"
        closed = False

        def close(self) -> None:
            self.closed = True

    served = Served()
    monkeypatch.setattr("oracle.process.open_oracle_process", lambda release: (served, hello))
    with pytest.raises(UsageError) as refused:
        open_oracle(False, "vllm==0.27.1")
    pinned = json.loads((ROOT / "oracle" / "pins" / "vllm-0.27.1.json").read_text(encoding="utf-8"))
    expected = pinned["fingerprints"][EDITED]
    assert str(refused.value).startswith(f"oracle fingerprint mismatch: {EDITED} (pinned {expected}, installed ")
    assert served.closed


def test_layout_json_round_trips(legacy_layouts: dict[str, Any]) -> None:
    """What crosses the process boundary is the whole layout."""
    some = next(v for v in legacy_layouts.values() if v.get("chunks"))
    assert isinstance(layout_from_json(some), Layout) and layout_from_json(some).to_json() == some
