"""The oracle cache: a hit is the fresh answer, bit for bit, and never calls the oracle.

From memory and from disk, errors included; damaged entries, the memory limit,
two processes on one folder and stale folders. What an answer is keyed by, and
what is never cached: tests/test_oracle_cache_keys.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cases.suites import Suite, load_suite
from harness.compare.bits import identical_bits
from harness.compare.sparse import check_sparse_layout
from harness.kernels import kernels_for, kernels_for_case
from harness.kernels.numeric import MergeInputs, case_prefill_inputs, materialise_merge
from harness.model import Case, Layout, WorkspaceConfig
from harness.model.sparse import SparseLayout
from harness.protocol.port import Port
from harness.sides.oracle_cache import CachedOracle, with_oracle_cache
from harness.sides.oracle_cache_answers import CachedOracleError
from harness.sides.oracle_cache_keys import CACHE_FORMAT, oracle_fingerprint, sparse_sources
from harness.sides.oracle_cache_store import LAST_USED, prune_stale_folders, sealed, unsealed
from harness.sides.runner import run_items
from tests.oracle_cache_fakes import (
    FINGERPRINT,
    FakeOracle,
    merge_items,
    numeric_case,
    pinned_provenance,
    prefill_through,
    smoke,
    special_tensors,
)

# An item the pinned oracle refuses at each level: a workspace narrower than
# the alignment (its planner asserts), a configuration of block size 0.
REFUSED_CASE = Case("refused", (100, 30), (1, 2), block_size=16, workspace_size=8)
REFUSED_CONFIG = WorkspaceConfig(2048, 1, 0)


def error_line(exc: BaseException) -> str:
    """What the runner writes for an oracle error (harness.sides.items.one_line, one line)."""
    return f"{type(exc).__name__}: {exc}"


class Recording:
    """The oracle, with every call counted and every answer kept as it came."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.calls = inner, inner.name, 0
        self.answers: list[Any] = []

    def _call(self, method: Callable[[], Any]) -> Any:
        self.calls += 1
        try:
            answer = method()
        except Exception as exc:
            self.answers.append(exc)
            raise
        self.answers.append(answer)
        return answer

    def plan_layout(self, case: Case) -> Layout:
        return self._call(lambda: self.inner.plan_layout(case))  # type: ignore[no-any-return]

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self._call(lambda: self.inner.workspace_size(config))  # type: ignore[no-any-return]

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call(lambda: self.inner.merge_states(inputs))  # type: ignore[no-any-return]

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        return self._call(lambda: self.inner.prefill(case, inputs, kernels))  # type: ignore[no-any-return]


def same_answer(fresh: Any, cached: Any) -> None:
    """Equal layouts (and their JSON), the same int, or the same tensors: names
    in order, dtype, shape, strides, device and bits."""
    if isinstance(fresh, Layout):
        assert type(cached) is Layout and cached == fresh and cached.to_json() == fresh.to_json()
        return
    if isinstance(fresh, int):
        assert type(cached) is type(fresh) and cached == fresh
        return
    fresh_items = list(fresh.items()) if isinstance(fresh, dict) else list(enumerate(fresh))
    cached_items = list(cached.items()) if isinstance(cached, dict) else list(enumerate(cached))
    assert type(cached) is type(fresh) and [n for n, _ in cached_items] == [n for n, _ in fresh_items]
    for (_, a), (_, b) in zip(fresh_items, cached_items, strict=True):
        assert b is not a and b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
        assert (b.dtype, b.shape, b.stride(), b.device) == (a.dtype, a.shape, a.stride(), a.device)
        assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
        assert a.is_floating_point() is False or identical_bits(a, b)


def ask(oracle: Any, kind: str, item: Any) -> Any:
    """The oracle's answer to one item as the runner asks it, or the error it raised."""
    try:
        if kind == "layout":
            return oracle.plan_layout(item)
        if kind == "workspace":
            return oracle.workspace_size(item)
        if kind == "merge":
            return oracle.merge_states(materialise_merge(item))
        return oracle.prefill(item, case_prefill_inputs(item), kernels_for_case(kernels_for("cpu"), item))
    except Exception as exc:
        return exc


PINNED_ITEMS: list[tuple[str, Any]] = [
    *[("layout", smoke(n)) for n in ("numeric-dcp3-interleave4", "many-1024-ones", "zero-all", "noalign-split")],
    ("layout", smoke("widths-dcp-chunk-200-requests")),
    ("layout", REFUSED_CASE),
    ("workspace", WorkspaceConfig(2048, 256, 16)),
    ("workspace", WorkspaceConfig(163840, 1, 64, 4, 64)),
    ("workspace", REFUSED_CONFIG),
    *[("merge", case) for case in merge_items()],
    *[("prefill", smoke(n)) for n in ("numeric-single-chunk", "numeric-dcp3-interleave4", "keyless-finite")],
    ("prefill", Case("refused-l3", (100, 30), (1, 2), 16, 8, numeric=smoke("numeric-single-chunk").numeric)),
]


@pytest.fixture(scope="module")
def provenance() -> dict[str, Any]:
    return pinned_provenance()


def test_hits_from_memory_and_disk_are_the_pinned_oracles_fresh_answers(
    oracle: Port, provenance: dict[str, Any], tmp_path: Path
) -> None:
    recording = Recording(oracle)
    first = with_oracle_cache(recording, provenance, directory=tmp_path)
    assert isinstance(first, CachedOracle) and first.directory is not None
    misses = [ask(first, kind, item) for kind, item in PINNED_ITEMS]
    assert recording.calls == len(PINNED_ITEMS)
    fresh = recording.answers
    # The miss hands back the oracle's own answer.
    assert all(m is f for m, f in zip(misses, fresh, strict=True))
    errors = [i for i, answer in enumerate(fresh) if isinstance(answer, Exception)]
    assert {PINNED_ITEMS[i][0] for i in errors} == {"layout", "workspace", "prefill"}

    second = with_oracle_cache(recording, provenance, directory=tmp_path)
    assert isinstance(second, CachedOracle) and second.directory is not None
    for cache in (first, second):  # memory, then disk
        for (kind, item), answer in zip(PINNED_ITEMS, fresh, strict=True):
            hit = ask(cache, kind, item)
            if isinstance(answer, Exception):
                assert isinstance(hit, Exception) and error_line(hit) == error_line(answer), (kind, item.name)
                assert type(hit) is type(answer)  # AssertionError, ZeroDivisionError rebuild as themselves
            else:
                same_answer(answer, hit)
    assert recording.calls == len(PINNED_ITEMS)
    assert first.stats()["memory_hits"] == len(PINNED_ITEMS) and first.stats()["misses"] == len(PINNED_ITEMS)
    assert second.stats()["disk_hits"] == len(PINNED_ITEMS) and second.stats()["misses"] == 0
    assert len([p for p in second.directory.iterdir() if p.name != LAST_USED]) == len(PINNED_ITEMS)


def test_a_run_through_the_cache_writes_the_same_rows(oracle: Port, provenance: dict[str, Any], tmp_path: Path) -> None:
    from harness.sides.loading import load_port

    suite = Suite(
        "cache-check",
        (smoke("numeric-single-chunk"), smoke("tails-split"), smoke("dcp4-i16-b64"), REFUSED_CASE),
        (WorkspaceConfig(2048, 256, 16), REFUSED_CONFIG),
        tuple(merge_items()[:2]),
    )
    levels = ("layout", "merge", "prefill")
    port = load_port("equal_share")  # diverges from the pinned oracle: rows with divergences

    def rows(side: Any) -> list[dict[str, Any]]:
        return [r.to_json() for r in run_items(side, port, suite, levels)]

    uncached = rows(oracle)
    statuses = {row["status"] for row in uncached}
    assert {"parity", "oracle-error"} <= statuses and statuses - {"parity", "oracle-error"}
    first = with_oracle_cache(oracle, provenance, directory=tmp_path)
    assert rows(first) == uncached  # misses
    assert rows(first) == uncached  # memory hits
    assert rows(with_oracle_cache(oracle, provenance, directory=tmp_path)) == uncached  # disk hits


def sparse_sample() -> Suite:
    """A few of the smoke suite's items at each sparse level: every route's
    batches (an oracle refusal among them), sparse L3 batches, workspace
    settings and mask cases of every form."""
    full = load_suite("smoke")
    routes: dict[Any, Any] = {}
    for case in full.sparse_cases:
        routes.setdefault((case.numeric is not None, case.family), case)
    # Masked MHA forced where the masked kernel is missing: the oracle refuses it at L3.
    l3 = next(c for c in full.sparse_cases if c.numeric is not None)
    routes["refused"] = dataclasses.replace(l3, name="refused-l3", masked_kernel=False, force_masked_mha=True)
    forms: dict[str, Any] = {}
    for mask in full.mask_cases:
        forms.setdefault(mask.form, mask)
    return Suite(
        "sparse-cache-check",
        (),
        (),
        sparse_cases=tuple(routes.values()),
        sparse_workspace_configs=full.sparse_workspace_configs[::12],
        mask_cases=tuple(forms.values()),
    )


SPARSE_LEVELS = ("sparse-layout", "sparse-mask", "sparse-prefill")


def test_the_sparse_levels_rows_are_the_same_through_the_cache(
    oracle: Port, provenance: dict[str, Any], tmp_path: Path
) -> None:
    """Every sparse question is kept (none passed through): misses, memory hits
    and disk hits give the uncached run's rows, whose statuses include an
    oracle refusal and the divergences of the equal_share port."""
    from harness.sides.loading import load_port

    suite = sparse_sample()
    assert suite.sparse_cases and suite.mask_cases and suite.sparse_workspace_configs
    ports = [load_port("per_request"), load_port("equal_share")]

    def rows(side: Any) -> list[dict[str, Any]]:
        return [r.to_json() for port in ports for r in run_items(side, port, suite, SPARSE_LEVELS)]

    uncached = rows(oracle)
    assert {row["kind"] for row in uncached} == {*SPARSE_LEVELS, "sparse-workspace"}
    statuses = {row["status"] for row in uncached}
    assert {"parity", "oracle-error"} <= statuses and statuses - {"parity", "oracle-error", "not-run"}
    first = with_oracle_cache(oracle, provenance, directory=tmp_path)
    assert isinstance(first, CachedOracle) and first.directory is not None
    assert rows(first) == uncached  # misses
    stats = first.stats()
    assert stats["bypassed"] == 0 and stats["misses"] == stats["stored"] > 0 and stats["memory_hits"] > 0
    assert rows(first) == uncached  # memory hits
    second = with_oracle_cache(oracle, provenance, directory=tmp_path)
    assert isinstance(second, CachedOracle)
    assert rows(second) == uncached  # disk hits
    assert second.stats()["misses"] == 0 and second.stats()["disk_hits"] == stats["stored"]
    kinds = {p.name.split("-", 2)[1] if p.name.startswith("sparse-") else "" for p in first.directory.iterdir()}
    assert {"layout", "workspace", "mask", "remap", "prefill"} <= kinds


def test_sparse_hits_are_the_fresh_answers_bit_for_bit(
    oracle: Port, provenance: dict[str, Any], tmp_path: Path
) -> None:
    """A sparse layout comes back equal and of the same types; a mask, a remap and
    a sparse prefill as the same tensors (dtype, shape, strides, bits)."""
    from harness.cases.sparse_inputs import materialise_topk
    from harness.kernels.sparse_prefill import materialise_sparse_prefill

    suite = sparse_sample()
    kernels = kernels_for("cpu")
    l3 = next(c for c in suite.sparse_cases if c.numeric is not None and oracle.plan_sparse(c).route != "mqa")  # type: ignore[attr-defined]
    questions: list[Callable[[Any], Any]] = [
        *[lambda side, c=c: side.plan_sparse(c) for c in suite.sparse_cases],
        *[lambda side, c=c: side.sparse_workspace_size(c) for c in suite.sparse_workspace_configs],
        *[lambda side, m=m: side.build_topk_mask(m, materialise_topk(m)) for m in suite.mask_cases],
        *[lambda side, m=m: side.remap_topk(m, materialise_topk(m)) for m in suite.mask_cases],
        lambda side: side.sparse_prefill(l3, materialise_sparse_prefill(l3, "cpu"), kernels),
    ]
    fresh = [ask_or_error(q, oracle) for q in questions]
    first = with_oracle_cache(oracle, provenance, directory=tmp_path)
    for cache in (first, first, with_oracle_cache(oracle, provenance, directory=tmp_path)):  # miss, memory, disk
        for question, answer in zip(questions, fresh, strict=True):
            hit = ask_or_error(question, cache)
            if isinstance(answer, Exception):
                assert isinstance(hit, Exception) and error_line(hit) == error_line(answer)
            elif isinstance(answer, SparseLayout):
                assert type(hit) is SparseLayout and hit == answer and hit.to_json() == answer.to_json()
                assert check_sparse_layout(hit) is hit
            elif isinstance(answer, torch.Tensor):
                same_answer([answer], [hit])
            else:
                same_answer(answer, hit)


class SparseWithoutSources:
    """The pinned oracle's sparse layouts from an oracle that cannot name the
    vLLM sources its sparse path runs (as a served release cannot)."""

    name = "oracle"

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def plan_layout(self, case: Case) -> Layout:
        return self.inner.plan_layout(case)  # type: ignore[no-any-return]

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self.inner.workspace_size(config)  # type: ignore[no-any-return]

    def plan_sparse(self, case: Any) -> SparseLayout:
        return self.inner.plan_sparse(case)  # type: ignore[no-any-return]

    def sparse_workspace_size(self, config: Any) -> int:
        return self.inner.sparse_workspace_size(config)  # type: ignore[no-any-return]


def test_sparse_answers_reach_disk_only_under_the_sparse_sources(
    oracle: Port, provenance: dict[str, Any], tmp_path: Path
) -> None:
    """The pin fingerprints the dense symbols only: the installed sparse backend's
    source files are part of the fingerprint, and an oracle that cannot name
    them keeps its sparse answers in memory (a later run asks afresh)."""
    case = sparse_sample().sparse_cases[0]
    digest = oracle.sparse_source_digest()  # type: ignore[attr-defined]
    assert sparse_sources(oracle) == digest and len(digest) == 64
    assert oracle_fingerprint(oracle, provenance, digest) != oracle_fingerprint(oracle, provenance, "0" * 64)
    blind = SparseWithoutSources(oracle)
    assert sparse_sources(blind) is None
    for run in range(2):
        cache = with_oracle_cache(blind, provenance, directory=tmp_path)
        assert isinstance(cache, CachedOracle) and cache.directory is not None
        cache.plan_sparse(case)
        cache.plan_layout(smoke("zero-all"))
        assert cache.stats()["misses"] == (2 if run == 0 else 1), run  # the layout from disk, the sparse one afresh
        assert not [p for p in cache.directory.iterdir() if p.name.startswith("sparse-")]


def ask_or_error(question: Callable[[Any], Any], side: Any) -> Any:
    try:
        return question(side)
    except Exception as exc:
        return exc


def test_special_bit_patterns_order_and_strides_survive_memory_and_disk(tmp_path: Path) -> None:
    fake = FakeOracle()
    case = numeric_case(1)
    fresh = special_tensors(case)
    assert fresh["z_lse"].isnan().any() and (fresh["z_lse"] == float("inf")).any()
    first = CachedOracle(fake, FINGERPRINT, tmp_path)
    prefill_through(first, case)
    memory = prefill_through(first, case)
    disk = prefill_through(CachedOracle(fake, FINGERPRINT, tmp_path), case)
    assert fake.calls == 1
    for hit in (memory, disk):
        same_answer(fresh, hit)
        # Bits, not values: the NaN payloads and the sign of zero.
        assert torch.equal(hit["z_lse"].contiguous().view(torch.int32), fresh["z_lse"].contiguous().view(torch.int32))


def test_a_hit_never_calls_the_oracle_and_a_miss_calls_it_once(tmp_path: Path) -> None:
    fake = FakeOracle()
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    cases = [numeric_case(i) for i in range(3)]
    config = WorkspaceConfig(100, 3, 16)
    for _ in range(3):
        for case in cases:
            cache.plan_layout(case)
            prefill_through(cache, case)
        cache.workspace_size(config)
    assert fake.calls == 2 * len(cases) + 1
    stats = cache.stats()
    assert stats["misses"] == fake.calls and stats["memory_hits"] == 2 * fake.calls and stats["stored"] == fake.calls


def test_default_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from harness.sides.oracle_cache_store import default_cache_directory

    monkeypatch.setenv("PARITY_ORACLE_CACHE", str(tmp_path / "chosen"))
    assert default_cache_directory() == tmp_path / "chosen"
    monkeypatch.delenv("PARITY_ORACLE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_directory() == tmp_path / "xdg" / "mla-parity" / "oracle"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other-key", "flipped-bit"])
@pytest.mark.parametrize("kind", ["layout", "prefill"])
def test_a_damaged_entry_is_a_miss_and_is_rewritten(tmp_path: Path, kind: str, damage: str) -> None:
    fake = FakeOracle()

    def through(cache: CachedOracle, case: Case) -> Any:
        return cache.plan_layout(case) if kind == "layout" else prefill_through(cache, case)

    case = numeric_case(4)
    fresh = through(CachedOracle(fake, FINGERPRINT, tmp_path), case)
    (entry,) = [p for p in tmp_path.rglob(f"{kind}-*") if p.is_file()]
    whole = entry.read_bytes()
    if damage == "other-key":
        # A whole entry, of another item, under this item's name.
        through(CachedOracle(fake, FINGERPRINT, tmp_path), numeric_case(5))
        (other,) = [p for p in tmp_path.rglob(f"{kind}-*") if p.is_file() and p != entry]
        entry.write_bytes(other.read_bytes())
    elif damage == "flipped-bit":
        # Still a well-formed entry of this key (a tensor's byte, or a digit of the layout's JSON).
        flipped = bytearray(whole)
        flipped[len(whole) * 3 // 4] ^= 0x01
        entry.write_bytes(bytes(flipped))
    else:
        entry.write_bytes(
            {"garbage": b"\x00not an entry\xff" * 9, "truncated": whole[: len(whole) // 2]}.get(damage, b"")
        )
    calls = fake.calls
    reader = CachedOracle(fake, FINGERPRINT, tmp_path)
    same_answer(fresh, through(reader, case))
    assert fake.calls == calls + 1 and reader.stats()["unreadable"] == 1
    assert entry.read_bytes() == whole  # the fresh answer replaced it
    again = CachedOracle(fake, FINGERPRINT, tmp_path)
    same_answer(fresh, through(again, case))
    assert again.stats()["disk_hits"] == 1 and fake.calls == calls + 1


@pytest.mark.parametrize(
    "bad_run",
    [[0.5, 3], [1, 2.0], [1, -1], [True, 2], [1], "0,3"],
    ids=["float", "count", "negative", "bool", "short", "text"],
)
def test_a_sealed_layout_entry_with_a_bad_row_map_is_a_miss(tmp_path: Path, bad_run: Any) -> None:
    """The row maps are expanded from runs checked on reading (the layout check
    then trusts their elements): a run that is not two ints, in an entry whose
    seal matches, is refused like any damaged entry."""
    from ports.per_request import PORT  # a real layout, chunks and row maps

    case = numeric_case(4)
    fresh = CachedOracle(PORT, FINGERPRINT, tmp_path).plan_layout(case)
    assert fresh.chunks and fresh.chunks[0].token_to_seq
    (entry,) = [p for p in tmp_path.rglob("layout-*") if p.is_file()]
    payload = json.loads(unsealed(entry.read_bytes()))
    payload["layout"]["chunks"][0]["token_to_seq"][0] = bad_run
    entry.write_bytes(sealed(json.dumps(payload, separators=(",", ":")).encode()))
    reader = CachedOracle(PORT, FINGERPRINT, tmp_path)
    assert reader.plan_layout(case) == fresh
    assert reader.stats()["unreadable"] == 1 and reader.stats()["misses"] == 1


def test_mutating_an_answer_changes_no_later_hit(tmp_path: Path) -> None:
    fake, case = FakeOracle(), numeric_case(6)
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    expected = special_tensors(case)
    for _ in range(3):  # the miss's answer, then hits
        got = prefill_through(cache, case)
        same_answer(expected, got)
        for tensor in got.values():
            tensor.zero_()
    same_answer(expected, prefill_through(CachedOracle(fake, FINGERPRINT, tmp_path), case))


class Unrebuildable(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")


def test_errors_are_answers_and_interrupts_are_not(tmp_path: Path) -> None:
    raised: dict[str, BaseException] = {
        "assert": AssertionError("max_context_chunk > 0"),
        "key": KeyError("x"),
        "custom": Unrebuildable(7),
        "interrupt": KeyboardInterrupt(),
        "transient": OSError("disk gone"),
        "cpu-oom": RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2 bytes"),
        "cuda": RuntimeError("CUDA error: an illegal memory access was encountered"),
        # Triton's interpreter wraps what a kernel raised: the chain decides.
        "wrapped-oom": wrapped(MemoryError("Unable to allocate 2.00 GiB for an array")),
        "wrapped-os": wrapped(OSError("disk gone")),
        "repr-only": InterpreterError("MemoryError('Unable to allocate 2.00 GiB for an array')"),
        "wrapped-assert": wrapped(AssertionError("max_context_chunk > 0")),
    }
    fake = FakeOracle(fail=raised)
    first = CachedOracle(fake, FINGERPRINT, tmp_path)
    second = CachedOracle(fake, FINGERPRINT, tmp_path)
    for name, exc in raised.items():
        case = Case(name, (1,), (1,), 16, 64)
        for cache in (first, first, second):
            with pytest.raises(BaseException) as caught:
                cache.plan_layout(case)
            assert error_line(caught.value) == error_line(exc)
    kept = ("assert", "key", "custom", "wrapped-assert")
    # Kept errors: one oracle call each; the others: every time.
    assert fake.calls == len(kept) + 3 * (len(raised) - len(kept))
    with pytest.raises(AssertionError):
        second.plan_layout(Case("assert", (1,), (1,), 16, 64))
    with pytest.raises(CachedOracleError) as stand_in:
        second.plan_layout(Case("custom", (1,), (1,), 16, 64))
    assert type(stand_in.value).__name__ == "Unrebuildable"


class InterpreterError(Exception):
    """Named as Triton's interpreter's wrapper is."""


def wrapped(inner: Exception) -> InterpreterError:
    """``inner`` as Triton's interpreter re-raises it: ``InterpreterError(repr(e)) from e``."""
    try:
        try:
            raise inner
        except Exception as exc:
            raise InterpreterError(repr(exc)) from exc
    except InterpreterError as outer:
        return outer


# -- two processes on one folder ---------------------------------------------------------------


def fill_and_read(folder: str, order: int, rounds: int) -> tuple[list[tuple[str, str]], int]:
    """Every item through a cache over ``folder``, ``rounds`` times, in an order
    of its own: what each answer was, by digest, and how many entries could not
    be read (a torn write would be one)."""
    cases = [numeric_case(i) for i in range(8)][::order]
    seen, unreadable = [], 0
    for _ in range(rounds):
        # A fresh object each round: every read after the first goes to disk.
        cache = CachedOracle(FakeOracle(), FINGERPRINT, Path(folder))
        for case in cases:
            tensors = prefill_through(cache, case)
            digest = hashlib.sha256()
            for name, t in tensors.items():
                digest.update(name.encode() + str(t.dtype).encode() + str(t.stride()).encode())
                digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
            layout = cache.plan_layout(case)
            seen.append((case.name, f"{digest.hexdigest()} {layout.to_json()}"))
        unreadable += cache.stats()["unreadable"]
    return sorted(set(seen)), unreadable


def test_two_processes_on_one_folder_agree(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.starmap(fill_and_read, [(str(tmp_path), 1, 4), (str(tmp_path), -1, 4)])
    expected, _ = fill_and_read(str(tmp_path / "alone"), 1, 1)
    assert results[0] == results[1] == (expected, 0) and len(expected) == 8
    # Every entry the two wrote is whole, and nothing temporary is left.
    folder = next((tmp_path / f"format-{CACHE_FORMAT}").iterdir())
    assert (
        sorted(p.name.split("-")[0] for p in folder.iterdir() if p.name != LAST_USED)
        == ["layout"] * 8 + ["prefill"] * 8
    )
    assert fill_and_read(str(tmp_path), 1, 1) == (expected, 0)


def test_layouts_count_against_the_memory_limit() -> None:
    fake, cases = FakeOracle(), [numeric_case(i) for i in range(40)]
    one = CachedOracle(FakeOracle(), FINGERPRINT, None)
    one.plan_layout(cases[0])
    assert one.memory_bytes > 0
    # Room for a few layouts only (memory only, no disk): the first is dropped.
    cache = CachedOracle(fake, FINGERPRINT, None, memory_limit_bytes=4 * one.memory_bytes)
    for case in cases:
        cache.plan_layout(case)
    cache.plan_layout(cases[-1])
    assert fake.calls == len(cases) and cache.stats()["memory_hits"] == 1
    cache.plan_layout(cases[0])
    assert fake.calls == len(cases) + 1


def test_folders_no_run_opened_for_two_weeks_are_pruned(provenance: dict[str, Any], tmp_path: Path) -> None:
    in_use, old, recent = (tmp_path / "format-1" / (letter * 32) for letter in "abc")
    old_format = tmp_path / "format-0" / ("d" * 32)
    for folder in (old, recent, old_format):
        folder.mkdir(parents=True)
        (folder / "layout-x.json").write_text("{}")
    (old / LAST_USED).touch()
    month_ago = time.time() - 30 * 24 * 3600
    os.utime(old / LAST_USED, (month_ago, month_ago))
    os.utime(old_format, (month_ago, month_ago))  # written before folders were stamped: its own time
    (recent / LAST_USED).touch()
    assert sorted(prune_stale_folders(in_use)) == sorted([old, old_format])
    assert not old.exists() and not old_format.exists() and recent.exists()
    assert (in_use / LAST_USED).exists()
    # Opening a cache prunes too, and stamps its own folder.
    opened = with_oracle_cache(FakeOracle(), provenance, directory=tmp_path)
    assert isinstance(opened, CachedOracle) and opened.directory is not None
    assert (opened.directory / LAST_USED).exists() and recent.exists()
