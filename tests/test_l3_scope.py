"""What an L3 item compared, said for each kind of port, and the one plan a
port makes per case: the layout an external port's prefill request ran on must
be the one it returned for the same case at L1 in the same run."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.model.levels import level_spec

ROOT = Path(__file__).resolve().parent.parent
CASE_FILE = "cases/smoke/numeric-single-chunk.json"
CASE = "smoke-numeric-single-chunk"


def fake(fault: str) -> str:
    program = shlex.join([sys.executable, str(ROOT / "tests" / "fake_external_port.py")])
    return f"cmd:{program} --prefill --fault {fault} --on {CASE}"


def test_an_external_port_that_plans_again_for_its_prefill_is_a_port_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run.json"
    code = main(["run", "--cases", CASE_FILE, "--port", fake("replan-for-prefill"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 1, printed
    items = {(item["name"], item["kind"]): item for item in json.loads(out.read_text())["cases"]}
    assert items[CASE, "layout"]["status"] == "parity"
    prefill = items[CASE, "prefill"]
    assert prefill["status"] == "port-error", prefill
    assert "another layout than the one the port returned for this case at L1" in json.dumps(prefill)
    assert f"port-error cases/smoke/numeric-single-chunk.json:{CASE}[prefill]" in printed, printed


def test_each_kind_of_port_says_what_its_l3_compared(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "--cases", CASE_FILE, "--port", fake("none")]) == 0
    external = capsys.readouterr().out
    assert f"prefill compared {level_spec('prefill').compares_over_protocol}" in external
    assert main(["run", "--cases", CASE_FILE, "--port", "per_request", "--json", str(tmp_path / "r.json")]) == 0
    in_process = capsys.readouterr().out
    assert f"prefill compared {level_spec('prefill').compares}" in in_process
    compared = json.loads((tmp_path / "r.json").read_text())["summary"]["l3_compares"]
    assert compared == {"prefill": level_spec("prefill").compares}
    gate_out = tmp_path / "gate"
    assert main(["gate", "--cases", CASE_FILE, "--port", fake("none"), "--out", str(gate_out)]) == 0
    assert f"prefill compared {level_spec('prefill').compares_over_protocol}." in (gate_out / "summary.md").read_text()
    assert str(level_spec("prefill").compares_over_protocol) in (gate_out / "junit.xml").read_text()


def test_sharded_gates_merged_still_catch_a_prefill_on_another_layout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Shards interleave items, so a case's L1 and L3 items land in different
    shards, each of which sees only one of the port's answers: the check runs
    again on the merged table. (The shard of the L3 item is made to record
    another layout digest, as a port that plans differently on that path would.)"""
    import pandas as pd

    for shard in ("1/2", "2/2"):
        out = tmp_path / shard.replace("/", "-")
        assert main(["gate", "--cases", CASE_FILE, "--port", fake("none"), "--shard", shard, "--out", str(out)]) == 0
    capsys.readouterr()
    shards = [pd.read_parquet(tmp_path / d / "results.parquet") for d in ("1-2", "2-2")]
    prefill_shard = next(i for i, t in enumerate(shards) if (t["kind"] == "prefill").any())
    layout_digest = next(t for t in shards if (t["kind"] == "layout").any())["port_layout_digest"].iloc[0]
    table = shards[prefill_shard]
    assert table.loc[table["kind"] == "prefill", "port_layout_digest"].iloc[0] == layout_digest
    table.loc[table["kind"] == "prefill", "port_layout_digest"] = "another-layout"
    table.to_parquet(tmp_path / ("1-2", "2-2")[prefill_shard] / "results.parquet", index=False)
    code = main(["merge", str(tmp_path / "1-2"), str(tmp_path / "2-2"), "--out", str(tmp_path / "merged")])
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert code == 1 and "another layout than the one the port returned for this case at L1" in summary, summary


def test_the_nightly_page_says_what_l3_compared(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = ["--size", "0", "--numeric-size", "1", "--level", "prefill", "--skip-mutants", "--explore-budget-s", "0"]
    main(["nightly", "--ports", fake("none"), *small, "--out", str(tmp_path), "--date", "2026-12-02"])
    capsys.readouterr()
    night = tmp_path / "2026-12-02"
    assert f"prefill compared {level_spec('prefill').compares_over_protocol}" in (night / "report.md").read_text()
    assert "prefill compared the port&#x27;s layout and its fold and merge only" in (night / "index.html").read_text()


def test_an_external_port_s_sparse_l3_says_it_compared_the_fold_only(
    capsys: pytest.CaptureFixture[str], cpp_port: Path
) -> None:
    argv = ["run", "--suite", "smoke", "--level", "sparse-prefill", "--port", f"cmd:{cpp_port}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"sparse-prefill compared {level_spec('sparse-prefill').compares_over_protocol}" in out
    assert main(["run", "--suite", "smoke", "--level", "sparse-prefill", "--port", "per_request"]) == 0
    assert f"sparse-prefill compared {level_spec('sparse-prefill').compares}" in capsys.readouterr().out


def test_the_layout_digest_tells_apart_every_field_and_boundary() -> None:
    """The digest the rows record (and this file's L1-against-L3 check reads):
    equal for equal layouts, different when any one value of any chunk field
    changes, when a value moves across a tuple's end, or when a DCP field is
    None instead of empty."""
    import dataclasses

    from harness.cases.suites import load_suite
    from ports.per_request import PORT

    cases = [c for c in load_suite("smoke").cases if c.dcp_world_size > 1][:1]
    cases += [c for c in load_suite("smoke").cases if c.dcp_world_size == 1][:1]
    for case in cases:
        layout = PORT.plan_layout(case)
        again = PORT.plan_layout(case)
        assert layout == again and layout.digest() == again.digest()
        first = layout.chunks[0]
        changed: list[dict[str, Any]] = []
        for name, value in vars(first).items():
            if type(value) is bool:
                changed.append({name: not value})
            elif type(value) is int:
                changed.append({name: value + 1})
            elif type(value) is tuple and value and type(value[0]) is tuple:
                changed.append({name: (value[0] + (0,), *value[1:])})
            elif type(value) is tuple:
                changed.append({name: (*value, 0)})
                if value:
                    changed.append({name: (*value[:-1], value[-1] + 1)})
            elif value is None:
                changed.append({name: ()})
        assert changed
        digests = {layout.digest()}
        for change in changed:
            other = dataclasses.replace(layout, chunks=(dataclasses.replace(first, **change), *layout.chunks[1:]))
            assert other != layout and other.digest() not in digests, change
            digests.add(other.digest())
    # A value moved across the boundary of two neighbouring tuple fields (the
    # same values in the same order).
    names = [name for name, value in vars(first).items()]
    assert names.index("starts") == names.index("cu_seq_lens") + 1
    split = dataclasses.replace(first, cu_seq_lens=(0, 1), starts=(2, 3, 4))
    moved = dataclasses.replace(first, cu_seq_lens=(0, 1, 2), starts=(3, 4))
    digest_of = {chunk: dataclasses.replace(layout, chunks=(chunk,)).digest() for chunk in (split, moved)}
    assert digest_of[split] != digest_of[moved]
    # Values beyond 64 bits go in as text, tagged and sized apart from any machine ints.
    wide = [dataclasses.replace(first, starts=starts) for starts in ((1 << 70,), (1 << 70, 1), (1,), ())]
    assert len({dataclasses.replace(layout, chunks=(chunk,)).digest() for chunk in wide}) == len(wide)
