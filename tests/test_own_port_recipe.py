"""docs/gate-your-own-port.md runs as written.

Each command block of the page is tagged (``<!-- recipe: KIND -->`` before the
fence). ``run`` blocks are run here, in order, at the harness's root, through
bash, with only the placeholder path of the port's repository replaced by a
folder under ``tmp_path`` (outside this repository): the page copies the
harness's own port there under another package name and gates it on the smoke
suite, without a baseline and with an empty one. ``long`` (the ci gate) and
``once`` (building the environment) are checked against what they stand for
without being run; the ``skeleton`` is executed and must be a port of every
level. docs/external-port-protocol.md must define every chunk field.
"""

from __future__ import annotations

import inspect
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.model import Chunk
from harness.protocol.port import ALL_LEVELS, Port, level_methods, port_levels

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "gate-your-own-port.md"
PROTOCOL = ROOT / "docs" / "external-port-protocol.md"
PLACEHOLDER = "/path/to/your/port-repo"
INTERPRETER = ".tox/oracle/bin/python"
KINDS = {"run", "long", "once", "skeleton"}
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)
TAG = re.compile(r"<!-- recipe: (?P<kind>[\w-]+) -->\n$")


def blocks() -> list[tuple[str | None, str, str]]:
    """Every fenced block of the page: its tag (None when untagged), language and body."""
    text = DOC.read_text(encoding="utf-8")
    found = []
    for fence in FENCE.finditer(text):
        tag = TAG.search(text[: fence.start()])
        found.append((tag.group("kind") if tag else None, fence.group("lang"), fence.group("body")))
    return found


def recipe(kind: str) -> list[str]:
    return [body for tag, _, body in blocks() if tag == kind]


def commands(body: str) -> list[str]:
    return [line for line in body.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def test_every_command_on_the_page_is_tagged() -> None:
    for tag, lang, body in blocks():
        if lang in ("sh", "python"):
            assert tag in KINDS, f"an untagged {lang} block: the test would not check it:\n{body}"
    assert len(recipe("run")) >= 4 and len(recipe("skeleton")) == 1
    # Every command names the port's repository by the one placeholder, and
    # runs the harness from the environment's interpreter at the harness's root.
    for body in recipe("run") + recipe("long"):
        for line in commands(body):
            if "-m harness" in line or "harness." in line:
                assert f"{INTERPRETER} -" in line, line


def test_the_recipe_runs_as_written(tmp_path: Path) -> None:
    if not (ROOT / INTERPRETER).exists():
        pytest.fail(f"{INTERPRETER} is missing: the page's commands run from the pinned environment")
    port_repo = tmp_path / "port-repo"
    assert not port_repo.resolve().is_relative_to(ROOT), "the port lives outside the harness"
    gates = []
    for body in recipe("run"):
        script = body.replace(PLACEHOLDER, str(port_repo))
        result = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        shown = f"$ {script}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert result.returncode == 0, f"exit {result.returncode}:\n{shown}"
        if "-m harness gate" in script:
            gates.append(result.stdout)
            # The summary it prints (and writes to summary.md) opens with the verdict.
            assert "## Parity gate: PASS" in result.stdout, shown
    assert len(gates) == 2, "the page gates the port without a baseline and with the empty one"

    # What was gated is the copy outside the repository, under its own name.
    package = port_repo / "my_port"
    sources = sorted(package.glob("*.py"))
    assert sources and not any("ports.per_request" in p.read_text() for p in sources)
    out = port_repo / "parity-out" / "smoke"
    meta: dict[str, Any] = json.loads((out / "gate.json").read_text())
    assert (meta["port"], meta["port_spec"], meta["suite"]) == ("my_port", "my_port:PORT", "smoke")
    assert tuple(meta["levels"]) == ALL_LEVELS
    assert Path(meta["provenance"]["port_repository"]["source"]).is_relative_to(package)
    # The last gate ran with the empty baseline, and passed.
    baseline = port_repo / "parity-baseline.json"
    assert json.loads(baseline.read_text()) == {"entries": []}
    assert meta["baseline"]["path"] == str(baseline)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## Parity gate: PASS\n"), summary[:300]
    for name in ("junit.xml", "results.parquet"):
        assert (out / name).stat().st_size > 0
    # A port at parity drafts the empty baseline.
    assert json.loads((port_repo / "parity-baseline.draft.json").read_text()) == {"entries": []}


def test_the_ci_gate_is_the_smoke_gate_on_the_ci_suite() -> None:
    from harness.cli import build_parser

    smoke = next(line for body in recipe("run") for line in commands(body) if "--suite smoke" in line)
    [ci] = [line for body in recipe("long") for line in commands(body)]
    assert ci == smoke.replace("--suite smoke", "--suite ci").replace("parity-out/smoke", "parity-out/ci")
    words = shlex.split(ci.replace(PLACEHOLDER, "/port-repo"))
    assert words[:4] == ["PYTHONPATH=/port-repo", INTERPRETER, "-m", "harness"], words
    args = build_parser().parse_args(words[4:])
    assert (args.suite, args.port) == ("ci", "my_port:PORT")


def test_the_environment_is_built_as_the_page_says() -> None:
    once = [line for body in recipe("once") for line in commands(body)]
    assert once == ["make gate", "python3 -m pip install 'tox>=4.10' && python3 -m tox -e oracle --notest"]
    assert re.search(r"^gate:", (ROOT / "Makefile").read_text(), re.M)
    tox = (ROOT / "tox.ini").read_text()
    assert "[testenv:oracle]" in tox and "requires = tox>=4.10" in tox


def test_the_skeleton_is_a_port_of_every_level() -> None:
    from ports.per_request import PerRequestPort

    [body] = recipe("skeleton")
    namespace: dict[str, Any] = {}
    exec(compile(body, str(DOC), "exec"), namespace)
    port = namespace["PORT"]
    assert isinstance(port, Port)
    assert port_levels(port) == ALL_LEVELS
    methods = {m for level in ALL_LEVELS for m in level_methods(level)}
    cls = type(port)
    assert {n for n in vars(cls) if not n.startswith("_")} == methods | {"name"}
    # The same arguments as the harness's own port takes.
    for method in methods:
        theirs = inspect.signature(getattr(PerRequestPort, method)).parameters
        assert list(inspect.signature(getattr(cls, method)).parameters) == list(theirs), method


def test_the_protocol_defines_every_chunk_field() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    section = text[text.index("## The fields of a layout") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    defined = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert set(Chunk.field_names()) | {"chunks", "empty_token_slices"} == defined
    # Defined here, not by sections of the contract (docs/contract.md).
    assert not re.search(r"SPEC (sections? )?\d", text), "the protocol points at SPEC for a definition"
