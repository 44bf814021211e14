"""The seeded generator: determinism, validity and family coverage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.cases.files import case_from_json
from harness.cases.generate import FAMILIES, generate
from harness.cases.suites import SUITES_FILE, load_suite, workspace_grids
from harness.cases.sweep_families import WORST_CASE_CONTEXT

SNIPPET = (
    "import hashlib, json; from harness.cases.generate import generate; "
    "print(hashlib.sha256(json.dumps([c.to_json() for c in generate(123, 300)]).encode()).hexdigest())"
)


def digest_in_subprocess(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-c", SNIPPET], env=env, check=True, capture_output=True, text=True).stdout


def test_same_seed_same_cases() -> None:
    assert list(generate(42, 200)) == list(generate(42, 200))


def test_different_seed_different_cases() -> None:
    assert list(generate(42, 50)) != list(generate(43, 50))


def test_independent_of_hash_seed() -> None:
    assert digest_in_subprocess("0") == digest_in_subprocess("12345")


def test_prefix_stable() -> None:
    """Growing a suite's size never changes the cases it already had."""
    assert list(generate(7, 100)) == list(generate(7, 300))[:100]


def test_every_generated_case_is_valid_input() -> None:
    for case in generate(20260825, 2000):
        assert case_from_json(case.to_json(), case.name) == case


def test_families_cover_the_contract() -> None:
    cases = list(load_suite("ci").cases)
    assert len(cases) >= 5000
    families = Counter(c.family for c in cases)
    assert set(FAMILIES) <= set(families)
    assert max(c.num_requests for c in cases if c.family == "many-requests") >= 1024
    assert min(c.num_requests for c in cases if c.family == "many-requests") >= 512
    dcp = [c for c in cases if c.family == "dcp" and c.numeric is None]  # the sweep's (L3's: test_dcp_numeric)
    assert {c.dcp_world_size for c in dcp} == {2, 4, 8}
    assert {c.cp_kv_cache_interleave_size for c in dcp} == {1, 16, 64}
    assert {c.block_size for c in dcp} == {16, 64, 128}
    assert any(c.context_lens == WORST_CASE_CONTEXT and c.workspace_size == 65536 for c in cases)
    tiny = [c for c in cases if c.family == "tiny-workspace"]
    assert any(c.workspace_size == c.alignment for c in tiny)
    zero = [c for c in cases if c.family == "zero-context"]
    assert any(c.context_lens[0] == 0 and c.context_lens[-1] > 0 for c in zero)
    assert any(c.context_lens[-1] == 0 and c.context_lens[0] > 0 for c in zero)
    exact = [c for c in cases if c.family == "exact-fit"]
    offsets = {sum(c.context_lens) - c.workspace_size for c in exact}
    assert {0, -1, 1} <= offsets
    assert any(c.context_lens[-1] > 4 * c.workspace_size for c in cases if c.family == "long-single")


def test_size_scales_every_part_of_a_night() -> None:
    """``--size`` scales the whole night (cases/suites.py, SuiteScale): size 10
    is at most a fifth of size 100 (about a tenth), and size 100 a fifth of
    size 1000, counted as a night counts its items (every level); every kind of
    item the full night has, a size-10 night still has."""

    from harness.sides.items import LEVELS
    from harness.sides.runner import plan_items

    def kinds(size: int) -> Counter[str]:
        return Counter(kind for kind, _ in plan_items(load_suite("nightly", size=size), LEVELS))

    tiny, small, large = kinds(10), kinds(100), kinds(1000)
    assert 0 < tiny.total() * 5 <= small.total(), (tiny, small)
    assert small.total() * 5 <= large.total(), (small, large)
    assert set(tiny) == set(large), set(large) - set(tiny)
    # The workspace grids scale too: size 1000 (a fiftieth of the night) keeps a fiftieth of them.
    spec = json.loads(SUITES_FILE.read_text(encoding="utf-8"))["nightly"]
    grid = workspace_grids(spec["workspace_grid"])
    assert large["workspace"] == len(grid) * 1000 // spec["generate"][0]["count"]
    assert kinds(0).total() == 0  # --size 0 is empty: a run of it is refused, never a PASS


def test_nightly_size_is_a_parameter() -> None:
    small, large = load_suite("nightly", size=30), load_suite("nightly", size=60)
    assert len(large.cases) - len(small.cases) == 30
    assert sum(c.family == "uniform" and c.name.startswith("uniform-") for c in small.cases) == 3
    json.dumps([c.to_json() for c in small.cases])


def test_a_suite_is_loaded_once_per_process_until_its_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.cases.suites as suites

    cases = tmp_path / "cases"
    shutil.copytree(suites.CASES_DIR, cases)
    monkeypatch.setattr(suites, "CASES_DIR", cases)
    monkeypatch.setattr(suites, "SUITES_FILE", cases / "suites.json")
    first = load_suite("smoke")
    assert load_suite("smoke") is first
    assert load_suite("smoke", size=1) is not first
    # An edited case file is another load, and the suite holds the edit.
    (name,) = [p for p in (cases / "smoke").glob("*.json") if p.name == "giant-middle.json"]
    data = json.loads(name.read_text())
    data["block_size"] = 32 if data.get("block_size") != 32 else 64
    name.write_text(json.dumps(data))
    edited = load_suite("smoke")
    assert edited is not first and edited != first
    assert load_suite("smoke") is edited


def test_draws_below_are_randint_and_choice() -> None:
    """The families' hot loops draw through draws_below instead of randint and
    choice: the same values in the same order (a Python whose random module
    drew otherwise would change every suite, and fails here first)."""
    import random

    from harness.cases.sweep_families import draws_below

    for seed in range(200):
        through_api, direct = random.Random(seed), random.Random(seed)
        draw = draws_below(direct)
        widths = [1, 2, 3, 5, 8, 32, 64, 600, 2 * 544 + 1, 1 << 20]
        for width in widths * 5:
            assert through_api.randint(1, width) == 1 + draw(width)
            options = (1, 1, 2, 3, width)
            assert through_api.choice(options) == options[draw(len(options))]
        assert through_api.random() == direct.random()


def test_the_hot_loops_draw_what_randint_and_choice_drew() -> None:
    """Each loop rewritten over draws_below against its randint-and-choice form:
    the same values, and the stream left at the same place."""
    import random

    from harness.cases import coverage_families, sweep_families

    def many_requests_as_written(rng: random.Random) -> object:
        block, workspace = sweep_families._base(rng)
        n = rng.randint(512, 1024)
        contexts = [rng.choice((0, rng.randint(1, 64), rng.randint(1, 2 * block + 1))) for _ in range(n)]
        return sweep_families._case("many-requests", contexts, rng, block, workspace)

    for seed in range(40):
        new, old = random.Random(seed), random.Random(seed)
        assert sweep_families.many_requests(new) == many_requests_as_written(old)
        for n in (0, 1, 7, 300):
            assert sweep_families._queries(new, n) == tuple(
                old.choice((1, old.randint(1, 32), old.randint(1, 600))) for _ in range(n)
            )
            assert coverage_families._small_query_lens(new, n) == tuple(
                old.choice((1, 1, 2, old.randint(1, 8))) for _ in range(n)
            )
            for block in (1, 3, 16, 544):
                assert coverage_families._few_rows(new, block, n) == [
                    old.choice((1, 1, 2, 3, old.randint(1, min(64, 2 * block)))) for _ in range(n)
                ]
        assert new.random() == old.random()


def test_a_size_past_the_suites_own_is_refused_where_digests_check_the_inputs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A smaller --size is a subset of the digested items and runs; a larger one
    grows tensor items no committed input digest covers: refused, one line."""
    from harness.cli import main

    assert main(["run", "--suite", "ci", "--size", "100", "--level", "merge"]) == 0
    capsys.readouterr()
    assert main(["run", "--suite", "ci", "--size", "10000", "--level", "merge"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--size 10000: suite ci grown past its own size" in err
