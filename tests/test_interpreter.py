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
from harness.kernels.interpreter import PLAIN_ENV

# Runs the oracle's Triton kernels (vLLM's merge_attn_states; the top-k mask
# scatter, whose helpers are @triton.jit functions called from the kernel) and
# per_request's merge kernel on smoke items, and saves every output.
CHILD = r"""
import json, sys
from safetensors.torch import save_file
from oracle.environment import prepare_cpu_environment
prepare_cpu_environment()
from harness.cases.sparse_inputs import materialise_topk
from harness.cases.suites import load_suite
from harness.kernels import interpreter
from harness.kernels.numeric import materialise_merge
from oracle.side import OracleSide
from ports.per_request import PORT

suite = load_suite("smoke")
oracle, out = OracleSide(), {}
for case in suite.mask_cases[:6]:
    out[f"mask/{case.name}"] = oracle.build_topk_mask(case, materialise_topk(case)).contiguous()
for case in suite.merge_cases[:4]:
    for who, side in (("oracle", oracle), ("port", PORT)):
        merged, lse = side.merge_states(materialise_merge(case, "cpu"))
        out[f"merge/{who}/{case.name}"], out[f"lse/{who}/{case.name}"] = merged.contiguous(), lse.contiguous()
save_file(out, sys.argv[1])
print(json.dumps({"streamlined": interpreter.is_streamlined(), "skipped": interpreter.skipped_patches()}))
"""


def _run_child(path: Path, plain: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != PLAIN_ENV}
    if plain:
        env[PLAIN_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Integers (the masks' words) are their bits; floats by their bit patterns.
    if a.dtype.is_floating_point:
        return identical_bits(a, b)
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def test_streamlined_kernels_compute_the_plain_bits(tmp_path: Path) -> None:
    plain = _run_child(tmp_path / "plain.safetensors", plain=True)
    fast = _run_child(tmp_path / "fast.safetensors", plain=False)
    assert plain == {"streamlined": False, "skipped": 0}
    # The helpers' repeated patches were skipped: the second path really ran.
    assert fast["streamlined"] is True and isinstance(fast["skipped"], int) and fast["skipped"] > 0
    expected, got = load_file(tmp_path / "plain.safetensors"), load_file(tmp_path / "fast.safetensors")
    assert sorted(expected) == sorted(got)
    assert {name.split("/")[0] for name in expected} == {"mask", "merge", "lse"}
    differing = [name for name in expected if not _same_bits(expected[name], got[name])]
    assert not differing


@pytest.mark.parametrize(
    "tamper",
    [
        "interpreter.READ_SOURCES['_patch_lang'] = '0' * 64",
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
