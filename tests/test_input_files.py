"""Input files read by their kind (issue 44, item 8): ``run --cases`` runs a
sparse item file at the sparse levels, refuses a kind a run cannot hold in one
line naming the file, the kind and the command that reads it, and every JSON
file the harness is given names the line and column of a syntax error."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.cases.fields import CaseError
from harness.cases.files import item_kind, load_case_file, load_item_file, load_run_files
from harness.cases.suites import load_suite
from harness.cli import main
from harness.model.sparse import SparseCase
from tests.cli_in_process import parity_in_process

ROOT = Path(__file__).resolve().parent.parent
GOOD_CASE = {"name": "x", "context_lens": [40, 0], "query_lens": [2, 3], "block_size": 16, "workspace_size": 64}


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One smoke item of every sparse kind, each in a file of its own (the batch
    once with its kind and once without: told apart by its fields)."""
    folder = tmp_path_factory.mktemp("sparse")
    smoke = load_suite("smoke")
    l3 = next(c for c in smoke.sparse_cases if c.numeric is not None)
    plain = next(c for c in smoke.sparse_cases if c.numeric is None)
    documents: dict[str, dict[str, Any]] = {
        "batch": {"kind": "sparse", **plain.to_json()},
        "l3": {"kind": "sparse", **l3.to_json()},
        "mask": {"kind": "topk-mask", **smoke.mask_cases[0].to_json()},
        "config": {"kind": "sparse-workspace", **smoke.sparse_workspace_configs[0].to_json()},
        "merge": smoke.merge_cases[0].to_json(),
    }
    files = {}
    for name, document in documents.items():
        files[name] = folder / f"{name}.json"
        files[name].write_text(json.dumps(document))
    return files


def one_line_exit_2(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr + proc.stdout
    for text in expected:
        assert text in proc.stderr


def test_run_cases_reads_each_sparse_kind_and_runs_it(
    sparse_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kindless = tmp_path / "kindless.json"
    batch = json.loads(sparse_files["batch"].read_text())
    kindless.write_text(json.dumps({k: v for k, v in batch.items() if k != "kind"} | {"name": "kindless"}))
    given = [sparse_files[name] for name in ("batch", "l3", "mask", "config")] + [kindless]
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--jobs", "1", "--results", str(results), "--cases", *map(str, given)])
    capsys.readouterr()
    assert code == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    kinds = sorted(row["id"].rpartition("[")[2].rstrip("]") for row in rows)
    assert kinds == ["sparse-layout"] * 3 + ["sparse-mask", "sparse-prefill", "sparse-workspace"]
    assert {row["status"] for row in rows} == {"parity"}


def test_a_cases_run_prints_ids_diff_reads_back(sparse_files: dict[str, Path]) -> None:
    from harness.verdicts.reproduce import CASES_SUITE, printed_id, reproduce_command, resolve_item

    mask = json.loads(sparse_files["mask"].read_text())
    # (Their folder holds a merge case, which a run refuses: the files are named.)
    paths = [str(sparse_files[name]) for name in ("batch", "l3", "mask", "config")]
    shown = printed_id(f"{mask['name']}[sparse-mask]", CASES_SUITE, None, paths)
    assert shown == f"{sparse_files['mask']}:{mask['name']}[sparse-mask]"
    resolved = resolve_item(shown)
    assert resolved.kind == "sparse-mask" and resolved.item.name == mask["name"]
    command = reproduce_command(
        f"{mask['name']}[sparse-mask]", "sparse-mask", CASES_SUITE, "per_request", case_paths=paths
    )
    assert f"diff {sparse_files['mask']} --port per_request --level sparse-mask" in command
    l3 = json.loads(sparse_files["l3"].read_text())
    found = resolve_item(f"{l3['name']}[sparse-prefill]", case_paths=paths)
    assert found.kind == "sparse-prefill" and isinstance(found.item, SparseCase) and found.item.numeric is not None


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"kind": "workspace", "max_model_len": 100, "max_num_seqs": 2, "block_size": 16},
            "is a workspace configuration (kind workspace), which parity run --cases does not read: "
            "parity diff {} reads it",
        ),
        ({"port": "x", "entries": []}, "is a baseline, not a case or item file: parity gate --baseline {} reads it"),
        ({"summary": {}, "provenance": {}, "cases": []}, "is a run report (parity run --json), not a case or item"),
        ({**GOOD_CASE, "kind": "layout"}, "field 'kind': must be one of workspace, sparse, sparse-workspace, topk"),
    ],
)
def test_run_cases_refuses_a_kind_it_cannot_run(tmp_path: Path, document: dict[str, Any], expected: str) -> None:
    path = tmp_path / "item.json"
    path.write_text(json.dumps(document))
    one_line_exit_2(parity_in_process("run", "--cases", str(path)), f"{path}: ", expected.format(path))


def test_a_merge_case_names_diff(sparse_files: dict[str, Path]) -> None:
    path = sparse_files["merge"]
    proc = parity_in_process("run", "--cases", str(path.parent))
    one_line_exit_2(
        proc, f"{path}: is a merge case, which parity run --cases does not read: parity diff {path} reads it"
    )
    # diff reads it.
    assert load_item_file(path)[0] == "merge"


def test_a_case_list_holds_layout_cases_only(sparse_files: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"cases": [GOOD_CASE, json.loads(sparse_files["batch"].read_text())]}))
    with pytest.raises(CaseError, match=r"list.json#cases\[1\]: is a sparse batch \(kind sparse\): a case list holds"):
        load_run_files([path])
    # A case file reader given a sparse file says what it is and who reads it.
    with pytest.raises(CaseError, match=r"is a sparse batch \(kind sparse\), not a case file \(parity run --cases"):
        load_case_file(sparse_files["batch"])


def test_names_are_unique_across_kinds(sparse_files: dict[str, Path], tmp_path: Path) -> None:
    batch = json.loads(sparse_files["batch"].read_text())
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({**GOOD_CASE, "name": batch["name"]}))
    with pytest.raises(CaseError, match=f"'{batch['name']}' is already defined in"):
        load_run_files([sparse_files["batch"], twin])


def test_kinds_by_fields() -> None:
    assert item_kind({"index_topk": 4, "seq_lens": [3], "query_lens": [1]}, "f") == "sparse-mask"
    assert item_kind({"index_topk": 4, "context_lens": [3], "query_lens": [1]}, "f") == "sparse-layout"
    assert item_kind({"index_topk": 4, "max_model_len": 100}, "f") == "sparse-workspace"
    assert item_kind({"pattern": "random", "num_tokens": 3}, "f") == "merge"
    assert item_kind(GOOD_CASE, "f") == "layout" and item_kind([1], "f") == "layout"


# -- syntax errors: file, line and column, one line, exit 2 ----------------------------------------

BROKEN = '{\n  "name": "x",\n  "context_lens": [1,, 2]\n}\n'
WHERE = "malformed JSON at line 3 column 22: Expecting value"


def test_every_cli_reader_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(BROKEN)
    for argv in (
        ["run", "--cases", str(path)],
        ["diff", str(path)],
        ["gate", "--baseline", str(path), "--suite", "smoke"],
    ):
        one_line_exit_2(parity_in_process(*argv), f"{path}: {WHERE}")


def test_every_library_reader_names_line_and_column(tmp_path: Path) -> None:
    from harness.night.drift import latest_drift_report
    from harness.night.folder import NIGHT_META, read_meta
    from harness.night.gpu_report import latest_gpu_report
    from harness.verdicts.baseline import load_baseline
    from harness.verdicts.gate import META, RESULTS, load_shard
    from harness.verdicts.results_file import read_rows

    gate_dir, night_dir, drift_dir, gpu_dir = (tmp_path / d for d in ("gate", "night", "drift", "gpu"))
    for folder, name in ((gate_dir, META), (night_dir, NIGHT_META), (drift_dir, "2026-01-01.json")):
        folder.mkdir()
        (folder / name).write_text(BROKEN)
    (gate_dir / RESULTS).write_bytes(b"")
    readers: dict[Path, Callable[[], object]] = {
        tmp_path / "baseline.json": lambda: load_baseline(tmp_path / "baseline.json"),
        gate_dir / META: lambda: load_shard(gate_dir),
        night_dir / NIGHT_META: lambda: read_meta(night_dir),
        drift_dir / "2026-01-01.json": lambda: latest_drift_report(drift_dir),
    }
    (tmp_path / "baseline.json").write_text(BROKEN)
    for path, read in readers.items():
        with pytest.raises(CaseError) as caught:
            read()
        assert str(caught.value).startswith(f"{path}: {WHERE}"), str(caught.value)
    # A results file: the line in the file, the column in the line.
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"header": {}}\n{"id": "a[layout]"}\n{"id": ,}\n')
    with pytest.raises(CaseError, match=r"rows.jsonl: malformed JSON at line 3 column 8: .* \(not a results file\)$"):
        read_rows(rows)
    # The night's GPU report is left out, saying where.
    gpu_dir.mkdir()
    (gpu_dir / "2026-01-01.json").write_text(BROKEN)
    said: list[str] = []
    assert latest_gpu_report(gpu_dir, said.append) is None
    assert said == [f"{gpu_dir / '2026-01-01.json'}: not a GPU report, left out of the night ({WHERE})"]


def test_the_gpu_renderer_and_the_symbol_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oracle.sources import parse_symbols
    from reports.gpu import main as gpu_main

    path = tmp_path / "2026-01-01.json"
    path.write_text(BROKEN)
    assert gpu_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"reports.gpu: error: {path}: {WHERE} (not a GPU report)\n"
    with pytest.raises(ValueError, match="malformed JSON at line 2 column 1: Expecting value"):
        parse_symbols([], '["a:b",\n]')
