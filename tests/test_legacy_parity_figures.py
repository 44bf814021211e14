"""tools/legacy_parity_figures.py against the files of a tiny run of equal_share (seeds/000).

One run writes a ``--json`` document and a ``--results`` file; a parquet copy of
the results rows stands in for a gate's ``results.parquet``. Every expected
figure is read from those files' own numbers (the document's summary and its
tensor verdicts), never written down here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from harness.cli import main as parity
from harness.compare.ulp_text import histogram_text, ulp_of_larger_text, ulp_text
from harness.verdicts.results_file import read_rows

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "cases" / "smoke"


def load_tool() -> ModuleType:
    # tools/ is no package (mypy checks it as top-level modules): load the file as the script it is.
    spec = importlib.util.spec_from_file_location("legacy_parity_figures", ROOT / "tools" / "legacy_parity_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TOOL = load_tool()
# bf16 and fp32 items the grid splits differently from the oracle, an fp16 item it
# splits the same way, and a keyless-row case: divergent and bit-exact items of every dtype.
CASE_FILES = ("numeric-single-chunk", "numeric-continuation-fp32", "numeric-continuation-fp16", "keyless-finite")


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("equal-share-run")
    # An equal share below one alignment unit: equal_share raises, so one item has no tensors.
    too_small = json.loads((SMOKE / "numeric-single-chunk.json").read_text())
    too_small.update(name="share-below-one-block", workspace_size=32)
    (folder / "share-below-one-block.json").write_text(json.dumps(too_small))
    cases = [str(SMOKE / f"{name}.json") for name in CASE_FILES] + [str(folder / "share-below-one-block.json")]
    document, rows = folder / "run.json", folder / "rows.jsonl"
    outputs = ["--json", str(document), "--results", str(rows)]
    code = parity(["run", "--cases", *cases, "--port", "equal_share", "--level", "prefill", *outputs])
    assert code in (0, 1) and document.is_file() and rows.is_file()
    _, records = read_rows(rows)
    parquet = folder / "results.parquet"
    pd.DataFrame(records).to_parquet(parquet, index=False)
    return {"document": document, "rows": rows, "parquet": parquet}


def load_document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def by_level(figures: Any) -> pd.DataFrame:
    """The level table summed over dtypes: what every input form can say."""
    table: pd.DataFrame = TOOL.level_table(figures)
    return table.groupby("level")[["items", "compared", "bit-exact"]].sum()


def test_per_level_figures_are_the_runs_own(run_files: dict[str, Path]) -> None:
    document = load_document(run_files["document"])
    numeric = document["summary"]["numeric"]["prefill"]
    counts = document["summary"]["levels"]["prefill"]
    figures = TOOL.load_figures(run_files["document"])
    assert figures.per_tensor
    totals = by_level(figures).loc["prefill"]
    assert totals["items"] == numeric["items"] == sum(counts.values())
    assert totals["bit-exact"] == numeric["bit_exact"]
    assert totals["compared"] == counts["parity"] + counts["divergent"]
    # The run must hold what the test is about: divergent, exact and uncompared items.
    assert counts["divergent"] and counts["parity"] and counts["port-error"]
    # Same buckets, same counts, same (numeric) order.
    assert list(TOOL.level_histograms(figures)["prefill"].items()) == list(numeric["histogram"].items())
    # The row forms (a --results file, a gate's parquet) give the same per-level figures.
    for form in ("rows", "parquet"):
        other = TOOL.load_figures(run_files[form])
        assert not other.per_tensor
        assert by_level(other).equals(by_level(figures)), form
        assert list(TOOL.level_histograms(other)["prefill"].items()) == list(numeric["histogram"].items()), form


def test_per_tensor_figures_are_the_runs_own(run_files: dict[str, Path]) -> None:
    document = load_document(run_files["document"])
    table = TOOL.tensor_table(TOOL.load_figures(run_files["document"])).set_index(["level", "dtype", "tensor"])
    verdicts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case in document["cases"]:
        tensors = case.get("tensors") or []
        dtype = next(t["dtype"] for t in tensors if t["name"] == "output") if tensors else None
        for tensor in tensors:
            verdicts.setdefault((str(dtype), tensor["name"]), []).append(tensor)
    assert len(table) == len(verdicts) and {d for d, _ in verdicts} == {"bfloat16", "float16", "float32"}
    for (dtype, name), tensors in verdicts.items():
        row = table.loc[("prefill", dtype, name)]
        histogram: Counter[str] = Counter()
        for t in tensors:
            histogram.update(t["histogram"])
        elements = sum(int(pd.Series(t["shape"]).prod()) for t in tensors)
        assert row["items"] == len(tensors)
        assert row["bit-exact"] == sum(t["exact"] for t in tensors)
        assert row["elements"] == elements and row["differ"] == sum(t["mismatches"] for t in tensors)
        assert row["max ULP"] == ulp_text(max(t["max_ulp"] for t in tensors))
        assert row["ULP histogram"] == (histogram_text(dict(histogram)) or "-")
        # Measured over the pairs with a distance: not the ones a NaN or an infinity made differ.
        measured = [
            t["max_ulp_of_larger"] for t in tensors if t["mismatches"] - t["nan_mismatches"] - t["inf_mismatches"]
        ]
        assert row["of larger: max"] == (ulp_of_larger_text(max(measured)) if measured else "-")
        if measured:
            # Printed to four digits, as the bounds are when printed the same way.
            quantiles = [float(q) for q in row["p50 / p90 / p99"].split(" / ")]
            low, high = (float(ulp_of_larger_text(v)) for v in (min(measured), max(measured)))
            assert quantiles == sorted(quantiles) and low <= quantiles[0] and quantiles[-1] <= high


def test_row_forms_say_they_sum_tensors(run_files: dict[str, Path]) -> None:
    table = TOOL.tensor_table(TOOL.load_figures(run_files["parquet"]))
    assert set(table["tensor"]) == {TOOL.ALL_TENSORS}


def test_cli_prints_the_tables(run_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert TOOL.main([str(run_files["document"])]) == 0
    out = capsys.readouterr().out
    assert "## Items per level and dtype" in out and "| prefill | float32 | context_output |" in out
    assert "NOT bit-exact" in out and "port-error 1" in out


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("missing.json", None, "no such file"),
        ("garbage.json", "not json at all\n", "line 1"),
        ("list.json", "[1, 2]\n", "not a JSON object: not a results file"),
        ("scalar.jsonl", '{"header": {}}\n5\n', "not a JSON object"),
        ("no-tensors.json", json.dumps({"cases": [{"kind": "prefill"}]}), "field 'name' is missing"),
        ("bad.parquet", "PAR1 not really", "not a parquet file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str | None, reason: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert TOOL.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and reason in lines[0], captured.err
    assert "Traceback" not in captured.err
