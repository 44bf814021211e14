"""The GPU path on a GPU: run with ``PARITY_TEST_DEVICE=cuda pytest tests/test_gpu.py``
on a CUDA machine (README, On the H200). Skipped elsewhere: CI has no GPU.

The shared CUDA kernels are checked against the reference attention (close, not
equal: they are different kernels, and parity never compares one with the other),
and the comparison itself is checked both ways on the GPU: per_request is
bit-exact with the oracle, and a seeded mutant is caught.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.kernels import (
    KEYLESS_FINITE_LSE,
    KEYLESS_FINITE_OUTPUT,
    CpuKernels,
    CudaKernels,
    paged_gather,
    reference_attention,
)
from harness.model import KEYLESS_ROWS, PRESETS, Case
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.loading import load_port
from harness.sides.runner import compare_prefill
from tests.conftest import TEST_DEVICE, make_case

pytestmark = pytest.mark.skipif(
    TEST_DEVICE != "cuda" or not torch.cuda.is_available(), reason="needs PARITY_TEST_DEVICE=cuda and a CUDA GPU"
)
KERNELS = CudaKernels()


def random_varlen(q_lens: list[int], k_lens: list[int], heads: int, qk: int, v_dim: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn((sum(q_lens), heads, qk), generator=g).to("cuda", torch.bfloat16)
    k = torch.randn((sum(k_lens), heads, qk), generator=g).to("cuda", torch.bfloat16)
    v = torch.randn((sum(k_lens), heads, v_dim), generator=g).to("cuda", torch.bfloat16)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_reference_and_keeps_the_protocol(causal: bool) -> None:
    q_lens, k_lens = [3, 5, 2, 7], [40, 0, 2, 9] if not causal else [3, 5, 2, 7]
    q, k, v, cu_q, cu_k = random_varlen(q_lens, k_lens, heads=4, qk=192, v_dim=128)
    out, lse = KERNELS.attention(q, k, v, cu_q, cu_k, causal, 1 / math.sqrt(192))
    ref_out, ref_lse = reference_attention(q, k, v, cu_q, cu_k, causal, 1 / math.sqrt(192))
    assert out.shape == ref_out.shape and out.dtype == torch.bfloat16
    assert lse.shape == (4, sum(q_lens)) and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)  # -inf where no keys, on both


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # FlashAttention, and the reference fallback
@pytest.mark.parametrize("behaviour", KEYLESS_ROWS)
def test_keyless_rows_follow_the_selected_behaviour(behaviour: str, dtype: torch.dtype) -> None:
    q, k, v, cu_q, cu_k = (
        t.to(dtype) if t.is_floating_point() else t for t in random_varlen([3, 5, 2], [40, 0, 9], 4, 192, 128)
    )
    out, lse = CudaKernels(behaviour).attention(q, k, v, cu_q, cu_k, False, 1 / math.sqrt(192))
    base_out, base_lse = CudaKernels().attention(q, k, v, cu_q, cu_k, False, 1 / math.sqrt(192))
    keyless = torch.zeros(10, dtype=torch.bool, device="cuda")
    keyless[3:8] = True
    fill_out, fill_lse = {"neg-inf": (0.0, float("-inf")), "pos-inf": (0.0, float("inf"))}.get(
        behaviour, (KEYLESS_FINITE_OUTPUT, KEYLESS_FINITE_LSE)
    )
    assert (out[keyless] == fill_out).all() and (lse[:, keyless] == fill_lse).all()
    assert torch.equal(out[~keyless], base_out[~keyless]) and torch.equal(lse[:, ~keyless], base_lse[:, ~keyless])
    # The keyless rows hold the very bits the CPU kernels report there.
    cpu_out, cpu_lse = CpuKernels(behaviour).attention(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(), False, 0.1)
    assert torch.equal(out[keyless].cpu(), cpu_out[keyless.cpu()]) and torch.equal(
        lse[:, keyless].cpu(), cpu_lse[:, keyless.cpu()]
    )
    # A call with no keys at all (the empty shortcut).
    out, lse = CudaKernels(behaviour).attention(q, k[:0], v[:0], cu_q, torch.zeros_like(cu_k), False, 0.1)
    assert (out == fill_out).all() and (lse == fill_lse).all()


def test_gather_on_the_gpu_is_the_cpu_gather() -> None:
    cache = torch.randn((10, 4, 8))
    table = torch.tensor([[3, 7, 1], [2, 9, 0]], dtype=torch.int32)
    cu_seq_lens, token_to_seq, starts = torch.tensor([0, 6, 9]), torch.tensor([0] * 6 + [1] * 3), torch.tensor([2, 5])
    cpu, gpu = torch.empty((9, 8)), torch.empty((9, 8), device="cuda")
    paged_gather(cache, cpu, table, cu_seq_lens, token_to_seq, starts, 9)
    KERNELS.gather(cache.cuda(), gpu, table.cuda(), cu_seq_lens.cuda(), token_to_seq.cuda(), starts.cuda(), 9)
    assert torch.equal(cpu, gpu.cpu())


def deepseek_case(name: str) -> Case:
    from dataclasses import replace

    spec = replace(PRESETS["deepseek-v3"], dtype="bf16", seed=5)
    return make_case([700, 0, 33, 1500], [9, 4, 17, 6], workspace_size=512, name=name, numeric=spec)


def test_per_request_is_bit_exact_on_the_gpu(oracle: Port, per_request: Port) -> None:
    result = compare_prefill(oracle, per_request, deepseek_case("gpu-many-chunks"), KERNELS, "cuda")
    assert result.status == PARITY, result.detail()
    assert {t.name for t in result.tensors} == {"context_output", "context_lse", "output", "lse"}


def test_a_mutant_is_caught_on_the_gpu(oracle: Port) -> None:
    mutant = load_port("mutant:finite-lse-empty-rows")
    result = compare_prefill(oracle, mutant, deepseek_case("gpu-zero-context"), KERNELS, "cuda")
    assert result.status == DIVERGENT and "lse" in result.detail()
