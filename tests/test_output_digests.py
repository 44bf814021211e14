"""The kernels on identical inputs: every float item of the smoke suite (merge,
prefill, sparse-prefill), both sides, computes the bits committed in
cases/output_digests.json under every CPU capability this machine offers, and
with numpy's own SIMD dispatch off (the interpreted Triton kernels run on
numpy), at the harness's one thread (harness.engine.device.NUMERIC_THREADS).
Each child checks the committed input digests first, at one and two threads."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_input_digests import NUMPY_SIMD, offered_capabilities

ROOT = Path(__file__).resolve().parent.parent
_TOOL = importlib.util.spec_from_file_location("output_digests_tool", ROOT / "tools" / "output_digests.py")
assert _TOOL is not None and _TOOL.loader is not None
output_digests_tool = importlib.util.module_from_spec(_TOOL)
_TOOL.loader.exec_module(output_digests_tool)


def test_the_committed_outputs_hold_here_and_both_sides_agree() -> None:
    committed = json.loads(output_digests_tool.OUTPUT_DIGESTS_FILE.read_text())
    found = output_digests_tool.current_digests(1)
    assert found == committed
    items = committed["items"]
    assert len(items) > 60 and {key.rsplit("[", 1)[1] for key in items} == {"merge]", "prefill]", "sparse-prefill]"}
    assert all("status" not in tensors for tensors in items.values()), "every item computed"
    assert all(oracle == port for tensors in items.values() for oracle, port in tensors.values())


@pytest.mark.parametrize("capability", offered_capabilities())
def test_the_committed_outputs_hold_under_every_other_capability(capability: str) -> None:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    if capability == "default":
        env["NPY_DISABLE_CPU_FEATURES"] = NUMPY_SIMD
    done = subprocess.run(
        [sys.executable, "tools/output_digests.py", "--check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    inputs, outputs = done.stdout.splitlines()[-2:]
    assert inputs.startswith("0 differences,") and "items and the stream" in inputs, done.stdout[-500:]
    assert outputs.startswith("0 differences,") and f"capability {capability.upper()}" in outputs, outputs
    assert torch.get_num_threads() >= 1  # this process's threads untouched by the child
