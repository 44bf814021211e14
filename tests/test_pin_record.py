"""The fingerprint check's record (oracle/pin_record.py): a process answered from
the oracle cache reads back what the check of the same installation found
instead of importing vLLM, and anything the check depends on is another key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oracle.pin
import oracle.pin_record
from oracle.environment import import_vllm_module, module_source_file
from oracle.pin import MLA, PIN_FILE, SymbolStatus, check_fingerprints, installed_version
from oracle.pin_record import RECORDS, CheckedPin, check_now, checked_fingerprints, installation_key
from oracle.sparse import SPARSE

ROOT = Path(__file__).resolve().parent.parent
SMOKE_CASE = ROOT / "cases" / "smoke" / "giant-middle.json"


def test_the_source_files_found_without_importing_are_the_imported_ones() -> None:
    for name in ("vllm", MLA, SPARSE):
        assert module_source_file(name) == Path(str(import_vllm_module(name).__file__))


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in vLLM package whose bytes the tests edit."""
    root = tmp_path / "site" / "vllm"
    (root / "attention").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "attention" / "mla.py").write_text("def plan():\n    return 1\n")
    (root.parent / "dependency.py").write_text("")  # installed beside it
    monkeypatch.setattr(oracle.pin_record, "installed_package_root", lambda: root)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    return root


def test_every_input_of_the_check_is_in_the_key(package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    keys = [installation_key()]
    (package / "attention" / "mla.py").write_text("def plan():\n    return 2\n")
    keys.append(installation_key())
    (package / "attention" / "other.py").write_text("")
    keys.append(installation_key())
    (package / "attention" / "other.py").rename(package / "attention" / "moved.py")
    keys.append(installation_key())
    monkeypatch.setenv("VLLM_SOMETHING", "1")
    keys.append(installation_key())
    monkeypatch.setattr(oracle.pin_record, "selected_device", lambda: "cuda")
    keys.append(installation_key())
    (package / "attention" / "_ext.so").write_bytes(b"\0")
    keys.append(installation_key())
    # A folder searched first that offers nothing installed beside vLLM (a port's
    # folder on PYTHONPATH, the folder a run starts in): the same key.
    their_folder = tmp_path / "their-port"
    their_folder.mkdir()
    (their_folder / "their_port.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(their_folder), *sys.path])
    assert installation_key() == keys[-1]
    # One that offers a module installed beside vLLM: after the installation it
    # shadows nothing (the same key), before it another key.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "dependency.py").write_text("")
    monkeypatch.setattr(sys, "path", [*sys.path, str(package.parent), str(shadow)])
    assert installation_key() == keys[-1]
    monkeypatch.setattr(sys, "path", [str(shadow), *sys.path])
    keys.append(installation_key())
    # The pin the check reads, looked up at each start (a test may point it elsewhere).
    pin = tmp_path / "pin.json"
    pin.write_bytes(PIN_FILE.read_bytes() + b"\n")
    keys.append(installation_key(pin))
    monkeypatch.setattr(oracle.pin, "PIN_FILE", pin)
    assert installation_key() == keys[-1]
    assert None not in keys and len(set(keys)) == len(keys)
    # And nothing else: the same bytes, the same key.
    monkeypatch.setattr(oracle.pin, "PIN_FILE", PIN_FILE)
    assert installation_key() == keys[-2]


def test_a_record_answers_the_next_start_and_a_broken_one_is_a_miss(
    package: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = CheckedPin("0.28.0", "g2cf0a6915", (SymbolStatus("vllm._version", "a", "a", "ok"),))
    checks: list[int] = []

    def check() -> CheckedPin:
        checks.append(1)
        return found

    monkeypatch.setattr(oracle.pin_record, "check_now", check)
    assert checked_fingerprints(tmp_path) == found and len(checks) == 1
    assert checked_fingerprints(tmp_path) == found and len(checks) == 1
    (record,) = (tmp_path / RECORDS).iterdir()
    assert json.loads(record.read_text())["statuses"][0]["status"] == "ok"

    # A changed installation is another key: checked again.
    (package / "attention" / "mla.py").write_text("def plan():\n    return 3\n")
    assert checked_fingerprints(tmp_path) == found and len(checks) == 2

    for broken in ("{", '{"format": 1}', '{"format": 1, "version": 1, "commit": null, "statuses": []}'):
        for path in (tmp_path / RECORDS).iterdir():
            path.write_text(broken)
        assert checked_fingerprints(tmp_path) == found
    assert len(checks) == 5

    # A file of the installation that cannot be read: no key, checked every time.
    (package / "attention" / "dangling.py").symlink_to(package / "nowhere.py")
    records = len(list((tmp_path / RECORDS).iterdir()))
    assert checked_fingerprints(tmp_path) == found and len(checks) == 6
    assert len(list((tmp_path / RECORDS).iterdir())) == records
    (package / "attention" / "dangling.py").unlink()

    # No folder (--no-oracle-cache): checked every time, recorded nowhere.
    checked_fingerprints(None)
    assert len(checks) == 7

    # A refusal is never kept: the next start checks again.
    refused = CheckedPin("0.28.0", "g2cf0a6915", (SymbolStatus("vllm._version", "a", None, "missing"),))
    found = refused
    monkeypatch.setattr(oracle.pin_record, "check_now", check)
    shutil.rmtree(tmp_path / RECORDS)
    assert checked_fingerprints(tmp_path) == refused == checked_fingerprints(tmp_path)
    assert len(checks) == 9 and not (tmp_path / RECORDS).exists()


def test_with_vllm_imported_the_live_modules_are_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import_vllm_module(MLA)
    version = import_vllm_module("vllm._version")
    monkeypatch.setattr(version, "__version__", "0.29.0")
    checked = checked_fingerprints(tmp_path)
    assert checked.version == "0.29.0" and checked.statuses[0].status == "mismatch"
    assert not (tmp_path / RECORDS).exists()
    monkeypatch.undo()
    assert check_now() == CheckedPin(*installed_version(), tuple(check_fingerprints()))


RUN_AND_TELL = """
import json, sys
from harness.cli import main
code = main(["run", "--cases", sys.argv[1], "--level", "layout", "--json", sys.argv[2]])
print(json.dumps({"code": code, "vllm_imported": "vllm" in sys.modules, "torch_imported": "torch" in sys.modules}))
"""


def test_a_run_answered_from_the_cache_does_not_import_vllm(tmp_path: Path) -> None:
    """Nor torch, at the layout level: layouts are host work (harness.sides.items.TENSOR_LEVELS),
    and torch's import was most of such a run's start-up. The first run, which asks the oracle, loads both."""
    env = {**os.environ, "PARITY_ORACLE_CACHE": str(tmp_path / "cache")}
    told, provenances = [], []
    for run in ("first", "second"):
        out = tmp_path / f"{run}.json"
        done = subprocess.run(
            [sys.executable, "-c", RUN_AND_TELL, str(SMOKE_CASE), str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        told.append(json.loads(done.stdout.strip().splitlines()[-1]))
        provenances.append(json.loads(out.read_text())["provenance"])
    assert told == [
        {"code": 0, "vllm_imported": True, "torch_imported": True},
        {"code": 0, "vllm_imported": False, "torch_imported": False},
    ]
    assert provenances[0] == provenances[1]
    assert set(provenances[1]["fingerprints"].values()) == {"ok"}
