"""The installed release is checked against the pin at every oracle start, like
the fingerprints: a different version or commit id refuses with one line
naming it, and ``--allow-oracle-drift`` overrides it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

import oracle.pin
from harness.cli import main
from harness.engine import UsageError, open_oracle
from oracle.environment import OracleUnavailable, import_vllm_module
from oracle.pin import RELEASE, SYMBOLS, check_fingerprints, check_release, load_pin
from oracle.trace import record_fingerprints

SMOKE = Path(__file__).resolve().parent.parent / "cases" / "smoke"


@pytest.fixture
def version() -> ModuleType:
    return import_vllm_module(RELEASE)


def test_the_installed_release_is_the_pinned_one() -> None:
    pin = load_pin()
    release = check_release()
    assert release.status == "ok"
    assert release.found == f"{pin['release_version']} {pin['release_commit_id']}" == "0.28.0 g2cf0a6915"
    statuses = check_fingerprints()
    assert [s.symbol for s in statuses] == list(SYMBOLS)
    assert statuses[0].symbol == RELEASE and all(s.status == "ok" for s in statuses)


@pytest.mark.parametrize(
    ("attribute", "value", "found"),
    [("__version__", "0.29.0", "0.29.0 g2cf0a6915"), ("commit_id", "gdeadbeef0", "0.28.0 gdeadbeef0")],
)
def test_a_different_release_refuses_every_start_unless_overridden(
    version: ModuleType, monkeypatch: pytest.MonkeyPatch, attribute: str, value: str, found: str
) -> None:
    monkeypatch.setattr(version, attribute, value)
    release = check_fingerprints()[0]
    assert (release.symbol, release.status, release.found) == (RELEASE, "mismatch", found)

    with pytest.raises(UsageError) as refused:
        open_oracle(False)
    message = str(refused.value)
    assert message == (
        f"oracle fingerprint mismatch: {RELEASE} (pinned 0.28.0 g2cf0a6915, installed {found}); "
        "pass --allow-oracle-drift to run anyway"
    )
    assert "\n" not in message

    _, provenance = open_oracle(True)
    assert provenance["oracle_drift_overridden"] is True
    assert provenance["fingerprints"][RELEASE] == "mismatch"


def test_the_command_line_refuses_a_different_release(
    version: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(version, "__version__", "0.27.1")
    code = main(["run", "--cases", str(SMOKE / "giant-middle.json")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"parity: error: oracle fingerprint mismatch: {RELEASE} (pinned 0.28.0 g2cf0a6915")
    assert err.count("\n") == 1

    code = main(["run", "--cases", str(SMOKE / "giant-middle.json"), "--allow-oracle-drift"])
    out, err = capsys.readouterr()
    assert code == 0
    assert f"WARNING: oracle fingerprints overridden (1 drifted: {RELEASE})" in out and "WARNING" in err


def test_recording_refuses_a_release_other_than_the_pinned_one(
    version: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    copy = tmp_path / "pin.json"
    shutil.copy(oracle.pin.PIN_FILE, copy)
    monkeypatch.setattr(oracle.pin, "PIN_FILE", copy)
    monkeypatch.setattr(version, "__version__", "0.29.0")
    with pytest.raises(OracleUnavailable, match=r"installed vllm 0\.29\.0 g2cf0a6915 is not the pinned release"):
        record_fingerprints()
    assert json.loads(copy.read_text()) == load_pin()
