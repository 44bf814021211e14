"""The oracle cache's keys: what an answer is stored under (the oracle's
fingerprint, the item, the kernels, the inputs, the numeric environment), and what
is never cached (the switch off, overridden drift, items it cannot key, kernels a
port patched or rebound)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.kernels import CpuKernels, kernels_untouched
from harness.kernels.numeric import case_prefill_inputs, materialise_merge
from harness.model import Case, Layout, WorkspaceConfig
from harness.model.dcp import TorchDistributedRanks
from harness.protocol.port import Port, port_levels
from harness.sides.oracle_cache import CachedOracle, with_oracle_cache
from harness.sides.oracle_cache_keys import oracle_fingerprint
from tests.oracle_cache_fakes import (
    FINGERPRINT,
    FakeOracle,
    merge_items,
    numeric_case,
    pinned_provenance,
    prefill_through,
    smoke,
)


@pytest.fixture(scope="module")
def provenance() -> dict[str, Any]:
    return pinned_provenance()


class LayoutOnly:
    name = "layout-only"

    def plan_layout(self, case: Case) -> Layout:
        return Layout(chunks=())

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return 0

    def close(self) -> str:
        return "closed"


def test_another_fingerprint_misses(tmp_path: Path) -> None:
    fake, case = FakeOracle(), numeric_case(2)
    CachedOracle(fake, FINGERPRINT, tmp_path).plan_layout(case)
    CachedOracle(fake, FINGERPRINT, tmp_path).plan_layout(case)
    assert fake.calls == 1
    other = CachedOracle(fake, "e" * 64, tmp_path)
    other.plan_layout(case)
    assert fake.calls == 2 and other.stats()["misses"] == 1


def test_the_fingerprint_follows_the_pin_release_and_every_fingerprint(provenance: dict[str, Any]) -> None:
    fake = FakeOracle()
    base = oracle_fingerprint(fake, provenance)
    assert oracle_fingerprint(fake, dict(provenance)) == base
    # What a command adds about its run is not the oracle's identity.
    assert oracle_fingerprint(fake, {**provenance, "dcp_backend": "gloo", "oracle_cache": {"misses": 3}}) == base
    symbol = next(iter(provenance["fingerprints"]))
    changed = [
        {**provenance, "release": "vllm==0.27.1"},
        {**provenance, "upstream_commit": "0000000000"},
        {**provenance, "installed_vllm": "0.28.1"},
        {**provenance, "installed_commit_id": "g0"},
        {**provenance, "fingerprints": {**provenance["fingerprints"], symbol: "mismatch"}},
        {**provenance, "oracle_drift_overridden": True},
        # A served release's environment rebuilt with another torch.
        {**provenance, "oracle_environment": {"python": "3.11.7", "torch": "2.9.0", "triton": "3.5.0"}},
        {**provenance, "oracle_environment": {"python": "3.11.7", "torch": "2.9.1", "triton": "3.5.0"}},
    ]
    digests = {oracle_fingerprint(fake, p) for p in changed}
    assert base not in digests and len(digests) == len(changed)
    assert oracle_fingerprint(LayoutOnly(), provenance) != base  # another oracle class


def test_the_switch_and_overridden_drift(provenance: dict[str, Any], tmp_path: Path) -> None:
    fake = FakeOracle()
    assert with_oracle_cache(fake, provenance, enabled=False, directory=tmp_path) is fake
    drifted = {**provenance, "oracle_drift_overridden": True}
    for cache in (
        with_oracle_cache(fake, drifted, directory=tmp_path),
        with_oracle_cache(fake, provenance, directory=tmp_path, memory_only=True),
    ):
        assert isinstance(cache, CachedOracle) and cache.directory is None
        cache.plan_layout(numeric_case(3))
        cache.plan_layout(numeric_case(3))
    assert fake.calls == 2 and not any(tmp_path.iterdir())


def test_uncacheable_items_pass_through(tmp_path: Path) -> None:
    class OtherKernels(CpuKernels):
        pass

    class OtherCase(Case):
        pass

    fake, case = FakeOracle(), numeric_case(7)
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    for _ in range(2):
        cache.prefill(case, case_prefill_inputs(case), OtherKernels())
        cache.plan_layout(OtherCase(**{f: getattr(case, f) for f in case.__dataclass_fields__}))
    assert fake.calls == 4 and cache.stats()["bypassed"] == 4 and not any(tmp_path.iterdir())
    # One rank of a DCP case whose other ranks live in other processes.
    dcp = smoke("numeric-dcp3-interleave4")
    elsewhere = case_prefill_inputs(dcp, collective=TorchDistributedRanks(dcp.dcp_world_size, 0, "gloo"))
    for _ in range(2):
        cache.prefill(dcp, elsewhere, CpuKernels())
    assert fake.calls == 6 and cache.stats()["bypassed"] == 6
    prefill_through(cache, dcp)
    prefill_through(cache, dcp)
    assert fake.calls == 7 and cache.stats()["memory_hits"] == 1


def test_the_kernels_the_inputs_and_the_numeric_environment_are_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, case = FakeOracle(), numeric_case(8)
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    prefill_through(cache, case)
    cache.prefill(case, case_prefill_inputs(case), CpuKernels("pos-inf"))
    assert fake.calls == 2
    changed = case_prefill_inputs(case)
    changed.q.view(-1)[0] += 1
    cache.prefill(case, changed, CpuKernels())
    assert fake.calls == 3
    monkeypatch.setattr(torch, "get_num_threads", lambda: 977)
    prefill_through(cache, case)
    assert fake.calls == 4
    monkeypatch.undo()
    prefill_through(cache, case)
    assert fake.calls == 4 and cache.stats()["memory_hits"] == 1
    # Triton's fp fusion changes upstream's compiled merge: another setting, another key.
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    prefill_through(cache, case)
    assert fake.calls == 5
    monkeypatch.undo()
    # MKL's code path changes a matmul's bits: another mode, another key.
    from harness.kernels import machine

    monkeypatch.setattr(machine, "blas_mode", lambda: "mkl auto")
    prefill_through(cache, case)
    assert fake.calls == 6
    monkeypatch.undo()
    # torch's CPU capability does not (tests/test_output_digests.py): answers are shared across it.
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    prefill_through(cache, case)
    assert fake.calls == 6


def test_the_harness_puts_mkl_in_its_reproducible_mode_and_asks_mkl_which_it_runs() -> None:
    """MKL reads the mode at its first call: a process that imports the harness
    first runs COMPATIBLE; one that multiplied before keeps MKL's own choice, and
    says so (the cache then keys its answers apart)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    first = "import harness; from harness.kernels.machine import blas_mode; print(blas_mode())"
    late = "import torch; torch.ones(64, 64) @ torch.ones(64, 64); " + first
    modes = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
        for code in (first, late)
    ]
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        assert modes == ["no mkl", "no mkl"]
    else:
        assert modes[0] == "mkl compatible" and modes[1] != modes[0], modes


def test_the_wrapper_is_the_oracle_for_everything_else(tmp_path: Path) -> None:
    cache = CachedOracle(LayoutOnly(), FINGERPRINT, tmp_path)
    assert isinstance(cache, Port) and cache.name == "layout-only"
    assert port_levels(cache) == ("layout",) and port_levels(CachedOracle(FakeOracle(), FINGERPRINT, None)) == (
        "layout",
        "prefill",
    )
    assert cache.close() == "closed"
    with pytest.raises(AttributeError, match="'LayoutOnly' object has no attribute 'merge_states'"):
        cache.merge_states(materialise_merge(merge_items()[0]))


def test_patched_kernels_are_never_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An in-process port shares the oracle's process: kernels it patched give
    answers that are not the harness kernels', computed afresh and kept nowhere."""
    fake, case = FakeOracle(), numeric_case(8)
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    tagged = CpuKernels()
    tagged.scale = 2.0  # type: ignore[attr-defined]
    cache.prefill(case, case_prefill_inputs(case), tagged)
    monkeypatch.setattr(CpuKernels, "kv_b_proj", lambda self, weight, latent: latent)
    cache.prefill(case, case_prefill_inputs(case), CpuKernels())
    monkeypatch.undo()
    assert fake.calls == 2 and cache.stats()["bypassed"] == 2 and not list(tmp_path.rglob("prefill-*"))
    cache.prefill(case, case_prefill_inputs(case), CpuKernels())  # as defined again: kept
    assert cache.stats()["stored"] == 1


@pytest.mark.parametrize(
    ("module", "name", "value"),
    [
        ("harness.kernels", "FLASH_MAX_HEAD_DIM", 128),
        ("harness.kernels", "FLASH_DTYPES", (torch.float16,)),
        ("harness.kernels", "KEYLESS_FINITE_OUTPUT", 512.0),
        ("harness.kernels", "KEYLESS_FINITE_LSE", float("nan")),
        ("harness.kernels.masked_attention", "QUERY_BLOCK", 64),
        ("harness.kernels.context_chunks", "gather_chunk", lambda *args: None),
    ],
)
def test_kernel_constants_changed_at_run_time_are_never_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, name: str, value: object
) -> None:
    """The kernels' data decides their answers as much as their code: a port
    that rebinds a constant leaves answers that are not the harness's."""
    import importlib

    fake, case = FakeOracle(), numeric_case(8)
    cache = CachedOracle(fake, FINGERPRINT, tmp_path)
    assert kernels_untouched(CpuKernels())
    monkeypatch.setattr(importlib.import_module(module), name, value)
    assert not kernels_untouched(CpuKernels())
    cache.prefill(case, case_prefill_inputs(case), CpuKernels())
    monkeypatch.undo()
    assert kernels_untouched(CpuKernels())
    assert cache.stats()["bypassed"] == 1 and not list(tmp_path.rglob("prefill-*"))


def test_a_kernel_constant_changed_in_place_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.kernels as kernels_module

    monkeypatch.setattr(kernels_module, "FLASH_DTYPES", [torch.float16, torch.bfloat16])
    untouched_before = kernels_module.module_definitions(kernels_module)
    kernels_module.FLASH_DTYPES.append(torch.float32)  # type: ignore[attr-defined]
    assert kernels_module.module_definitions(kernels_module) != untouched_before


def test_a_kernel_function_whose_code_is_swapped_in_place_is_seen() -> None:
    """The same function object running other code (``f.__code__ = ...``)."""
    import harness.kernels.context_chunks as chunks

    def other(*args: object, **kwargs: object) -> None:
        return None

    original = chunks.gather_chunk.__code__
    assert kernels_untouched(CpuKernels())
    chunks.gather_chunk.__code__ = other.__code__
    try:
        assert not kernels_untouched(CpuKernels())
    finally:
        chunks.gather_chunk.__code__ = original
    assert kernels_untouched(CpuKernels())


class ShiftedOracle(FakeOracle):
    """The fake oracle on a machine whose kernels round one bit differently."""

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        out = super().prefill(case, inputs, kernels)
        return {name: t.view(torch.int32).add(1).view(torch.float32) if t.dtype == torch.float32 else t
                for name, t in out.items()}  # fmt: skip


@pytest.mark.parametrize("agrees", [True, False], ids=["agrees", "differs"])
def test_answers_written_on_another_machine_are_asked_again_and_one_that_differs_is_never_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], agrees: bool
) -> None:
    """The key does not tell two x86 machines apart where the kernels were shown
    to agree; a few answers another machine wrote are asked of this one's
    oracle, and on a difference none written elsewhere is served again."""
    from harness.kernels import machine
    from harness.sides.oracle_cache import ELSEWHERE_CHECKS

    cases = [numeric_case(seed) for seed in range(ELSEWHERE_CHECKS + 3)]
    monkeypatch.setattr(machine, "machine_label", lambda: "the runner that computed them")
    writer = CachedOracle(FakeOracle(), FINGERPRINT, tmp_path)
    for case in cases:
        prefill_through(writer, case)
    monkeypatch.setattr(machine, "machine_label", lambda: "this machine")
    here = FakeOracle() if agrees else ShiftedOracle()
    reader = CachedOracle(here, FINGERPRINT, tmp_path)
    answers = [prefill_through(reader, case) for case in cases]
    stats, err = reader.stats(), capsys.readouterr().err
    if agrees:
        assert here.calls == ELSEWHERE_CHECKS and stats["elsewhere_disagreed"] == 0 and not err
        assert stats["disk_hits"] == len(cases)
    else:
        # The first differs: every answer from then on is this machine's own, and it says so once.
        assert here.calls == len(cases) and stats["elsewhere_disagreed"] == len(cases)
        assert err.count("oracle cache: an answer written on the runner that computed them differs") == 1
        for case, answer in zip(cases, answers, strict=True):
            expected = ShiftedOracle().prefill(case, None, None)
            assert all(torch.equal(answer[n].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8))
                       for n, t in expected.items())  # fmt: skip
    # Answers written on this machine are trusted as they are.
    again = FakeOracle()
    for case in cases:
        prefill_through(CachedOracle(again, FINGERPRINT, tmp_path / "own"), case)
    own = CachedOracle(FakeOracle(), FINGERPRINT, tmp_path / "own")
    for case in cases:
        prefill_through(own, case)
    assert own.stats()["elsewhere_checked"] == 0
