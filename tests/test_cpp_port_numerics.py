"""The C++ reference port's merge numerics against the oracle's, bit for bit.

On a CPU the oracle's merge is a Triton kernel run by Triton's interpreter: its
float32 exp and log are the harness's (harness/kernels/interpreted_math.py:
numpy's SIMD algorithm, the same bits on every machine), its bf16 conversions
the interpreter's own truncating converter, its fp16 conversions numpy's
astype. The port mirrors each; here each is held against the real thing on
about a million inputs including every special class, then merges (L2) and
context loops (L3) go through the protocol against the oracle.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.cases.files import load_case_file
from harness.cases.suites import load_suite
from harness.kernels import CpuKernels
from harness.kernels.interpreted_math import exp32, log32
from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.loading import load_port
from harness.sides.runner import compare_merge, compare_prefill
from ports.per_request.metadata import build_layout
from tests.conftest import TEST_DEVICE, make_case

ROOT = Path(__file__).resolve().parent.parent
SEED = 20260825

pytestmark = pytest.mark.skipif(
    TEST_DEVICE != "cpu", reason="the port mirrors the CPU oracle (Triton's interpreter), not the compiled GPU kernel"
)


# -- the element-wise pieces -------------------------------------------------------------------


def f32(bits: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def special_inputs() -> np.ndarray:
    """Every special class, both signs: zeros, denormals, the normal and finite
    range edges, infinities, quiet and signalling NaNs (payloads high and low),
    the edges of numpy's exp (overflow at 88.72..., zero at -103.97..., denormal
    results from about -87.3, the scaling step at 2^-125) and the steps of log's range
    reduction (1, sqrt(1/2))."""
    magnitudes = [
        0x00000000, 0x00000001, 0x00000002, 0x00000003, 0x0000FFFF, 0x00010000, 0x00200000, 0x003FFFFF,
        0x00400000, 0x00600000, 0x007FFFFF, 0x00800000, 0x00800001, 0x00FFFFFF, 0x33000000, 0x33000001,
        0x337FFFFF, 0x33800000, 0x387FC000, 0x387FE000, 0x38800000, 0x3F3504F2, 0x3F3504F3, 0x3F3504F4,
        0x3F7FFFFF, 0x3F800000, 0x3F800001, 0x3FB504F3, 0x477FEFFF, 0x477FF000, 0x7F7FFFFF, 0x7F800000,
        0x7F800001, 0x7F80FFFF, 0x7F810000, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF,
    ]  # fmt: skip
    edges = [88.72283935546875, -103.97208404541015625, -87.33654, -86.6434, -104.0, 1.0, 0.70710677, 0.5, 2.0]
    signed = [*magnitudes, *(m | 0x80000000 for m in magnitudes)]
    # 64 neighbours either side of each edge, bit pattern by bit pattern.
    edge_bits = np.array(edges, dtype=np.float32).view(np.uint32).astype(np.int64)
    near = (edge_bits[:, None] + np.arange(-64, 65, dtype=np.int64)[None, :]).ravel()
    return np.concatenate([f32(signed), f32(near.astype(np.uint32))])


def float_inputs() -> np.ndarray:
    """About a million float32 inputs: the special ones, raw bit patterns over
    the whole range, and dense draws where the merge evaluates exp (weights
    exp(lse - max) <= 1, plus overflow) and log (sums of weights in [1, 2])."""
    rng = np.random.default_rng(SEED)
    return np.concatenate(
        [
            special_inputs(),
            rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            rng.uniform(-110.0, 90.0, 300_000).astype(np.float32),
            rng.uniform(1.0, 2.0, 200_000).astype(np.float32),
            rng.integers(0, 0x7F800001, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        ]
    )


def request(binary: Path, message: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One request to a fresh port process; its reply."""
    lines = json.dumps({"id": 1, **message}) + "\n" + json.dumps({"id": 2, "op": "bye"}) + "\n"
    done = subprocess.run(
        [str(binary)], input=lines, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )
    assert done.stdout, f"the port answered nothing; stderr: {done.stderr[-2000:]}"
    reply: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    assert reply.get("ok"), reply
    return reply


def port_numerics(
    binary: Path, folder: Path, x: np.ndarray, halves: np.ndarray, env: dict[str, str] | None = None
) -> tuple[str, dict[str, torch.Tensor]]:
    inputs, outputs = folder / "numerics-in.safetensors", folder / "numerics-out.safetensors"
    half_bits = torch.from_numpy(halves.astype(np.int16))
    save_file(
        {
            "x": torch.from_numpy(x.copy()),
            "half_bf16": half_bits.view(torch.bfloat16).clone(),
            "half_fp16": half_bits.view(torch.float16).clone(),
        },
        str(inputs),
    )
    reply = request(binary, {"op": "numerics_selftest", "inputs": str(inputs), "outputs": str(outputs)}, env)
    return str(reply["float32_math"]), load_file(str(outputs))


@functools.cache
def _store_program() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def store_cast(src: Any, dst: Any, count: Any, BLOCK: tl.constexpr) -> None:
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = at < count
        tl.store(dst + at, tl.load(src + at, mask=inside), mask=inside)

    return store_cast


def interpreter_cast(source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``source`` stored into a ``dtype`` tensor by a Triton kernel under the
    interpreter: the cast tl.store applies, as in the merge kernel's store and its
    promotion of 16-bit values to fp32."""
    out = torch.empty(source.shape, dtype=dtype)
    block = 1 << 16
    with np.errstate(over="ignore"):  # numpy warns when it casts a large float32 to fp16 infinity
        _store_program()[((source.numel() + block - 1) // block,)](source, out, source.numel(), BLOCK=block)
    return out


def bits(values: torch.Tensor | np.ndarray) -> np.ndarray:
    """The raw bit patterns of 32- or 16-bit floats, as unsigned integers."""
    if isinstance(values, torch.Tensor):
        values = values.view(torch.int32 if values.element_size() == 4 else torch.int16).numpy()
    return values.view(np.uint32 if values.dtype.itemsize == 4 else np.uint16)


def mismatches(mine: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, x: np.ndarray) -> list[str]:
    a, b = bits(mine), bits(reference)
    where = np.nonzero(a != b)[0]
    return [f"x={bits(x)[i]:#010x}: port {a[i]:#x}, reference {b[i]:#x}" for i in where[:5]] + (
        [f"... {len(where)} in all"] if len(where) else []
    )


def test_exp_log_and_casts_match_numpy_and_the_interpreter_bit_for_bit(cpp_port: Path, tmp_path: Path) -> None:
    x = float_inputs()
    assert len(x) > 1_000_000
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every bf16 and fp16 bit pattern
    path, out = port_numerics(cpp_port, tmp_path, x, halves)
    assert path == "numpy-simd"
    exp_reference, log_reference = exp32(x), log32(x)
    x_tensor = torch.from_numpy(x.copy())
    half_bits = torch.from_numpy(halves.astype(np.int16))
    checks: dict[str, tuple[np.ndarray | torch.Tensor, np.ndarray]] = {
        "exp": (exp_reference, x),
        "log": (log_reference, x),
        "to_bf16": (interpreter_cast(x_tensor, torch.bfloat16), x),
        "to_fp16": (interpreter_cast(x_tensor, torch.float16), x),
        "bf16_to_fp32": (interpreter_cast(half_bits.view(torch.bfloat16), torch.float32), bits(half_bits)),
        "fp16_to_fp32": (interpreter_cast(half_bits.view(torch.float16), torch.float32), bits(half_bits)),
    }
    for name, (reference, inputs) in checks.items():
        wrong = mismatches(out[name], reference, inputs)
        assert not wrong, f"{name}: {wrong}"
    # The interpreter truncates to bf16 (no rounding) and mangles subnormals,
    # so a correctly rounding conversion would not do.
    rounded = bits(x_tensor.to(torch.bfloat16))
    assert (rounded != bits(out["to_bf16"])).sum() > 1000


def test_libm_exp_and_log_differ_from_the_interpreters(cpp_port: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(SEED).uniform(-20.0, 0.0, 100_000).astype(np.float32)
    path, out = port_numerics(cpp_port, tmp_path, x, np.zeros(1, np.uint16), {"CPP_PORT_FLOAT32_MATH": "libm"})
    assert path == "libm"
    wrong = (bits(out["exp"]) != bits(exp32(x))).mean()
    assert 0.1 < wrong < 0.6, wrong  # about 4 in 10 weights would be off by an ULP or two


# -- through the protocol, against the oracle ---------------------------------------------------


@pytest.fixture(scope="module")
def cpp(cpp_port: Path) -> Iterator[Port]:
    port = load_port(f"cmd:{cpp_port}")
    assert port.levels == ("layout", "merge", "prefill", "sparse-layout", "sparse-mask", "sparse-prefill")  # type: ignore[attr-defined]
    yield port
    port.close()  # type: ignore[attr-defined]


# One merge case per dtype where the port once diverged: bf16 subnormal values
# (the interpreter's casts), exp/log rounding in fp32, and in fp16 with only some
# tokens merged.
MERGE_CASES = ("merge-mixed-0009", "merge-random-0020", "merge-random-0040")


def test_merges_are_bit_exact_with_the_oracle(oracle: Port, cpp: Port, cpp_port: Path) -> None:
    cases = {c.name: c for c in load_suite("ci").merge_cases if c.name in MERGE_CASES}
    assert {c.dtype for c in cases.values()} == {"bf16", "fp16", "fp32"}
    assert any(c.prefill_tokens_with_context not in (None, c.num_tokens) for c in cases.values())
    for case in cases.values():
        result = compare_merge(oracle, cpp, case)
        assert result.status == PARITY, (case.name, result.detail())
    # With libm's exp and log the fp32 case diverges: the mirror is what makes it exact.
    libm = load_port(f"cmd:env CPP_PORT_FLOAT32_MATH=libm {cpp_port}")
    try:
        assert compare_merge(oracle, libm, cases["merge-random-0020"]).status == DIVERGENT
    finally:
        libm.close()  # type: ignore[attr-defined]


def test_prefill_context_loops_are_bit_exact_with_the_oracle(oracle: Port, cpp: Port) -> None:
    (continued,) = load_case_file(ROOT / "cases" / "smoke" / "numeric-continuation-zero.json")
    (single,) = load_case_file(ROOT / "cases" / "smoke" / "numeric-single-chunk.json")
    spec = continued.numeric
    no_context = make_case([0, 0], [3, 2], numeric=spec, name="no-context")
    layout = build_layout(continued)
    assert layout.empty_token_slices and any(c.is_continuation for c in layout.chunks) and layout.num_chunks >= 3
    assert build_layout(single).num_chunks == 1 and not build_layout(single).empty_token_slices
    assert not build_layout(no_context).chunks
    for case in (continued, single, no_context):
        result = compare_prefill(oracle, cpp, case, CpuKernels())
        assert result.status == PARITY, (case.name, result.detail())
        names = {t.name for t in result.tensors}
        assert names == (
            {"output", "lse"} if case is no_context else {"context_output", "context_lse", "output", "lse"}
        )
