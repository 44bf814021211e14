"""The GPU report's renderer, the gpu suite and the pieces of the GPU path that
run without a GPU. (tests/test_gpu.py runs the GPU path itself, on a GPU.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from harness.cases.suites import load_suite
from harness.kernels import CpuKernels, CudaKernels, kernels_for, unpadded_lse
from reports.gpu import latest_gpu_report, render_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_suite_is_deepseek_sized_and_named_by_preset() -> None:
    suite = load_suite("gpu")
    prefill = [c for c in suite.cases if c.numeric is not None]
    assert len(suite.merge_cases) == 252 and len(prefill) == 160 and len(prefill) == len(suite.cases)
    heads = sorted({c.numeric.num_heads for c in prefill if c.numeric})
    assert heads == [16, 128]
    assert all(c.numeric and c.numeric.latent_dim == 576 for c in prefill)
    assert prefill[0].name.startswith("numeric-deepseek-v2-lite-") and prefill[-1].name.startswith(
        "numeric-deepseek-v3-"
    )
    # The ci suite's tiny cases keep their names (baselines and history refer to them).
    assert any(c.name == "numeric-zero-context-0000" for c in load_suite("ci").cases)


def test_kernels_for_devices() -> None:
    assert isinstance(kernels_for("cpu"), CpuKernels) and isinstance(kernels_for("cuda"), CudaKernels)


def test_padded_lse_becomes_heads_by_tokens() -> None:
    # Older FlashAttention builds report [batch, heads, max_q]; rows past a sequence's end are padding.
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    padded = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)
    lse = unpadded_lse(padded, cu_q, 5)
    expected = torch.stack([padded[0, :, 0], padded[0, :, 1], padded[1, :, 0], padded[1, :, 1], padded[1, :, 2]], 1)
    assert lse.shape == (3, 5) and torch.equal(lse, expected)
    assert unpadded_lse(expected, cu_q, 5) is not None and torch.equal(unpadded_lse(expected, cu_q, 5), expected)


def test_committed_report_renders_its_verdicts_and_tables() -> None:
    found = latest_gpu_report(ROOT / "reports" / "gpu")
    assert found is not None
    path, report = found
    text = render_markdown(report)
    assert text == path.with_suffix(".md").read_text(encoding="utf-8")  # the .md is this JSON, rendered
    per_request = [r for r in report["parity"]["rows"] if r["port"] == "per_request"]
    assert {(r["suite"], r["level"]) for r in per_request} == {
        ("gpu", "merge"),
        ("gpu", "prefill"),
        ("gpu-bench", "prefill"),
    }
    for row in per_request:
        assert f"| per_request | {row['suite']}" in text
    for row in report["prefill"]["rows"]:
        assert row["batch"] in text and row["legacy_chunks"] >= row["per_request_chunks"]


def test_failed_section_is_reported_not_dropped(tmp_path: Path) -> None:
    report = json.loads((ROOT / "reports" / "gpu" / "2026-11-29.json").read_text())
    report["prefill"] = {"error": "RuntimeError: out of memory", "traceback": "..."}
    text = render_markdown(report)
    assert "Prefill benchmark failed: RuntimeError: out of memory" in text
    assert "## Merge kernel" in text and "| per_request | gpu" in text
    (tmp_path / "2026-01-01.json").write_text(json.dumps(report))
    (tmp_path / "notes.json").write_text("{}")
    assert latest_gpu_report(tmp_path) == (tmp_path / "2026-01-01.json", report)


def test_gpu_report_refuses_without_cuda() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_report", "--out", "unused"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "sees no CUDA device" in done.stderr and not (ROOT / "unused").exists()
