"""Every PASS is earned (issue 11, holes 1, 3 and 4): an empty selection is
usage, resumed rows are keyed by item id under a header that must match, and a
Python port's values are type-checked with no coercion."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cli import main
from tests.cli_in_process import parity_in_process

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "cases" / "smoke"


def parity(*argv: str) -> subprocess.CompletedProcess[str]:
    """A subprocess, for the tests whose subject is how the process ends; the
    usage errors run in this process (tests/cli_in_process.py)."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )


def refused(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert expected in proc.stderr


# -- hole 1: nothing compared is not a pass ------------------------------------------------


def test_run_selecting_no_items_is_usage() -> None:
    proc = parity_in_process("run", "--cases", str(SMOKE / "giant-middle.json"), "--level", "prefill")
    refused(proc, "selects no items: nothing would be compared")


def test_gate_selecting_no_items_is_usage(tmp_path: Path) -> None:
    proc = parity_in_process(
        "gate", "--cases", str(SMOKE / "giant-middle.json"), "--level", "merge", "--out", str(tmp_path)
    )
    refused(proc, "selects no items")
    assert not (tmp_path / "summary.md").exists()


def test_run_on_a_shard_with_no_items_is_usage() -> None:
    proc = parity_in_process("run", "--cases", str(SMOKE / "giant-middle.json"), "--level", "layout", "--shard", "2/2")
    refused(proc, "shard 2/2 selects no items")


def test_diff_at_a_level_the_case_lacks_is_usage() -> None:
    refused(
        parity_in_process("diff", "smoke/smoke-upstream-worst-case", "--port", "equal_share", "--level", "merge"),
        "--level merge selects no items of a layout-only case",
    )
    refused(parity_in_process("diff", "smoke/smoke-upstream-worst-case", "--level", "prefill"), "selects no items")


def test_nightly_selecting_no_items_is_usage(tmp_path: Path) -> None:
    proc = parity_in_process(
        "nightly", "--size", "0", "--numeric-size", "0", "--level", "merge", "--ports", "per_request",
        "--out", str(tmp_path), "--skip-mutants",
    )  # fmt: skip
    refused(proc, "port per_request: suite nightly at level merge selects no items")


# -- hole 3: resume trusts nothing by position ---------------------------------------------


def test_resume_with_other_cases_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "rows.jsonl"
    first = ["run", "--cases", str(SMOKE / "giant-middle.json"), "--level", "layout", "--results", str(results)]
    assert main(first) == 0
    capsys.readouterr()
    other = ["run", "--cases", str(SMOKE / "upstream-worst-case.json"), "--level", "layout"]
    assert main([*other, "--results", str(results), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "field 'header.items_digest'" in err and "refusing to resume" in err


def test_resume_with_another_port_spelling_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "rows.jsonl"
    run = ["run", "--cases", str(SMOKE / "giant-middle.json"), "--level", "layout", "--results", str(results)]
    assert main(run) == 0
    assert main([*run, "--resume", "--port", "ports.per_request:PORT"]) == 2
    assert "field 'header.port_spec'" in capsys.readouterr().err


def test_resume_refuses_rows_of_items_not_in_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "rows.jsonl"
    cases = [str(SMOKE / "giant-middle.json"), str(SMOKE / "giant-first.json")]
    run = ["run", "--cases", *cases, "--level", "layout", "--results", str(results)]
    assert main(run) == 0
    lines = results.read_text().splitlines()
    row = json.loads(lines[1])
    row["id"] = "smoke-upstream-worst-case[layout]"
    results.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    assert main([*run, "--resume"]) == 2
    assert "row 'smoke-upstream-worst-case[layout]' is not an item of this run" in capsys.readouterr().err


def test_resume_is_keyed_by_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows of a results file are matched to items by id, so a resumed run skips
    exactly the items it holds and runs the others, whatever their order in the file."""
    results = tmp_path / "rows.jsonl"
    cases = [str(SMOKE / name) for name in ("giant-middle.json", "giant-first.json", "giant-last.json")]
    run = ["run", "--cases", *cases, "--level", "layout", "--results", str(results)]
    assert main(run) == 0
    header, *rows = results.read_text().splitlines()
    kept = [rows[2], rows[0]]  # out of order, the middle item missing
    results.write_text("\n".join([header, *kept]) + "\n")
    capsys.readouterr()
    assert main([*run, "--resume"]) == 0
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()[1:]]
    assert sorted(ids) == sorted(json.loads(r)["id"] for r in rows) and len(ids) == 3


# -- hole 4: a Python port's values are typed strictly -------------------------------------


def run_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, *argv: str) -> tuple[int, list[dict]]:  # type: ignore[type-arg]
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--port", f"tests.value_ports:{port}", "--results", str(results), *argv])
    capsys.readouterr()
    return code, [json.loads(line) for line in results.read_text().splitlines()[1:]]


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        ("FloatFieldPort", "chunks[0].num_context_tokens: float 60496.0, not int"),
        ("BoolIntPort", "chunks[0].request_start: bool False, not int"),
        ("FloatInSequencePort", "chunks[0].seq_lens[0]: float 60000.0, not int"),
        ("NumpyArrayPort", "chunks[0].token_to_seq: numpy.ndarray, not a tuple of int"),
        ("ListInsteadOfTuplePort", "chunks[0].starts: list, not a tuple of int"),
        ("IntContinuationPort", "chunks[0].is_continuation: int 0, not bool"),
    ],
)
def test_layout_values_are_typed_without_coercion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, expected: str
) -> None:
    code, rows = run_rows(tmp_path, capsys, port, "--cases", str(SMOKE / "upstream-worst-case.json"))
    assert code == 1
    assert rows[0]["status"] == "port-error", rows[0]
    assert rows[0]["detail"] == f"PortValueError: plan_layout: {expected}"


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        ("FractionalWorkspacePort", "workspace_size returned: float 16384.7, not int"),
        ("NumpyWorkspacePort", "workspace_size returned: numpy.int64 16384, not int"),
    ],
)
def test_workspace_size_is_an_int(tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, expected: str) -> None:
    code, rows = run_rows(tmp_path, capsys, port, "--suite", "smoke", "--level", "layout")
    workspace = [r for r in rows if r["kind"] == "workspace"]
    assert code == 1 and workspace
    assert all(r["status"] == "port-error" for r in workspace)
    assert any(r["detail"] == f"PortValueError: {expected}" for r in workspace), workspace[0]["detail"]


def test_a_numpy_merge_output_is_a_port_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = run_rows(tmp_path, capsys, "NumpyMergePort", "--suite", "smoke", "--level", "merge")
    assert code == 1 and rows
    assert all(r["status"] == "port-error" for r in rows)
    assert rows[0]["detail"] == "PortValueError: port's 'output': numpy.ndarray, not a torch.Tensor"


def test_an_unwritable_json_report_keeps_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report that cannot be written is one line on stderr; the rows already
    computed stay in the results file and a divergence still exits 1."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    results = tmp_path / "rows.jsonl"
    code = main([
        "run", "--cases", str(SMOKE / "upstream-worst-case.json"), "--port", "equal_share", "--level", "layout",
        "--results", str(results), "--json", str(blocker / "out.json"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot write the report" in err and "Traceback" not in err
    assert len(results.read_text().splitlines()) == 2
    shutil.rmtree(tmp_path)


# -- hole 6 (merge part): shards of another oracle or device are not one run ------------


GIANT_CASES = [str(SMOKE / "giant-middle.json"), str(SMOKE / "giant-first.json")]


def gate_shards(tmp_path: Path) -> list[Path]:
    """The two shards' outputs of a layout gate of two smoke cases."""
    shards = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        main(["gate", "--cases", *GIANT_CASES, "--level", "layout", "--shard", f"{k}/2", "--out", str(out)])
        shards.append(out)
    return shards


@pytest.mark.parametrize(("key", "value"), [("device", "cuda"), ("oracle_drift_overridden", True), ("pin", "x @ y")])
def test_merge_refuses_gate_shards_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: object
) -> None:
    shards = gate_shards(tmp_path)
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    meta_path = shards[1] / "gate.json"
    meta = json.loads(meta_path.read_text())
    meta[key] = value
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 2
    assert f"field '{key}': differs" in capsys.readouterr().err


def test_gate_shards_from_different_cpus_merge_and_name_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shards on two CPUs judge the same inputs (docs/levels.md): they merge into
    the table one machine gives, and the merged gate.json and JUnit name both CPUs."""
    shards = gate_shards(tmp_path)
    main(["gate", "--cases", *GIANT_CASES, "--level", "layout", "--out", str(tmp_path / "whole")])
    meta_path = shards[1] / "gate.json"
    meta = json.loads(meta_path.read_text())
    here = meta["provenance"]["environment"]["cpu"]
    meta["provenance"]["environment"] |= {"cpu": "Another CPU", "cpu_capability": "DEFAULT"}
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    merged = pd.read_parquet(tmp_path / "merged" / "results.parquet")
    whole = pd.read_parquet(tmp_path / "whole" / "results.parquet")
    columns = ["id", "status", "detail"]
    assert merged[columns].equals(whole[columns])
    environment = json.loads((tmp_path / "merged" / "gate.json").read_text())["provenance"]["environment"]
    assert environment["cpu"] == f"{here}; Another CPU"
    junit = (tmp_path / "merged" / "junit.xml").read_text()
    assert f'name="cpu" value="{here}; Another CPU"' in junit


def test_nightly_merge_refuses_shards_of_another_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = []
    for k in (1, 2):
        out = tmp_path / f"night{k}"
        argv = ["nightly", "--size", "20", "--numeric-size", "0", "--level", "layout", "--ports", "per_request"]
        main([*argv, "--skip-mutants", "--explore-budget-s", "0", "--shard", f"{k}/2", "--out", str(out),
              "--date", "2026-01-01"])  # fmt: skip
        shards.append(out / "2026-01-01")
    meta_path = next(shards[1].glob("*.json"))
    for path in shards[1].glob("*.json"):
        if "provenance" in json.loads(path.read_text()):
            meta_path = path
    meta = json.loads(meta_path.read_text())
    meta["provenance"]["environment"]["device"] = "NVIDIA H200"
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    code = main(["nightly", "--from-shards", *map(str, shards), "--out", str(tmp_path / "merged")])
    assert code == 2
    assert "field 'device': is 'NVIDIA H200'" in capsys.readouterr().err


def test_a_failing_shrink_keeps_the_gate_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate's shrink step cannot write its case file (``shrunk`` is a file):
    the gate still writes every output and exits 1 for the divergence."""
    out = tmp_path / "gate"
    out.mkdir()
    (out / "shrunk").write_text("in the way")
    argv = ["gate", "--cases", str(SMOKE / "upstream-worst-case.json"), "--port", "equal_share", "--level", "layout"]
    code = main([*argv, "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 1, printed.err
    assert "Traceback" not in printed.out + printed.err
    assert {"summary.md", "junit.xml", "results.parquet", "gate.json"} <= {p.name for p in out.iterdir()}
    assert "not shrunk (" in json.loads((out / "gate.json").read_text())["shrunk"]["smoke-upstream-worst-case[layout]"]


# -- what review found: exits, odd messages, odd declarations -------------------------------


def test_a_port_calling_sys_exit_is_a_port_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = run_rows(tmp_path, capsys, "ExitingPort", "--cases", str(SMOKE / "giant-middle.json"),
                          "--level", "layout")  # fmt: skip
    assert code == 1
    assert rows[0]["status"] == "port-error" and rows[0]["detail"] == "SystemExit: 0"


def test_an_unprintable_port_error_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gate"
    code = main(["gate", "--cases", str(SMOKE / "giant-middle.json"), "--level", "layout",
                 "--port", "tests.value_ports:UnprintableErrorPort", "--out", str(out)])  # fmt: skip
    capsys.readouterr()
    assert code == 1
    import xml.etree.ElementTree as ET

    failure = ET.parse(out / "junit.xml").getroot().find(".//failure")
    assert failure is not None and "\\x1b[31mred" in (failure.get("message") or "") + (failure.text or "")


def test_a_port_with_malformed_levels_is_usage() -> None:
    refused(parity_in_process("run", "--suite", "smoke", "--port", "tests.value_ports:BadLevelsPort"),
            "port levels must be a tuple of level names, got int 5")  # fmt: skip


def test_a_tensor_on_another_device_is_a_port_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = run_rows(tmp_path, capsys, "MetaDeviceMergePort", "--suite", "smoke", "--level", "merge")
    assert code == 1 and rows
    assert rows[0]["detail"] == "PortValueError: port's 'output': on meta, but the run is on cpu"


def test_external_json_is_not_coerced() -> None:
    from harness.model import layout_from_json

    chunkless: dict[str, object] = {"chunks": []}
    with pytest.raises(ValueError, match="must be a list of integers"):
        layout_from_json({**chunkless, "empty_token_slices": [[7.9, 14.0]]})
    with pytest.raises(ValueError, match="must be a list of integers"):
        layout_from_json({**chunkless, "empty_token_slices": [["7", "14"]]})
    assert layout_from_json({**chunkless, "empty_token_slices": [[7, 14]]}).empty_token_slices == ((7, 14),)
    from harness.model import chunk_from_json
    from harness.sides.loading import load_port
    from tests.conftest import make_case

    chunk = load_port("per_request").plan_layout(make_case([40, 8])).chunks[0].to_json()
    chunk["token_to_seq"] = [[value, True] for value, _ in chunk["token_to_seq"]]
    with pytest.raises(ValueError, match="'token_to_seq' must be a list of integers"):
        chunk_from_json(chunk)


def test_merge_refuses_shards_whose_items_are_not_the_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two shards of runs over the same files in another order: each shard's
    indices are unique, but together they are not one run's items."""
    a, b = str(SMOKE / "uniform-fit.json"), str(SMOKE / "upstream-worst-case.json")
    for k, files in ((1, [a, b]), (2, [b, a])):
        main(["gate", "--cases", *files, "--port", "equal_share", "--level", "layout", "--shard", f"{k}/2",
              "--out", str(tmp_path / f"s{k}")])  # fmt: skip
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == 2
    assert "field 'items_digest'" in capsys.readouterr().err


def test_output_files_do_not_change_the_source_digest(tmp_path: Path) -> None:
    """Resume identity follows the sources, not git's dirty flag: a results file
    written into the tree does not make a resume refuse itself."""
    from harness.verdicts.provenance import source_digest

    root = tmp_path / "tree"
    shutil.copytree(ROOT / "harness", root / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("oracle", "ports", "cases"):
        (root / folder).mkdir()
    before = source_digest(root)
    (root / "run.jsonl").write_text("{}\n")
    (root / "reports").mkdir()
    (root / "reports" / "x.json").write_text("{}")
    assert source_digest(root) == before
    (root / "harness" / "sides" / "runner.py").write_text(
        (root / "harness" / "sides" / "runner.py").read_text() + "\n# edit\n"
    )
    assert source_digest(root) != before


def test_nightly_exit_follows_the_requested_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nightly", "--size", "0", "--numeric-size", "1", "--ports", "tests.fault_ports:NoNumericPort",
            "--skip-mutants", "--explore-budget-s", "0", "--out", str(tmp_path), "--date", "2026-01-01"]  # fmt: skip
    assert main(argv) == 1
    assert "layout-only    INCOMPLETE" in capsys.readouterr().out


def test_sys_exit_in_close_or_construction_never_passes(tmp_path: Path) -> None:
    proc = parity("run", "--cases", str(SMOKE / "upstream-worst-case.json"), "--level", "layout",
                  "--port", "tests.value_ports:CloseExitPort")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-1000:] + proc.stderr
    assert "verdict FAIL" in proc.stdout and "close() raised SystemExit(0)" in proc.stderr
    refused(parity("run", "--suite", "smoke", "--port", "tests.value_ports:ConstructorExitPort"),
            "loading it raised SystemExit: 0")  # fmt: skip


def test_a_port_calling_pytest_skip_fails_in_the_plugin() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--parity-suite", "smoke",
         "--parity-level", "layout", "--parity-port", "tests.value_ports:PytestSkipPort", "-k", "giant-middle"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 failed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
    assert "Skipped: kernel library missing" in proc.stdout


def test_nightly_shards_must_add_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nightly", "--size", "20", "--numeric-size", "0", "--level", "layout", "--ports", "per_request",
            "--skip-mutants", "--explore-budget-s", "0", "--shard", "1/2", "--out", str(tmp_path / "n1"),
            "--date", "2026-01-01"]  # fmt: skip
    main(argv)
    shard = str(tmp_path / "n1" / "2026-01-01")
    capsys.readouterr()
    assert main(["nightly", "--from-shards", shard, "--out", str(tmp_path / "m")]) == 2
    assert "field 'items_digest': port per_request" in capsys.readouterr().err
    assert main(["nightly", "--from-shards", shard, shard, "--out", str(tmp_path / "m")]) == 2


# -- the oracle's values and a run's completeness ------------------------------------------


def test_an_oracle_layout_typed_loosely_is_an_oracle_error() -> None:
    """An int where the oracle's bool belongs would compare equal to the port's
    bool only after coercion: the oracle's layout is typed like the port's."""
    from harness.cases.files import load_case_file
    from harness.cases.suites import load_suite
    from harness.protocol.port import PortValueError
    from harness.sides.items import ORACLE_ERROR
    from harness.sides.oracle_cache import CachedOracle
    from harness.sides.runner import compare_case, compare_workspace
    from ports.per_request import PerRequestPort
    from tests.value_ports import IntContinuationPort, NumpyWorkspacePort

    port = PerRequestPort()
    case = load_case_file(SMOKE / "upstream-worst-case.json")[0]
    # The oracle as the runner calls it: plain, and behind the cache (which checks instead).
    for oracle in (IntContinuationPort(), CachedOracle(IntContinuationPort(), "0" * 64, None)):
        for _ in range(2):  # a mistyped answer is never kept: the second call is checked too
            result = compare_case(oracle, port, case)
            assert result.status == ORACLE_ERROR
            assert result.error == "PortValueError: plan_layout: chunks[0].is_continuation: int 0, not bool"
    # The cache keeps its promise (returns_checked_layouts) itself, not through the runner.
    with pytest.raises(PortValueError, match="is_continuation: int 0, not bool"):
        CachedOracle(IntContinuationPort(), "0" * 64, None).plan_layout(case)
    config = load_suite("smoke").workspace_configs[0]
    sized = compare_workspace(NumpyWorkspacePort(), port, config)  # equal to the int: coercion
    assert sized.status == ORACLE_ERROR
    assert (sized.error or "").startswith("PortValueError: the oracle's workspace_size returned: numpy.int64")


def test_an_item_the_run_loses_is_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result stream that ends one item short (a harness fault) leaves that
    item not-run: the verdict is INCOMPLETE, never PASS."""
    import harness.sides.item_stream
    from harness.sides.item_stream import ItemStream

    real = harness.sides.item_stream.stream_items

    def one_short(*args: Any, **kwargs: Any) -> ItemStream:
        return ItemStream(iter(list(real(*args, **kwargs))[1:]), None)

    monkeypatch.setattr(harness.sides.item_stream, "stream_items", one_short)
    report = tmp_path / "run.json"
    code = main(["run", "--suite", "smoke", "--level", "layout", "--port", "per_request", "--json", str(report)])
    capsys.readouterr()
    summary = json.loads(report.read_text())
    assert code == 1
    assert summary["summary"]["verdict"] == "incomplete", summary["summary"]
    assert summary["summary"]["counts"]["not-run"] == 1
