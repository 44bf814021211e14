"""Reproduce lines: the ``parity diff`` command printed for a failing item runs
as printed and reproduces it, for every item kind and every ``--port`` spelling
(a built-in name, ``mutant:NAME``, ``cmd:COMMAND``, ``package.module:attr``)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cases.fields import CaseError
from harness.cases.suites import load_suite
from harness.cli import build_parser, main
from harness.commands.diff import diff_kinds
from harness.model import WorkspaceConfig
from harness.sides.items import LEVELS
from harness.sides.runner import plan_items
from harness.verdicts.launch import program_words
from harness.verdicts.reproduce import CASES_SUITE, printed_id, reproduce_command, resolve_item
from harness.verdicts.summary import message_groups
from ports.per_request import PerRequestPort
from tests.conftest import make_case

ROOT = Path(__file__).resolve().parent.parent
FAKE_PORT = ROOT / "tests" / "fake_external_port.py"


class WorkspaceOverDcpPort(PerRequestPort):
    """A user's port, loaded by import path (``tests.test_reproduce:WorkspaceOverDcpPort``):
    per_request with one block too many in the workspace under DCP."""

    name = "workspace-over-dcp"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        size = super().workspace_size(config)
        return size + config.block_size if config.dcp_world_size > 1 else size


USER_PORT = "tests.test_reproduce:WorkspaceOverDcpPort"
# Two of the smoke layout cases (the DCP world-3 ones) diverge under this mutant.
MUTANT_PORT = "mutant:dcp-padded-by-shift"
# The external port answers one smoke case with an error, the rest as per_request.
CMD_PORT = f"cmd:{shlex.join([sys.executable, str(FAKE_PORT), '--fault', 'error', '--on', 'smoke-dcp3-padded'])}"
PORTS = (USER_PORT, MUTANT_PORT, CMD_PORT)


def parity_argv(line: str) -> list[str]:
    """The CLI arguments of a printed line: what follows its ``-m harness`` (an
    ``env`` prefix may carry PYTHONPATH or PATH before the interpreter)."""
    argv = shlex.split(line)
    start = argv.index("harness") + 1
    assert argv[start - 2 : start] == ["-m", "harness"] and argv[start - 3].endswith("python"), line
    return argv[start:]


def parse(line: str) -> tuple[list[str], Any]:
    rest = parity_argv(line)
    assert rest[0] == "diff", line
    return rest, build_parser().parse_args(rest)


# -- the command's text --------------------------------------------------------------------


def test_the_program_is_the_environments_interpreter_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never the console script (found only in an activated environment): the
    interpreter by path, relative at the root; from elsewhere, ``env -C`` back
    to where the run was, with the harness and a port's folder on PYTHONPATH."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(ROOT)
    interpreter = Path(sys.executable)
    shown = str(interpreter.relative_to(ROOT)) if interpreter.is_relative_to(ROOT) else str(interpreter)
    assert program_words() == [shown, "-m", "harness"]
    assert program_words("tests.test_reproduce:WorkspaceOverDcpPort") == [shown, "-m", "harness"]
    assert reproduce_command("x", "layout", "smoke", "per_request").startswith(f"{shown} -m harness diff x ")
    (tmp_path / "their_port.py").write_text("PORT = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert program_words("their_port:PORT") == ["env", f"PYTHONPATH={tmp_path}", shown, "-m", "harness"]
    monkeypatch.chdir(tmp_path)
    assert program_words("per_request") == [
        "env",
        "-C",
        str(tmp_path),
        f"PYTHONPATH={ROOT}",
        str(interpreter),
        "-m",
        "harness",
    ]


@pytest.mark.parametrize(
    "port_spec",
    [
        "per_request",
        "mutant:legacy-grid",
        "cmd:python tests/fake_external_port.py --fault error --on 'a b' \"$HOME\"",
        USER_PORT,
    ],
)
def test_every_port_spelling_survives_the_shell(port_spec: str) -> None:
    line = reproduce_command("smoke-tails-15", "layout", "smoke", port_spec, "cuda", allow_oracle_drift=True)
    _, args = parse(line)
    assert (args.port, args.case, args.suite, args.level) == (port_spec, "smoke-tails-15", "smoke", "layout")
    assert args.device == "cuda" and args.allow_oracle_drift


@pytest.mark.parametrize("size", [None, 7])
def test_every_smoke_item_kind_reproduces_to_itself(size: int | None) -> None:
    """Parsed as printed, each line names the item it was printed for and
    selects exactly its kind; a run's --size is carried along."""
    items = plan_items(load_suite("smoke", size=size), LEVELS)
    assert {kind for kind, _ in items} == {
        "layout",
        "workspace",
        "merge",
        "prefill",
        "sparse-layout",
        "sparse-workspace",
        "sparse-mask",
        "sparse-prefill",
    }
    for kind, item in items:
        line = reproduce_command(f"{item.name}[{kind}]", kind, "smoke", MUTANT_PORT, size=size)
        _, args = parse(line)
        assert args.size == size
        resolved = resolve_item(args.case, args.suite, args.size, args.cases)
        assert resolved.item == item, line
        assert diff_kinds(resolved, args.case, args.level) == [kind], line


def test_a_cases_run_reproduces_through_its_case_file(tmp_path: Path) -> None:
    single = tmp_path / "one.json"
    single.write_text(json.dumps(make_case([100, 3], name="alone", workspace_size=64).to_json()))
    folder = tmp_path / "more"
    folder.mkdir()
    pair = [make_case([5, n], name=f"pair-{n}").to_json() for n in (1, 2)]
    (folder / "pair.json").write_text(json.dumps({"cases": pair}))
    paths = [str(single), str(folder)]
    lines = {name: reproduce_command(name, "layout", CASES_SUITE, "equal_share", case_paths=paths) for name in
             ("alone", "pair-2")}  # fmt: skip
    _, args = parse(lines["alone"])
    assert args.case == str(single) and args.suite is None and args.cases is None
    _, args = parse(lines["pair-2"])
    assert args.case == "pair-2" and args.cases == [str(folder / "pair.json")]
    for name, line in lines.items():
        _, args = parse(line)
        assert resolve_item(args.case, args.suite, args.size, args.cases).item.name == name


# -- done when: every reproduce line of a gate runs as printed -------------------------------


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One smoke gate at level layout per port spelling: its output folder."""
    outs = {}
    for spec in PORTS:
        out = tmp_path_factory.mktemp("gate")
        code = main(["gate", "--suite", "smoke", "--level", "layout", "--port", spec, "--out", str(out)])
        assert code == 1, spec
        outs[spec] = out
    return outs


def failing_rows(out: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    table = pd.read_parquet(out / "results.parquet")
    meta = json.loads((out / "gate.json").read_text())
    return table[table["status"] != "parity"], meta


def run_as_printed(line: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The line's parity arguments run in this process (tests/test_reproduce_shell.py pastes lines into a shell)."""
    code = main(parity_argv(line))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("port_spec", PORTS)
def test_every_failing_item_of_a_gate_reproduces_as_printed(
    gates: dict[str, Path], port_spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows, meta = failing_rows(gates[port_spec])
    assert meta["port_spec"] == port_spec
    assert not rows.empty
    # The gate's summary shows the first ten: each of those, and at least one per kind.
    shown = pd.concat([rows.head(10), rows.drop_duplicates("kind")]).drop_duplicates("id")
    for row in shown.itertuples(index=False):
        line = reproduce_command(
            row.name, row.kind, meta["suite"], meta["port_spec"], meta["device"], size=meta["size"]
        )
        code, out = run_as_printed(line, capsys)
        assert code == 1, (line, out)
        assert f"({row.name}, from " in out, line
        assert f"verdict: {row.status.upper()} ({row.kind} {row.status})" in out, (line, out[-800:])


def test_the_gates_cover_workspace_and_layout_items(gates: dict[str, Path]) -> None:
    kinds = {spec: set(failing_rows(out)[0]["kind"]) for spec, out in gates.items()}
    assert kinds[USER_PORT] == {"workspace"}
    assert kinds[MUTANT_PORT] == {"layout"} and kinds[CMD_PORT] == {"layout"}


def test_the_summary_reproduce_lines_run_as_printed(gates: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for spec, out in gates.items():
        rows, _ = failing_rows(out)
        summary = (out / "summary.md").read_text()
        lines = [
            line.split("reproduce: `", 1)[1].rstrip("`") for line in summary.splitlines() if "reproduce: `" in line
        ]
        # One line per distinct message, for its first item.
        firsts = [next(g.itertuples(index=False)) for g in message_groups(rows)]
        assert len(lines) == min(10, len(firsts)), spec
        for line, row in zip(lines, firsts[:10], strict=True):
            code, stdout = run_as_printed(line, capsys)
            assert code == 1 and f"({row.name}, from " in stdout, line


# -- ids carry what defines their item ----------------------------------------------------


def test_a_bare_generated_name_two_suites_define_differently_is_refused() -> None:
    """A nightly id pasted bare must not silently diff ci's case of the same name."""
    nightly = {c.name: c for c in load_suite("nightly").cases}
    name, ci_case = next((c.name, c) for c in load_suite("ci").cases if c.name in nightly and nightly[c.name] != c)
    with pytest.raises(CaseError, match=r"names different items in suite ci and suite nightly"):
        resolve_item(f"{name}[layout]")
    assert resolve_item(f"ci/{name}[layout]").item == ci_case
    assert resolve_item(f"nightly/{name}[layout]").item == nightly[name]


def test_every_printed_id_resolves_to_its_item(tmp_path: Path) -> None:
    sized = load_suite("nightly", size=20)
    for case in sized.cases[:5]:
        shown = printed_id(f"{case.name}[layout]", "nightly", 20)
        assert shown == f"nightly:size=20/{case.name}[layout]"
        assert resolve_item(shown).item == case
    with pytest.raises(CaseError, match="names size 20 but --size is 7"):
        resolve_item(f"nightly:size=20/{sized.cases[0].name}[layout]", size=7)
    # A night's --numeric-size defines its numeric items: the id carries it, and it resolves
    # to an item the night's --size alone would not hold (its numeric groups scale to one case).
    night = load_suite("nightly", size=0, numeric_size=40)
    numeric = [c for c in night.cases if c.name.startswith("numeric-")][-1]
    assert numeric not in load_suite("nightly", size=0).cases
    shown = printed_id(f"{numeric.name}[prefill]", "nightly", 0, numeric_size=40)
    assert shown == f"nightly:size=0:numeric-size=40/{numeric.name}[prefill]"
    assert resolve_item(shown).item == numeric
    assert resolve_item(numeric.name, "nightly", 0, numeric_size=40).item == numeric
    with pytest.raises(CaseError, match="names numeric-size 40 but --numeric-size is 3"):
        resolve_item(shown, numeric_size=3)
    pair = [make_case([5, n], name=f"pair-{n}").to_json() for n in (1, 2)]
    (tmp_path / "pair.json").write_text(json.dumps({"cases": pair}))
    shown = printed_id("pair-2[layout]", CASES_SUITE, case_paths=[str(tmp_path)])
    assert shown == f"{tmp_path / 'pair.json'}:pair-2[layout]"
    assert resolve_item(shown).item.name == "pair-2"


def test_a_cmd_port_found_on_the_runs_path_carries_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh shell's PATH is /usr/bin:/bin: a port program found elsewhere on the
    run's PATH (a virtual environment, ~/.cargo/bin) is put on the printed line's PATH."""
    program = tmp_path / "their-port-binary"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.chdir(ROOT)
    words = program_words("cmd:their-port-binary --flag")
    assert words[:2] == ["env", f"PATH={tmp_path}:/usr/bin:/bin"], words
    assert "PATH=" not in " ".join(program_words("cmd:/bin/cat"))
