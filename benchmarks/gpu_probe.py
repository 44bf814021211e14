"""A first look at the oracle on the lent H200 (groundwork for issue 7).

Imports the pinned oracle from the carried bundle (tools/build_gpu_bundle.py),
reports the platform vLLM detects, runs the ci suite's L2 merge cases on the GPU
with both Triton merge kernels compiled (the oracle's and per_request's), and
times both kernels on 65536 tokens x 16 heads x 128 against a plain copy.
Writes ``gpu-probe.json`` to $OUT (or the current folder). Figures only.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from oracle.environment import import_vllm_module, use_device


def timed(fn: Any, repeats: int = 30) -> float:
    """Median milliseconds over ``repeats`` CUDA-event timings after warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        stop = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return float(statistics.median(times))


def main() -> None:
    warnings.filterwarnings("ignore")
    use_device("cuda")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    started = time.perf_counter()
    platform = import_vllm_module("vllm.platforms").current_platform
    report["import_seconds"] = round(time.perf_counter() - started, 1)
    report["vllm_platform"] = type(platform).__name__
    report["vllm_platform_is_cuda"] = bool(platform.is_cuda())
    import triton

    report["triton"] = triton.__version__

    from harness.runner import compare_merge
    from harness.suites import load_suite
    from oracle.side import OracleSide
    from ports.per_request import PORT

    oracle = OracleSide()
    cases = load_suite("ci").merge_cases
    results = [compare_merge(oracle, PORT, case, device="cuda") for case in cases]
    report["l2_cases"] = len(results)
    report["l2_bit_exact"] = sum(r.ok for r in results)
    report["l2_failures"] = [f"{r.id}: {r.detail()}" for r in results if not r.ok][:10]

    tokens, heads, dim = 65536, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    p, s = (torch.randn((tokens, heads, dim), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lp, ls = (torch.randn((heads, tokens), generator=g, device="cuda") for _ in range(2))
    out, out_lse = torch.empty_like(p), torch.empty_like(lp)
    oracle_kernel = import_vllm_module("vllm.v1.attention.ops.triton_merge_attn_states").merge_attn_states
    from ports.per_request.merge_kernel import merge_partials

    moved = 3 * p.numel() * p.element_size() + 3 * lp.numel() * lp.element_size()
    oracle_ms = timed(lambda: oracle_kernel(out, p, lp, s, ls, out_lse))
    port_ms = timed(lambda: merge_partials(p, lp, s, ls, out, out_lse))
    big = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    copy_ms = timed(lambda: big.clone(), repeats=10)
    report["merge_bytes"] = moved
    report["oracle_merge_ms"], report["port_merge_ms"] = oracle_ms, port_ms
    report["oracle_merge_GBps"] = moved / oracle_ms / 1e6
    report["port_merge_GBps"] = moved / port_ms / 1e6
    report["copy_GBps"] = 2 * big.numel() * big.element_size() / copy_ms / 1e6
    text = json.dumps(report, indent=2)
    print(text)
    Path(os.environ.get("OUT", "."), "gpu-probe.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
