"""The drift watch (``parity drift``) without a second release installed.

CI never builds a newer release's environment, so the "release" here is the
pinned environment itself, made to differ: a second source snapshot with a
modified symbol, fake modules read by the real ``python -m oracle.sources``,
and a release port that changes one layout field. The sparse levels (routes,
masks and remaps, sparse-prefill, the per-level symbols of both traces) are
tests/test_drift_sparse.py's.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import harness.cli
from harness.cases.suites import Suite, load_suite
from harness.kernels import kernels_for
from harness.model import Case, Layout, WorkspaceConfig
from harness.night.drift import (
    BOTH_REFUSE,
    CHANGED,
    MISSING,
    NEW,
    PINNED_ERROR,
    REFUSE_DIFFERENTLY,
    RELEASE_ERROR,
    UNCHANGED,
    LevelDrift,
    SourceSnapshot,
    compare_oracles,
    default_releases,
    drift_record,
    parity_verdict,
    read_sources,
    release_record,
    symbol_drift,
)
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY
from oracle.pin import MLA, load_pin, pinned_symbols
from reports.drift_report import latest_drift_report, render_markdown, upstream_since_pin, write_reports

CONTEXT_CHUNK = f"{MLA}:MLACommonPrefillMetadata.ContextChunk"

# Two versions of one module: B adds a dataclass field and a parameter, drops
# ``gone`` and adds ``added``, as a release would.
FAKE_A = """
from dataclasses import dataclass


@dataclass
class Partial:
    output: int
    lse: int


def accumulate(partial, chunk):
    return partial.output + chunk


def unchanged(x):
    return x


def gone():
    return 0
"""
FAKE_B = """
from dataclasses import dataclass


@dataclass
class Partial:
    output: int
    lse: int
    output_written: bool = False


def accumulate(partial, chunk, output_written=False):
    return partial.output + chunk


def unchanged(x):
    return x


def added():
    return 1
"""
FAKE_NAMES = ("Partial", "accumulate", "unchanged", "gone", "added")


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SourceSnapshot]:
    """One real ``python -m oracle.sources`` run in the pinned environment over
    the pin's symbols and both fake modules; split into a pinned snapshot, and
    the fake module pair renamed to one module name (the same symbols in two releases)."""
    folder = tmp_path_factory.mktemp("fake_releases")
    (folder / "drift_fake_a.py").write_text(textwrap.dedent(FAKE_A), encoding="utf-8")
    (folder / "drift_fake_b.py").write_text(textwrap.dedent(FAKE_B), encoding="utf-8")
    fakes = [f"drift_fake_{side}:{name}" for side in "ab" for name in FAKE_NAMES]
    import os

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(folder)
    try:
        # read_sources drops PYTHONPATH for a release's own environment; here the
        # fakes must be found, so the subprocess runs with it.
        both = _read_with_path(folder, [*pinned_symbols(), *fakes])
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved

    def side(prefix: str) -> SourceSnapshot:
        def pick(mapping: dict[str, Any]) -> dict[str, Any]:
            return {k.replace(prefix, "drift_fake"): v for k, v in mapping.items() if k.startswith(prefix + ":")}

        return SourceSnapshot(
            both.release,
            pick(both.sources),
            pick(both.fingerprints),
            pick(both.fields),
            pick(both.parameters),
            pick(both.errors),
        )

    pinned_only = set(pinned_symbols())
    pinned = SourceSnapshot(
        both.release,
        {k: v for k, v in both.sources.items() if k in pinned_only},
        {k: v for k, v in both.fingerprints.items() if k in pinned_only},
        {k: v for k, v in both.fields.items() if k in pinned_only},
        {k: v for k, v in both.parameters.items() if k in pinned_only},
        {k: v for k, v in both.errors.items() if k in pinned_only},
    )
    return {"pinned": pinned, "fake_a": side("drift_fake_a"), "fake_b": side("drift_fake_b")}


def _read_with_path(folder: Path, symbols: list[str]) -> SourceSnapshot:
    import subprocess

    import harness.night.drift

    done = subprocess.run(
        [sys.executable, "-m", "oracle.sources"],
        input=json.dumps(symbols),
        capture_output=True,
        text=True,
        cwd=harness.night.drift.ROOT,
        check=True,
    )
    return SourceSnapshot.from_json(json.loads(done.stdout))


def test_pinned_sources_are_exactly_what_the_pin_fingerprints(snapshots: dict[str, SourceSnapshot]) -> None:
    pin = load_pin()
    pinned = snapshots["pinned"]
    assert pinned.version == pin["release_version"]
    assert pinned.release["vllm_commit"] == pin["release_commit_id"]
    assert pinned.fingerprints == pin["fingerprints"]
    assert pinned.errors == {}
    # Dataclasses carry their fields; functions their parameters.
    assert "token_to_seq" in pinned.fields[CONTEXT_CHUNK]
    assert f"{MLA}:plan_mla_context_chunks" in pinned.parameters


def test_a_modified_symbol_is_named_with_its_diff_and_added_field(snapshots: dict[str, SourceSnapshot]) -> None:
    pinned = snapshots["pinned"]
    source = pinned.sources[CONTEXT_CHUNK]
    assert source is not None
    last_line = source.rstrip("\n").splitlines()[-1]
    indent = last_line[: len(last_line) - len(last_line.lstrip())]
    added_line = f"{indent}output_written: bool = False"
    release = replace(
        pinned,
        release={**pinned.release, "vllm_version": "9.0.0"},
        sources={**pinned.sources, CONTEXT_CHUNK: source + added_line + "\n"},
        fingerprints={**pinned.fingerprints, CONTEXT_CHUNK: "modified"},
        fields={**pinned.fields, CONTEXT_CHUNK: [*pinned.fields[CONTEXT_CHUNK], "output_written"]},
    )
    drifts = symbol_drift(list(pinned_symbols()), pinned, release)
    changed = [d for d in drifts if d.status != UNCHANGED]
    assert [d.symbol for d in changed] == [CONTEXT_CHUNK]
    (chunk,) = changed
    assert chunk.status == CHANGED
    assert chunk.fields_added == ("output_written",)
    assert f"+{added_line}" in chunk.diff.splitlines()
    assert f"vllm==9.0.0 {CONTEXT_CHUNK}" in chunk.diff
    assert len(drifts) == len(pinned_symbols())


def test_fake_release_fields_parameters_missing_and_new(snapshots: dict[str, SourceSnapshot]) -> None:
    symbols = [f"drift_fake:{name}" for name in FAKE_NAMES]
    drifts = {d.symbol.split(":")[1]: d for d in symbol_drift(symbols, snapshots["fake_a"], snapshots["fake_b"])}
    assert {name: d.status for name, d in drifts.items()} == {
        "Partial": CHANGED,
        "accumulate": CHANGED,
        "unchanged": UNCHANGED,
        "gone": MISSING,
        "added": NEW,
    }
    # The names come from dataclasses.fields / inspect.signature in the subprocess.
    assert drifts["Partial"].fields_added == ("output_written",)
    assert drifts["Partial"].parameters_added == ()
    assert drifts["accumulate"].parameters_added == ("output_written",)
    assert drifts["unchanged"].diff == ""
    assert "+    output_written: bool = False" in drifts["Partial"].diff.splitlines()
    assert drifts["gone"].reason and "gone" in drifts["gone"].reason


class FieldShiftingRelease:
    """The pinned oracle, except that its layout's first chunk reports max_seq_len + 1,
    and it refuses workspace sizing under DCP and every case the pinned oracle refuses."""

    name = "fake release"
    levels = ("layout",)

    def __init__(self, oracle: Port) -> None:
        self.oracle = oracle

    def plan_layout(self, case: Case) -> Layout:
        layout = self.oracle.plan_layout(case)
        if not layout.chunks:
            return layout
        first = replace(layout.chunks[0], max_seq_len=layout.chunks[0].max_seq_len + 1)
        return replace(layout, chunks=(first, *layout.chunks[1:]))

    def workspace_size(self, config: WorkspaceConfig) -> int:
        if config.dcp_world_size > 1:
            raise ValueError(f"no DCP here (world {config.dcp_world_size})")
        return self.oracle.workspace_size(config)


class RefusingOracle:
    """A pinned side that refuses the cases with an odd number of requests."""

    name = "refusing oracle"

    def __init__(self, oracle: Port) -> None:
        self.oracle = oracle

    def plan_layout(self, case: Case) -> Layout:
        if case.num_requests % 2:
            raise ValueError(f"{case.num_requests} requests")
        return self.oracle.plan_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self.oracle.workspace_size(config)


def _small_suite() -> Suite:
    smoke = load_suite("smoke")
    return Suite("small", smoke.cases[:12], smoke.workspace_configs[:20])


def test_oracle_parity_names_the_changed_field_and_error_classes(oracle: Port) -> None:
    suite = _small_suite()
    levels = compare_oracles(oracle, FieldShiftingRelease(oracle), suite, ("layout",), kernels_for("cpu"))
    layout = levels["layout"]
    with_chunks = sum(1 for c in suite.cases if oracle.plan_layout(c).chunks)
    dcp_configs = sum(1 for w in suite.workspace_configs if w.dcp_world_size > 1)
    assert with_chunks and dcp_configs  # the suite exercises both
    counts = layout.counts()
    assert counts[DIVERGENT] == with_chunks
    assert counts[RELEASE_ERROR] == dcp_configs
    assert counts[PARITY] == len(suite.cases) - with_chunks + len(suite.workspace_configs) - dcp_configs
    assert layout.changed() == {"max_seq_len": with_chunks}
    assert layout.error_classes() == {RELEASE_ERROR: {"ValueError: no DCP here (world N)": dcp_configs}}
    assert layout.verdict() == f"{with_chunks} divergent, {dcp_configs} release-error"


def test_a_refusal_both_releases_share_is_agreement(oracle: Port) -> None:
    suite = Suite("small", _small_suite().cases, ())
    refusing = RefusingOracle(oracle)
    both = compare_oracles(refusing, refusing, suite, ("layout",), kernels_for("cpu"))["layout"]
    odd = sum(1 for c in suite.cases if c.num_requests % 2)
    assert 0 < odd < len(suite.cases)
    assert both.counts()[BOTH_REFUSE] == odd
    assert both.verdict() == "parity"
    only_pinned = compare_oracles(refusing, oracle, suite, ("layout",), kernels_for("cpu"))["layout"]
    assert only_pinned.counts()[PINNED_ERROR] == odd
    assert only_pinned.verdict() == f"{odd} pinned-error"


class CrashingOracle(RefusingOracle):
    """Fails the same cases as :class:`RefusingOracle`, for another reason."""

    def plan_layout(self, case: Case) -> Layout:
        if case.num_requests % 2:
            raise RuntimeError("the process died")
        return self.oracle.plan_layout(case)


def test_refusals_for_different_reasons_are_not_agreement(oracle: Port) -> None:
    suite = Suite("small", _small_suite().cases, ())
    odd = sum(1 for c in suite.cases if c.num_requests % 2)
    drift = compare_oracles(RefusingOracle(oracle), CrashingOracle(oracle), suite, ("layout",), kernels_for("cpu"))
    layout = drift["layout"]
    assert layout.counts()[REFUSE_DIFFERENTLY] == odd and layout.counts()[BOTH_REFUSE] == 0
    assert layout.verdict() == f"{odd} refuse-differently"
    assert parity_verdict(drift) != "parity" and parity_verdict({}) == "no level compared"
    assert LevelDrift("layout").verdict() == "no items compared"


def test_report_round_trip_names_the_symbol_field_and_verdict(
    snapshots: dict[str, SourceSnapshot], oracle: Port, tmp_path: Path
) -> None:
    symbols = [f"drift_fake:{name}" for name in FAKE_NAMES]
    fake_a, fake_b = snapshots["fake_a"], snapshots["fake_b"]
    release = replace(fake_b, release={**fake_b.release, "vllm_version": "9.0.0", "torch_version": "9.9.9"})
    drifts = symbol_drift(symbols, fake_a, release)
    suite = _small_suite()
    levels = compare_oracles(oracle, FieldShiftingRelease(oracle), suite, ("layout",), kernels_for("cpu"))
    # What each level of the pinned oracle executes (workspace is part of the layout level).
    entered = {
        "drift_fake:Partial": ["layout"],
        "drift_fake:unchanged": ["layout", "merge"],
        "drift_fake:gone": ["workspace"],
    }
    record = drift_record(
        "2000-01-02", fake_a, suite.name, ("layout",), [release_record(fake_a, release, drifts, levels, {}, entered)]
    )
    layout_record = record["releases"][0]["parity"]["levels"]["layout"]
    assert layout_record["symbols_executed"] == 3
    assert layout_record["symbols_drifted"] == ["drift_fake:Partial", "drift_fake:gone"]
    markdown, data = write_reports(record, tmp_path / "drift")
    assert (markdown.name, data.name) == ("2000-01-02.md", "2000-01-02.json")
    found = latest_drift_report(tmp_path / "drift")
    assert found is not None and found[1] == json.loads(json.dumps(record))
    text = markdown.read_text(encoding="utf-8")
    assert text == render_markdown(found[1])
    assert "#### `drift_fake:Partial`" in text
    assert "+    output_written: bool = False" in text
    assert "gained field(s) `output_written`" in text
    assert "compared across torch versions" in text  # 9.9.9 is not the pinned torch
    assert levels["layout"].verdict() in text
    assert "`max_seq_len`" in text
    assert "executes 3 fingerprinted symbols at this level; changed or missing in the release: " in text
    assert "`drift_fake:Partial`, `drift_fake:gone`." in text
    since = "\n".join(upstream_since_pin(record))
    assert "vllm==9.0.0: 2 of 5 symbols changed, 1 missing" in since
    assert "Partial (+output_written)" in since


def test_read_sources_failure_is_one_line(tmp_path: Path) -> None:
    from harness.night.drift import DriftError

    with pytest.raises(DriftError, match=r"oracle\.sources exited 2: .*not 'module:qual\.name'"):
        read_sources(sys.executable, ["no-colon"])
    with pytest.raises(DriftError, match="FileNotFoundError"):
        read_sources(tmp_path / "no-python", ["a:b"])


# -- the command line ----------------------------------------------------------------------


def drift_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    if "drift" not in harness.cli.COMMANDS:
        monkeypatch.setattr(harness.cli, "COMMANDS", (*harness.cli.COMMANDS, "drift"))
    return harness.cli.main(["drift", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "0.33.0"], "--against '0.33.0': expected vllm==X.Y.Z"),
        (["--against", "vllm==9.9.9"], "--against vllm==9.9.9: no requirements/vllm-9.9.9.txt"),
        (["--against", f"vllm=={load_pin()['release_version']}"], "that is the pinned release"),
    ],
)
def test_bad_release_is_one_line_exit_2(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert drift_cli(argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_out_that_is_a_file_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    assert drift_cli(["--out", str(blocker), "--against", "vllm==9.9.9"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not a folder" in err


def _requirements(tmp_path: Path, versions: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.night.drift
    import oracle.process

    (tmp_path / "requirements").mkdir()
    for version in versions:
        (tmp_path / "requirements" / f"vllm-{version}.txt").write_text(f"vllm=={version}\n", encoding="utf-8")
    monkeypatch.setattr(oracle.process, "ROOT", tmp_path)
    monkeypatch.setattr(harness.night.drift, "ROOT", tmp_path)


def test_default_releases_are_those_newer_than_the_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = load_pin()["release_version"]
    major, minor, patch = (int(x) for x in pin.split("."))
    older, newer, newest = f"{major}.{minor - 1}.1", f"{major}.{minor}.{patch + 1}", f"{major}.{minor + 5}.0"
    _requirements(tmp_path, [newest, older, pin, newer], monkeypatch)
    assert default_releases() == [newer, newest]


def test_no_newer_release_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _requirements(tmp_path, ["0.1.0"], monkeypatch)
    assert drift_cli([], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no release newer than the pin" in err


def test_environment_build_failure_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import oracle.process

    def failing_build(release: str) -> Path:
        raise oracle.process.OracleSpecError(f"--oracle vllm=={release}: tox -e vllm-{release} failed (exit 1)")

    _requirements(tmp_path, ["99.0.0"], monkeypatch)
    monkeypatch.setattr(oracle.process, "ensure_environment", failing_build)
    assert drift_cli(["--against", "vllm==99.0.0", "--out", str(tmp_path / "out")], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--against vllm==99.0.0: tox -e vllm-99.0.0 failed (exit 1)" in err
    assert not (tmp_path / "out").exists()


def test_error_classes_fold_numbers_and_the_release_name() -> None:
    from harness.night.drift import error_class

    first = error_class("OracleProcessError: vllm==0.33.0: ValueError: 12 rows over 3 requests")
    second = error_class("OracleProcessError: vllm==1.2.3: ValueError: 7 rows over 1 requests")
    assert first == second == "ValueError: N rows over N requests"
