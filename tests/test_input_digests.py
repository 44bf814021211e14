"""The inputs are a function of the case alone (harness/kernels/draws.py): the
committed digests (cases/input_digests.json) hold at one and two threads here,
and under every other CPU capability this machine offers, with numpy's own SIMD
dispatch off, in tests/test_output_digests.py's children (which check the
inputs before the outputs);
a machine that draws other inputs is refused in one line before any work, and
an item whose inputs differ is not run."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.kernels import draws
from harness.sides import input_digests

ROOT = Path(__file__).resolve().parent.parent
_TOOL = importlib.util.spec_from_file_location("input_digests_tool", ROOT / "tools" / "input_digests.py")
assert _TOOL is not None and _TOOL.loader is not None
input_digests_tool = importlib.util.module_from_spec(_TOOL)
_TOOL.loader.exec_module(input_digests_tool)
# torch's CPU capabilities, each a superset of the one before it.
CAPABILITIES = ("default", "avx2", "avx512")
# numpy's x86 SIMD features: off, its kernels take their baseline paths.
NUMPY_SIMD = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR AVX2 FMA3 F16C AVX"


def offered_capabilities() -> list[str]:
    """The capabilities below this machine's best, each of which ATEN_CPU_CAPABILITY can select."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    return list(CAPABILITIES[: CAPABILITIES.index(best)]) if best in CAPABILITIES else ["default"]


def test_the_committed_digests_hold_here_at_one_and_two_threads() -> None:
    """This process (its best capability), the file as written and as found at 1 and 2 threads."""
    committed = input_digests.committed()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert input_digests_tool.current_digests() == committed
    finally:
        torch.set_num_threads(1)
    assert len(committed["items"]) > 500


@pytest.fixture
def planted_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Another key derivation: every stream's bits change, as a port of the stream that got it wrong would."""
    original = draws.stream_key

    def planted(seed: int, name: str) -> tuple[int, int]:
        k0, k1 = original(seed, name)
        return k1, k0

    monkeypatch.setattr(draws, "stream_key", planted)
    input_digests.check_stream.cache_clear()
    yield
    input_digests.check_stream.cache_clear()


@pytest.mark.usefixtures("planted_stream")
def test_a_planted_change_of_the_stream_is_refused_at_start_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "rows.jsonl"
    code = main(["run", "--suite", "smoke", "--level", "merge", "--results", str(results)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "cases/input_digests.json: stream: this machine draws inputs whose digest is" in lines[0]
    assert not results.exists()  # refused before any work


def test_an_item_whose_inputs_differ_is_not_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.cases.suites import load_suite

    (case, *_) = load_suite("smoke").merge_cases
    committed = input_digests.committed()
    key = input_digests.item_key("merge", case)
    assert key in committed["items"]
    wrong = {**committed["items"], key: "0" * 16}
    monkeypatch.setattr(input_digests, "committed", lambda: {**committed, "items": wrong})
    # The suite's first merge item is its shard 1's first (shards deal items round-robin).
    code = main(["run", "--suite", "smoke", "--level", "merge", "--shard", "1/20"])
    out = capsys.readouterr().out
    assert code == 1 and "verdict INCOMPLETE" in out, out[-2000:]
    assert re.search(rf"not-run +smoke/{case.name}\[merge\]: its inputs on this machine have digest", out), out[-3000:]


def test_a_digested_suite_the_file_does_not_cover_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item without a digest would be judged unchecked: the file predates the suite."""
    from harness.cases.suites import load_suite

    committed = input_digests.committed()
    dropped = input_digests.item_key("merge", load_suite("smoke").merge_cases[-1])
    items = {key: digest for key, digest in committed["items"].items() if key != dropped}
    monkeypatch.setattr(input_digests, "committed", lambda: {**committed, "items": items})
    code = main(["run", "--suite", "smoke", "--level", "merge"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "input_digests.json: items: no digest for 1 tensor items of suite smoke" in lines[0]
