"""A misspelt item id, suite, level or port is refused in one line that names
the closest known one (difflib), exit 2; a port module that cannot be imported
says where Python looked and what to put on PYTHONPATH."""

from __future__ import annotations

import os

import pytest

from harness.cli import main
from harness.model.names import did_you_mean


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 or "usage:" in err, err
    return err


def test_the_closest_name_or_none() -> None:
    assert did_you_mean("layot", ["layout", "merge"]) == " (did you mean 'layout'?)"
    assert did_you_mean("zzzz", ["layout", "merge"]) == ""


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["diff", "smoke-numeric-continuation-fp3", "--suite", "smoke"], "smoke-numeric-continuation-fp32"),
        (["run", "--suite", "smoek", "--level", "layout"], "smoke"),
        (["run", "--suite", "smoke", "--level", "layot"], "layout"),
        (["run", "--suite", "smoke", "--level", "layout", "--port", "per_reqest"], "per_request"),
        (["run", "--suite", "smoke", "--level", "merge", "--port", "mutant:merge-in-bf1"], "merge-in-bf16"),
    ],
)
def test_a_near_miss_names_what_it_likely_meant(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"did you mean {meant!r}?" in _refused(argv, capsys)


def test_a_port_that_cannot_be_imported_says_where_python_looked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    err = _refused(["run", "--suite", "smoke", "--level", "layout", "--port", "my_port_nowhere.mla:PORT"], capsys)
    assert "cannot import module 'my_port_nowhere.mla'" in err and "PYTHONPATH is not set" in err
    assert f"working directory {os.getcwd()}" in err and "put that folder on PYTHONPATH" in err
