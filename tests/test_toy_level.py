"""A level is one module: tests/toy_level.py registers ``chunk-count`` with no
harness file edited, and it runs through ``run``, ``gate``, ``diff``, a night
and the pytest plugin, over an in-process port and over the external protocol;
no list of level names exists outside the registry."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main
from harness.model.levels import KINDS, LEVELS, PLUGINS_VARIABLE, register_level, unregister_level

ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests.toy_level"
PORT, BUG_PORT = f"{MODULE}:PORT", f"{MODULE}:BUG_PORT"
BUG_PROGRAM = f"cmd:{shlex.join([sys.executable, str(ROOT / 'tests' / 'toy_level.py'), '--bug'])}"
SMOKE = ["--suite", "smoke", "--level", "chunk-count"]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy level registered here and named for every process the harness
    starts; taken out again afterwards (other tests see the built-in levels)."""
    from tests import toy_level

    register_level(toy_level.TOY)
    monkeypatch.setenv(PLUGINS_VARIABLE, MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        yield
    finally:
        unregister_level(toy_level.LEVEL)


def bug_cases() -> set[str]:
    """The smoke cases the buggy toy port answers wrongly, by the rule it breaks."""
    from harness.cases.suites import load_suite

    return {case.name for case in load_suite("smoke").cases if len(case.context_lens) >= 3}


def divergent_ids(path: Path) -> set[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert rows and {row["kind"] for row in rows} == {"chunk-count"}
    return {row["id"] for row in rows if row["status"] == "divergent"}


def test_a_registered_level_is_in_every_list(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert LEVELS[-1] == "chunk-count" and KINDS[-1] == "chunk-count"
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "chunk-count" in capsys.readouterr().out


def test_the_toy_level_through_run_gate_and_diff(toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = {f"{name}[chunk-count]" for name in bug_cases()}
    assert main(["run", *SMOKE, "--port", PORT, "--results", str(tmp_path / "good.jsonl")]) == 0
    assert divergent_ids(tmp_path / "good.jsonl") == set()
    assert main(["run", *SMOKE, "--port", BUG_PORT, "--results", str(tmp_path / "bug.jsonl")]) == 1
    assert divergent_ids(tmp_path / "bug.jsonl") == expected
    # Over the external protocol: the same items diverge.
    assert main(["run", *SMOKE, "--port", BUG_PROGRAM, "--results", str(tmp_path / "cmd.jsonl")]) == 1
    assert divergent_ids(tmp_path / "cmd.jsonl") == expected
    capsys.readouterr()

    assert main(["gate", *SMOKE, "--port", PORT, "--out", str(tmp_path / "pass")]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["gate", *SMOKE, "--port", BUG_PORT, "--out", str(tmp_path / "fail")]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "num_chunks" in out
    # Its reproduce line names the plug-in, so it runs in a fresh shell.
    line = next(text for text in out.splitlines() if "reproduce:" in text)
    assert f"{PLUGINS_VARIABLE}={MODULE}" in line and "--level chunk-count" in line

    item = f"{sorted(expected)[0]}"
    assert main(["diff", item, "--suite", "smoke", "--port", BUG_PORT]) == 1
    out = capsys.readouterr().out
    assert "num_chunks" in out and "verdict: DIVERGENT (chunk-count divergent)" in out


def test_the_toy_level_in_the_pytest_plugin(toy: None, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--noconftest", "--parity-port", BUG_PORT,
         "--parity-suite", "smoke", "--parity-level", "chunk-count", "--junitxml", str(junit)],
        cwd=ROOT, capture_output=True, text=True, check=False, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    cases = ET.parse(junit).getroot().findall(".//testcase")
    failed = {str(c.get("name")) for c in cases if c.find("failure") is not None}
    assert len(cases) == 88 and all(name.endswith("[chunk-count]") for name in failed)
    assert {name.split("[")[0].removeprefix("smoke.") for name in failed} == bug_cases()


def test_the_toy_level_in_a_night(toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--level", "chunk-count", "--skip-mutants", "--explore-budget-s", "0", "--date", "2026-12-05"]
    code = main(["nightly", "--size", "20", "--numeric-size", "8", "--ports", BUG_PORT, "--out", str(tmp_path), *argv])
    capsys.readouterr()
    assert code == 1
    page = (tmp_path / "2026-12-05" / "index.html").read_text()
    assert "chunk-count" in page and "num_chunks" in page


# -- no list of level names outside the registry -----------------------------------------------

# Vocabularies that share words with the levels' names but are not lists of
# levels: (file, the constant or function holding it) and what it is.
NOT_LEVEL_LISTS = {
    # The oracle cache's entry kinds, one per oracle method (sparse-remap among them).
    ("harness/sides/oracle_cache_store.py", "ENTRY_FORMATS"),
    # The suite files' groups that --numeric-size sets.
    ("harness/night/sizes.py", "NUMERIC_GROUPS"),
}


def _named_spans(tree: ast.AST) -> dict[str, tuple[int, int]]:
    """Each function's and each assigned name's lines."""
    spans = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            spans[node.name] = (node.lineno, node.end_lineno or node.lineno)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    spans[target.id] = (node.lineno, node.end_lineno or node.lineno)
    return spans


def level_lists(path: Path, root: Path = ROOT) -> list[str]:
    """Each tuple, list, set or dict in ``path`` holding two or more of the
    built-in levels' or kinds' names as literals, but those of
    :data:`NOT_LEVEL_LISTS`."""
    names = set(KINDS) | set(LEVELS)
    where = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    spans = _named_spans(tree)
    allowed = [spans[name] for file, name in NOT_LEVEL_LISTS if file == where and name in spans]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elements = node.elts
        elif isinstance(node, ast.Dict):
            elements = [key for key in node.keys if key is not None]
        else:
            continue
        words = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        # Kind.X / Level.X members count as their names.
        words |= {
            f"{e.value.id}.{e.attr}"
            for e in elements
            if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in {"Kind", "Level"}
        }
        names_here = names | {w for w in words if w.startswith(("Kind.", "Level."))}
        if len(words & names_here) >= 2 and not any(first <= node.lineno <= last for first, last in allowed):
            found.append(f"{where}:{node.lineno}: {sorted(words & names_here)}")
    return found


def _is_level_name(node: ast.expr) -> bool:
    """A literal level or kind name, ``Level.X`` / ``Kind.X``, or a tuple of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in set(KINDS) | set(LEVELS)
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id in {"Kind", "Level"}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_level_name(e) for e in node.elts)
    return False


# Branches on a built-in kind that are not a level's behaviour, each with its reason.
NOT_DISPATCH = {
    # The oracle's trace asks the pinned release its own fixed questions, tagged by
    # the built-in kind that asks them (the sparse workspace size under sparse-layout's).
    "oracle/trace.py",
    # Prose on why vllm 0.27.1 differs at each built-in level, for the legacy baseline.
    "tools/measure_baseline.py",
}


def kind_dispatches(path: Path, root: Path = ROOT) -> list[str]:
    """Each comparison of a value with a level's or kind's name (``kind ==
    "merge"``, ``Kind.LAYOUT != kind``, ``level in ("prefill", ...)``) and each
    ``match`` on one: a branch on the level, which belongs to the level's module."""
    where = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            # ``x == "merge"`` either way round; ``x in ("merge", ...)`` (a literal
            # looked up in a container, ``"merge" in spec``, is a key, not a branch).
            pairs = zip([node.left, *node.comparators], node.ops, node.comparators, strict=False)
            if any(
                (isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot) and (_is_level_name(a) or _is_level_name(b)))
                or (isinstance(op, ast.In | ast.NotIn) and _is_level_name(b))
                for a, op, b in pairs
            ):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.match_case) and _is_level_name(getattr(node.pattern, "value", ast.Constant(None))):
            found.append(f"{where}:{node.pattern.lineno}: case {ast.unparse(node.pattern)}")
    return found


def test_no_dispatch_on_a_level_outside_its_module() -> None:
    """No ``if kind == ...`` is left: whatever differs by level is the level's
    (its module's hooks); the registry and the level modules themselves aside."""
    found = []
    for folder in ("harness", "oracle", "ports", "reports", "tools", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent.name != "levels" and path.relative_to(ROOT).as_posix() not in NOT_DISPATCH:
                found += kind_dispatches(path)
    assert found == []


def test_the_grep_finds_a_dispatch_on_a_level(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def run(kind, item):\n    if kind == 'merge':\n        return 1\n"
        "    if Kind.PREFILL != kind:\n        return 2\n    return kind in ('sparse-mask', 'x')\n"
    )
    assert [hit.split(": ", 1)[0] for hit in kind_dispatches(planted, tmp_path)] == [
        "planted.py:2",
        "planted.py:4",
        "planted.py:6",
    ]


def test_a_served_oracle_answers_the_toy_levels_op(toy: None) -> None:
    """A release served as the oracle (``python -m oracle.serve``, here the
    pinned one in a process of its own) answers the plug-in level's op from the
    level's module: its hello lists it beside the built-in ones, its answer is
    that release's, and an op no level serves is an error reply."""
    from harness.cases.suites import load_suite
    from harness.protocol.errors import ExternalPortError
    from oracle.pin import load_pin
    from oracle.process import OracleProcess
    from oracle.side import OracleSide

    served = OracleProcess(load_pin()["release_version"], Path(sys.executable))
    try:
        assert {"layout", "oracle_prefill", "topk_remap", "chunk_count"} <= set(served.hello["ops"])
        cases = [c for c in load_suite("smoke").cases if c.dcp_world_size == 1][:12]
        answers = [served.count_chunks(case) for case in cases]
        assert answers == [OracleSide().plan_layout(case).num_chunks for case in cases]
        assert len(set(answers)) > 1
        with pytest.raises(ExternalPortError, match="unknown op 'chunk_total'"):
            served.request({"op": "chunk_total"})
    finally:
        served.close()


def test_the_toy_levels_coverage_is_measured_with_the_rest(toy: None) -> None:
    """``parity coverage`` measures a plug-in level's features by its hook, after
    every built-in level's, and shows them as it shows any feature."""
    from harness.cases.suites import load_suite
    from harness.search.coverage import FEATURE_BY_ID, FEATURES
    from harness.search.coverage_measuring import measure
    from harness.search.coverage_verdicts import judge
    from oracle.side import OracleSide
    from reports.coverage import render_text

    assert FEATURES[-1].id == "chunk-count.most_chunks" and "chunk-count.most_chunks" in FEATURE_BY_ID
    suite = load_suite("smoke")
    oracle = OracleSide()
    report = measure(suite, oracle)
    assert report.values["chunk-count.most_chunks"] == max(oracle.plan_layout(c).num_chunks for c in suite.cases) > 1
    assert report.values["layout.cases"] == len(suite.cases)
    # The project's targets file has no row for a plug-in's feature: read all the same, shown, not judged.
    from harness.search.coverage_targets import load_targets

    judged = judge(report, load_targets()["ci"])
    (toy_verdict,) = [v for v in judged.verdicts if v.feature == "chunk-count.most_chunks"]
    assert toy_verdict.met is None and toy_verdict.target is None
    most = report.values["chunk-count.most_chunks"]
    assert any(
        line.split()[:2] == ["chunk-count.most_chunks", str(most)]
        for line in render_text(judge(report, [])).splitlines()
    )


def test_a_coverage_refusal_must_be_one_of_its_levels_count_features(toy: None) -> None:
    """A refusal is held to at_most 0 by its id: a misspelt one would hold nothing, so it is refused."""
    import dataclasses

    from harness.model.levels import CoverageHook, LevelRegistryError
    from harness.search.coverage import FEATURES
    from tests import toy_level

    unregister_level(toy_level.LEVEL)
    register_level(
        dataclasses.replace(
            toy_level.TOY, coverage=CoverageHook(lambda: toy_level.FEATURES, print, ("chunk-count.refused",))
        )
    )
    try:
        with pytest.raises(LevelRegistryError, match=r"coverage refusal 'chunk-count\.refused' is none of"):
            len(FEATURES)
    finally:
        unregister_level(toy_level.LEVEL)
        register_level(toy_level.TOY)


def test_no_list_of_levels_outside_the_registry() -> None:
    registry = ROOT / "harness" / "model" / "levels.py"
    found = []
    for folder in ("harness", "oracle", "ports", "reports", "tools", "benchmarks"):
        found += [
            hit for path in sorted((ROOT / folder).rglob("*.py")) if path != registry for hit in level_lists(path)
        ]
    assert found == []


def test_the_grep_finds_a_list_of_levels(tmp_path: Path) -> None:
    planted = tmp_path / "harness" / "sides" / "oracle_cache_store.py"
    planted.parent.mkdir(parents=True)
    planted.write_text('CHOICES = ("layout", "prefill")\n\n\nENTRY_FORMATS = {"merge": 1, "prefill": 2}\n')
    assert level_lists(planted, tmp_path) == ["harness/sides/oracle_cache_store.py:1: ['layout', 'prefill']"]


def test_a_port_that_registers_a_level_as_it_loads_is_refused(
    toy: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its level would be planned by no run and known to no worker: one line, exit 2."""
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "late_level.py").write_text(
        "import dataclasses\nfrom tests import toy_level\nfrom harness.model.levels import register_level\n"
        "register_level(dataclasses.replace(toy_level.TOY, name='late', served={}, kinds=(dataclasses.replace("
        "toy_level.TOY.kinds[0], name='late'),)))\nPORT = toy_level.PORT\n"
    )
    try:
        assert main(["run", "--suite", "smoke", "--level", "layout", "--port", "late_level:PORT"]) == 2
        assert "registered level late as it loaded: name its module in PARITY_PLUGINS" in capsys.readouterr().err
    finally:
        unregister_level("late")
        importlib.invalidate_caches()


def test_a_level_is_registered_after_the_built_in_ones_and_checked(toy: None) -> None:
    import dataclasses

    from harness.model.levels import LevelRegistryError, LevelSpec
    from tests import toy_level

    spec = toy_level.TOY
    assert list(LEVELS)[:6] == ["layout", "merge", "prefill", "sparse-layout", "sparse-mask", "sparse-prefill"]
    twice = dataclasses.replace(spec, name="twice", kinds=(spec.kinds[0], spec.kinds[0]))
    for bad, why in (
        (dataclasses.replace(spec, name="none", port_methods=()), "names no port method"),
        (dataclasses.replace(twice, kinds=(dataclasses.replace(spec.kinds[0], name="t"),) * 2), "declared twice"),
        (dataclasses.replace(spec, name="taken", kinds=(dataclasses.replace(spec.kinds[0], name="merge"),)), "another"),
        (LevelSpec("empty", "nothing", (), ("m",), host=True, floats=False), "no kinds"),
        (
            dataclasses.replace(
                spec,
                name="op",
                kinds=(dataclasses.replace(spec.kinds[0], name="op"),),
                served={"merge": lambda side, request: {}},
            ),
            "served op 'merge' is another level's",
        ),
    ):
        with pytest.raises(LevelRegistryError, match=why):
            register_level(bad)


def test_the_built_in_levels_come_first_whichever_module_is_imported_first() -> None:
    """A built-in level module imported before the registry is asked, with a plug-in named:
    the plug-in waits until every built-in level is in (their items keep their indices)."""
    code = "import harness.levels.sparse_mask\nfrom harness.model.levels import LEVELS\nprint(','.join(LEVELS))"
    env = {**os.environ, PLUGINS_VARIABLE: MODULE, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["layout,merge,prefill,sparse-layout,sparse-mask,sparse-prefill,chunk-count"]


def test_a_count_key_of_the_summarys_own_is_refused(toy: None) -> None:
    import dataclasses

    from harness.model.levels import LevelRegistryError
    from tests import toy_level

    spec = toy_level.TOY
    for key in ("verdict", "layout_cases"):
        kind = dataclasses.replace(spec.kinds[0], name="keyed", count_key=key)
        with pytest.raises(LevelRegistryError, match="count key"):
            register_level(dataclasses.replace(spec, name="keyed", kinds=(kind,)))
