"""The oracle-cache tests' shared pieces: smoke cases, merge items, the pinned
oracle's provenance, and a fake oracle (cheap, deterministic, with every special
bit pattern: NaN payloads, signed zeros, infinities, denormals, several dtypes,
a transposed tensor) that counts its calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.cases.files import load_cases
from harness.cases.merge import generate_merge
from harness.kernels import CpuKernels
from harness.kernels.numeric import case_prefill_inputs
from harness.model import Case, Layout, MergeCase, WorkspaceConfig

SMOKE = Path(__file__).resolve().parent.parent / "cases" / "smoke"
FINGERPRINT = "f" * 64


def smoke(name: str) -> Case:
    return load_cases([SMOKE / f"{name}.json"])[0]


def merge_items() -> list[MergeCase]:
    """Merge cases of each memory layout (contiguous, strided LSEs, narrowed heads)."""
    chosen: dict[tuple[str, str], MergeCase] = {}
    for case in generate_merge(20260825, 40):
        chosen.setdefault((case.lse_view, case.value_view), case)
    return list(chosen.values())[:3]


def pinned_provenance() -> dict[str, Any]:
    """The provenance of the pinned oracle, as a run opens it."""
    from harness.engine import open_oracle

    _, provenance = open_oracle(allow_drift=False)
    return provenance


def special_tensors(case: Case) -> dict[str, torch.Tensor]:
    """Tensors drawn from the case: NaNs with payloads, signed zeros,
    infinities, denormals; several dtypes; one transposed, in a non-sorted order."""
    g = torch.Generator().manual_seed(sum(case.context_lens) * 131 + case.workspace_size)
    bits32 = torch.randint(-(2**31), 2**31, (5, 7), generator=g, dtype=torch.int64).to(torch.int32)
    bits32[0, :6] = torch.tensor(
        [0x7FC00001, 0x7F800001, -0x7FFFFFFF - 1, 0x7F800000, -0x800000, 0x1], dtype=torch.int32
    )
    bits16 = torch.randint(-(2**15), 2**15, (3, 4, 2), generator=g, dtype=torch.int32).to(torch.int16)
    bits16[0, 0] = torch.tensor([0x7FC1, -0x8000], dtype=torch.int16)
    return {
        "z_lse": bits32.view(torch.float32).t(),  # strides (1, 7)
        "a_output": bits16.view(torch.bfloat16),
        "m_half": bits16.flip(0).contiguous().view(torch.float16),
        "index": torch.arange(4, dtype=torch.int64) * case.block_size,
    }


class FakeOracle:
    """An oracle whose answers cost nothing: layouts of no chunks, sizes from the
    configuration, special tensors; ``fail`` names case names it raises on."""

    name = "fake"

    def __init__(self, fail: dict[str, BaseException] | None = None) -> None:
        self.fail, self.calls = fail or {}, 0

    def plan_layout(self, case: Case) -> Layout:
        self.calls += 1
        if case.name in self.fail:
            raise self.fail[case.name]
        return Layout(chunks=(), empty_token_slices=((0, case.workspace_size),))

    def workspace_size(self, config: WorkspaceConfig) -> int:
        self.calls += 1
        return config.max_model_len * config.max_num_seqs

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        self.calls += 1
        if case.name in self.fail:
            raise self.fail[case.name]
        return special_tensors(case)


def numeric_case(seed: int) -> Case:
    return Case(f"n{seed}", (20 + seed, 3), (2, 1), 16, 64, numeric=smoke("numeric-single-chunk").numeric)


def prefill_through(cache: Any, case: Case) -> dict[str, torch.Tensor]:
    return cache.prefill(case, case_prefill_inputs(case), CpuKernels())  # type: ignore[no-any-return]
