"""Triton's interpreter streamlined (harness/kernels/interpreter.py) computes the
bits it computed plain: the oracle's kernels and the port's, run both ways."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.compare.bits import identical_bits
from harness.kernels.interpreter import PLAIN_ENV, skipped_patches, streamline_interpreter

ROOT = Path(__file__).resolve().parent.parent


def kernel_outputs() -> dict[str, torch.Tensor]:
    """The oracle's Triton kernels (vLLM's merge_attn_states; the top-k mask
    scatter, whose helpers are @triton.jit functions called from the kernel) and
    per_request's merge kernel on smoke items: every output."""
    from harness.cases.sparse_inputs import materialise_topk
    from harness.cases.suites import load_suite
    from harness.kernels.numeric import materialise_merge
    from oracle.side import OracleSide
    from ports.per_request import PORT

    suite = load_suite("smoke")
    oracle, out = OracleSide(), {}
    for mask_case in suite.mask_cases[:3]:
        out[f"mask/{mask_case.name}"] = oracle.build_topk_mask(mask_case, materialise_topk(mask_case)).contiguous()
    # One merge case of each dtype (and so of several widths and views).
    for case in {c.dtype: c for c in reversed(suite.merge_cases)}.values():
        for who, side in (("oracle", oracle), ("port", PORT)):
            merged, lse = side.merge_states(materialise_merge(case, "cpu"))
            out[f"merge/{who}/{case.name}"], out[f"lse/{who}/{case.name}"] = merged.contiguous(), lse.contiguous()
    return out


# The plain side runs in a process of its own: streamlining holds for a whole process.
PLAIN_CHILD = f"""
import json, os, sys
assert os.environ["{PLAIN_ENV}"] == "1"
from oracle.environment import prepare_cpu_environment
prepare_cpu_environment()
from safetensors.torch import save_file
from harness.kernels import interpreter
from tests.test_interpreter import kernel_outputs
save_file(kernel_outputs(), sys.argv[1])
print(json.dumps({{"streamlined": interpreter.is_streamlined(), "skipped": interpreter.skipped_patches()}}))
"""


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Integers (the masks' words) are their bits; floats by their bit patterns.
    if a.dtype.is_floating_point:
        return identical_bits(a, b)
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def test_streamlined_kernels_compute_the_plain_bits(tmp_path: Path) -> None:
    env = {**os.environ, PLAIN_ENV: "1"}
    plain = subprocess.run(
        [sys.executable, "-c", PLAIN_CHILD, str(tmp_path / "plain.safetensors")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert json.loads(plain.stdout.strip().splitlines()[-1]) == {"streamlined": False, "skipped": 0}
    # This process (the test session's, under the CPU recipe) runs streamlined,
    # both halves of it: the overflow checks off and the helpers' patches skipped.
    assert os.environ.get(PLAIN_ENV) != "1" and streamline_interpreter()
    from triton.runtime import interpreter

    assert interpreter.interpreter_builder.options.sanitize_overflow is False
    skipped = skipped_patches()
    got = kernel_outputs()
    # The helpers' repeated patches were skipped here: the streamlined path really ran.
    assert skipped_patches() > skipped
    expected = load_file(tmp_path / "plain.safetensors")
    assert sorted(expected) == sorted(got)
    assert {name.split("/")[0] for name in expected} == {"mask", "merge", "lse"}
    assert {str(t.dtype) for name, t in expected.items() if name.startswith("merge/")} >= {
        "torch.bfloat16",
        "torch.float16",
        "torch.float32",
    }
    differing = [name for name in expected if not _same_bits(expected[name], got[name])]
    assert not differing


@pytest.mark.parametrize(
    "tamper",
    [
        "interpreter.READ_SOURCES['triton/language/semantic.py'] = '0' * 64",
        "import dataclasses; from triton.runtime import interpreter as i; "
        "i.interpreter_builder.options = dataclasses.replace(i.interpreter_builder.options, debug=True)",
    ],
    ids=["another-triton", "debug-on"],
)
def test_an_interpreter_not_as_read_is_left_plain(tamper: str) -> None:
    script = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "from harness.kernels import interpreter\n"
        f"{tamper}\n"
        "from triton.runtime import interpreter as i\n"
        "before = i.InterpretedFunction.__call__\n"
        "print(interpreter.streamline_interpreter(), i.interpreter_builder.options.sanitize_overflow,"
        " i.InterpretedFunction.__call__ is before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != PLAIN_ENV}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"]
