"""The command line as a CI user and a terminal user meet it: Ctrl-C, pipes,
bad limits, progress in logs, ``--version``, ``parity list`` and the help."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from harness.commands.options import PORT_FORMS
from harness.engine import progress
from harness.sides.items import CaseResult, Kind, Status

ROOT = Path(__file__).resolve().parent.parent


def as_from_a_terminal() -> None:
    """A child's SIGINT as a terminal's foreground command has it (Ctrl-C ends
    it), whoever started the tests: a shell's background job, ``nohup`` or a CI
    runner may have set it ignored, which every child inherits and a Python
    process then keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def parity_process(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )


def signal_state(pid: int) -> str:
    """Whether ``pid`` blocks, ignores or catches SIGINT (its /proc status masks):
    a run that ignores Ctrl-C fails a test with this in the message."""
    bit = 1 << (signal.SIGINT - 1)
    try:
        masks = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError as exc:
        return f"pid {pid}: {exc}"
    state = {name: bool(int(masks[name], 16) & bit) for name in ("SigBlk", "SigIgn", "SigCgt") if name in masks}
    return f"pid {pid} SIGINT " + ", ".join(f"{name} {flag}" for name, flag in state.items())


def interrupt_when(proc: subprocess.Popen[str], ready: Callable[[], bool], sig: int = signal.SIGINT) -> tuple[str, str]:
    """Send ``sig`` once ``ready()`` holds (the run is comparing items); its output,
    the last line of stderr saying how the process held SIGINT when it was sent."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not ready():
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    state = signal_state(proc.pid)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return out, f"{err}\n(when signalled: {state})"


def rows_written(results: Path) -> int:
    """Rows in a results file so far (its first line is the header)."""
    return len(results.read_text().splitlines()) - 1 if results.exists() else 0


def interrupted_slow_run(command: str, results: Path, *argv: str, sig: int = signal.SIGINT) -> tuple[str, str]:
    """``parity COMMAND`` over smoke's layouts with a slow exact port, stopped by
    ``sig`` once a few items are in ``results``: it must exit 130 without a traceback."""
    proc = parity_process(
        command, "--suite", "smoke", "--level", "layout", "--port", "tests.fault_ports:SlowPort",
        "--results", str(results), *argv,
    )  # fmt: skip
    out, err = interrupt_when(proc, lambda: rows_written(results) >= 3, sig)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err
    return out, err


def test_ctrl_c_ends_a_run_with_130_its_partial_summary_and_json(tmp_path: Path) -> None:
    results, report = tmp_path / "rows.jsonl", tmp_path / "run.json"
    out, _ = interrupted_slow_run("run", results, "--json", str(report))
    assert "verdict INCOMPLETE" in out and "interrupted:" in out
    document = json.loads(report.read_text())
    counts = document["summary"]["counts"]
    assert document["summary"]["verdict"] == "incomplete"
    assert counts["parity"] >= 3 and counts["not-run"] > 0
    assert counts["parity"] + counts["not-run"] == document["summary"]["items"]


def test_a_closed_pipe_keeps_the_verdict_and_the_reports(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    proc = parity_process("run", "--suite", "smoke", "--level", "layout", "--json", str(report))
    assert proc.stdout is not None
    first = proc.stdout.readline()  # what `| head -1` reads before it goes away
    proc.stdout.close()
    proc.wait(timeout=300)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "verdict PASS" in first
    assert proc.returncode == 0, err
    assert "BrokenPipe" not in err and "Traceback" not in err
    assert json.loads(report.read_text())["summary"]["verdict"] == "pass"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--timeout", "0"], "argument --timeout: must be a finite number of seconds > 0, got '0'"),
        (["gate", "--timeout", "-5"], "argument --timeout: must be a finite number of seconds > 0, got '-5'"),
        (["run", "--timeout", "inf"], "argument --timeout: must be a finite number of seconds > 0, got 'inf'"),
        (["run", "--size", "-1"], "argument --size: must be >= 0, got '-1'"),
        (["nightly", "--numeric-size", "-3"], "argument --numeric-size: must be >= 0, got '-3'"),
        (["run", "--show", "-1"], "argument --show: must be >= 0, got '-1'"),
        (["shrink", "x", "--budget", "0"], "argument --budget: must be >= 1, got '0'"),
    ],
)
def test_bad_limits_are_usage(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_progress_lines_in_a_log_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    clock = [0.0]
    lines = progress.ProgressLines(100, clock=lambda: clock[0])
    ok, bad = CaseResult("a", "f", Kind.LAYOUT, Status.PARITY), CaseResult("b", "f", Kind.LAYOUT, Status.DIVERGENT)
    for _ in range(10):  # a tenth done, but within the quiet gap: nothing yet
        lines.advance(ok)
    assert capsys.readouterr().err == ""
    clock[0] = progress.PROGRESS_QUIET_S
    lines.advance(bad)  # past a tenth and quiet long enough: one line
    for _ in range(8):
        lines.advance(bad)  # the same tenth: nothing more
    assert capsys.readouterr().err == "parity: 11/100 items (11%), 5 s, 1 not at parity\n"
    clock[0] += progress.PROGRESS_EVERY_S  # no new tenth, but a minute of silence
    lines.advance(ok)
    assert capsys.readouterr().err == "parity: 20/100 items (20%), 65 s, 9 not at parity\n"


def test_version_names_the_harness_and_the_pin(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    pin = json.loads((ROOT / "oracle" / "pin.json").read_text())
    assert out.startswith("parity ") and pin["upstream_commit"] in out and pin["release"] in out


def test_list_names_what_the_harness_knows(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cases.suites import load_suite, suite_names
    from ports.mutants import MUTANTS

    assert main(["list", "suites"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == suite_names()
    assert main(["list", "mutants"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [f"mutant:{m}" for m in MUTANTS]
    assert main(["list", "ports"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [f for f, _ in PORT_FORMS]
    assert main(["list", "cases", "--suite", "smoke"]) == 0
    ids = capsys.readouterr().out.splitlines()
    smoke = load_suite("smoke")
    assert len(ids) == len(smoke.cases) + len(smoke.workspace_configs) + len(smoke.merge_cases) + sum(
        1 for c in smoke.cases if c.numeric is not None
    ) + len(smoke.sparse_cases) + len(smoke.sparse_workspace_configs) + len(smoke.mask_cases) + sum(
        1 for c in smoke.sparse_cases if c.numeric is not None
    )
    assert "smoke/smoke-long-10x[layout]" in ids and all(i.startswith("smoke/") for i in ids)
    assert main(["list", "cases", "--suite", "nosuch"]) == 2


def test_port_help_names_every_form_and_every_default() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        text = " ".join(sub.format_help().split())
        port = [a for a in sub._actions if "--port" in a.option_strings]
        if port:
            port_help = " ".join((port[0].help or "").split())
            for form, _ in PORT_FORMS:
                assert form in port_help, f"{name}: --port help lacks {form}"
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False, "==SUPPRESS=="):
                help_text = " ".join((action.help or "").split())
                shown = "default" in help_text or f"(default: {action.default})" in text
                assert shown, f"parity {name} {action.option_strings[0]}: default {action.default!r} not in its help"


def test_ctrl_c_ends_a_gate_with_130_and_its_outputs_saying_interrupted(tmp_path: Path) -> None:
    out, results = tmp_path / "gate", tmp_path / "rows.jsonl"
    interrupted_slow_run("gate", results, "--out", str(out))
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## Parity gate: INCOMPLETE") and "**Interrupted (Ctrl-C)**" in summary
    assert json.loads((out / "gate.json").read_text())["interrupted"].startswith("stopped after ")
    assert (out / "junit.xml").exists() and (out / "results.parquet").exists()


def test_sigterm_is_handled_as_ctrl_c(tmp_path: Path) -> None:
    results, report = tmp_path / "rows.jsonl", tmp_path / "run.json"
    out, _ = interrupted_slow_run("run", results, "--json", str(report), sig=signal.SIGTERM)
    assert "verdict INCOMPLETE" in out
    assert json.loads(report.read_text())["summary"]["verdict"] == "incomplete"


def test_ctrl_c_while_the_gate_shrinks_keeps_its_verdict_and_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import harness.commands.gate

    def interrupted(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.commands.gate, "guarded_shrink", interrupted)
    out = tmp_path / "gate"
    case = ROOT / "cases" / "smoke" / "upstream-worst-case.json"
    code = main(["gate", "--cases", str(case), "--level", "layout", "--port", "mutant:legacy-grid", "--out", str(out)])
    assert code == 130
    assert "interrupted while shrinking" in capsys.readouterr().err
    summary = (out / "summary.md").read_text()
    # Every item was compared, so the verdict is the real one: the mutant fails.
    assert summary.startswith("## Parity gate: FAIL") and (out / "junit.xml").exists()
    assert json.loads((out / "gate.json").read_text())["shrink_interrupted"] is True


def test_merge_judges_shards_with_the_baseline_they_ran_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"port": "per_request", "entries": []}))
    cases = [str(ROOT / "cases" / "smoke" / name) for name in ("upstream-worst-case.json", "dcp-tiny.json")]
    shards = []
    for k in (1, 2):
        shards.append(str(tmp_path / f"shard{k}"))
        argv = ["gate", "--cases", *cases, "--level", "layout", "--shard", f"{k}/2", "--out", shards[-1]]
        assert main([*argv, "--baseline", str(baseline)]) == 0
    capsys.readouterr()
    assert main(["merge", *shards, "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err
    assert "the shards ran with baseline" in err and "no --baseline" in err and err.count("\n") == 1
    assert main(["merge", *shards, "--baseline", str(baseline), "--out", str(tmp_path / "merged")]) == 0
    assert "Re-judged" not in (tmp_path / "merged" / "summary.md").read_text()
    # An explicit re-judgement is allowed, and the summary says what it did.
    assert main(["merge", *shards, "--rejudge", "--out", str(tmp_path / "rejudged")]) == 0
    assert "judged here with no --baseline" in (tmp_path / "rejudged" / "summary.md").read_text()


def test_a_gate_with_a_timeout_reproduces_with_it() -> None:
    from harness.verdicts.reproduce import reproduce_command

    assert "--timeout 3" in reproduce_command("skew-0001", "layout", "ci", "per_request", timeout_s=3.0)
    assert "--timeout" not in reproduce_command("skew-0001", "layout", "ci", "per_request", timeout_s=300.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["diff", "x", "--timeout", "0"])
    assert build_parser().parse_args(["diff", "x", "--timeout", "2.5"]).timeout == 2.5


def test_a_bare_name_two_suites_give_different_items_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Generated merge cases of smoke and ci share names but not contents.
    assert main(["diff", "numeric-uniform-0009[layout]"]) == 2
    err = capsys.readouterr().err
    assert "names different items in suite smoke and suite ci" in err and err.count("\n") == 1


def test_layers_harness_never_calls_up_into_reports_nor_keeps_a_timeout_global() -> None:
    import ast

    # The two user interfaces (the CLI and the pytest plugin) sit above the commands.
    interfaces = {"cli.py", "pytest_plugin.py"}
    for path in sorted((ROOT / "harness").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("reports"), f"{path.name} imports {node.module}"
                if path.name not in interfaces:
                    assert not node.module.startswith("harness.commands"), f"{path.name} imports {node.module}"
        assigned = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
        assert "PORT_TIMEOUT_S" not in assigned, path.name
    probe = "import sys, harness.cli; print('torch' in sys.modules)"
    # The console script imports harness.cli before main(): it must be cheap, so an early Ctrl-C reaches main.
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True).stdout == "False\n"


def test_an_unknown_port_names_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "smoke", "--port", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert all(form.split(":")[0] in err for form, _ in PORT_FORMS) and err.count("\n") == 1
