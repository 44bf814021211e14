"""The GPU report: parity at L2 and L3 on the GPU and the two benchmarks.

Run on a machine with a CUDA GPU and the pinned oracle importable (on the lent
H200: ``tools/gpu_report.sh``, which installs the carried bundle first)::

    python -m benchmarks.gpu_report --out reports/gpu

Writes ``<out>/<date>.json`` (every figure) and ``<out>/<date>.md`` (rendered by
reports/gpu.py). Sections:

* parity: the ``gpu`` suite (252 merge cases, 160 prefill cases at DeepSeek
  dimensions) and the benchmark batches of cases/gpu/bench.json, per_request
  and the legacy equal_share against the oracle, both Triton merge kernels
  compiled, the shared kernels on the GPU (harness.kernels.CudaKernels);
* the merge kernel: upstream's Triton kernel and the port's, in GB/s and as a
  fraction of the device's copy bandwidth, on every shape of MERGE_SHAPES, with
  their bits compared;
* the prefill context loop on the batches of cases/gpu/bench.json: the legacy
  grid (equal_share), per_request and upstream's own loop, chunks and ms;
* the sparse path's masked prefill at DeepSeek-V3.2 shapes: parity and the
  forward's time against upstream's (benchmarks/gpu_sparse.py);
* with two GPUs, DCP at L3 on real ranks over NCCL (benchmarks/gpu_dcp.py).

Timings are CUDA events after warm-up, medians over repeats: around ten launches
back to back for a kernel (the merge, the copy), so the host's launch latency
is hidden as it is in a forward pass; around one call for a context loop,
whose host work is part of its cost. Layouts and device metadata are built before timing (upstream builds
its metadata before the forward pass too). A section that fails is recorded
with its error and the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.cuda_timing import cuda_ms, interleaved_cuda_ms
from harness.kernels import SharedKernels
from harness.model import Case
from harness.model.levels import Level, levels_where
from oracle.environment import import_vllm_module, use_device

BENCH_CASES = Path(__file__).resolve().parent.parent / "cases" / "gpu" / "bench.json"
PARITY_PORTS = ("per_request", "equal_share")
# Every pairing the issue names: head sizes 128 (v_head_dim) and 576 (the latent),
# bf16 and fp16, 16 and 128 heads.
MERGE_SHAPES = (
    (65536, 16, 128, torch.bfloat16),
    (65536, 16, 128, torch.float16),
    (16384, 128, 128, torch.bfloat16),
    (16384, 16, 576, torch.float16),
    (16384, 16, 576, torch.bfloat16),
    (16384, 128, 576, torch.bfloat16),
)
# Launches a kernel timing holds back to back (cuda_ms).
KERNEL_LAUNCHES = 10


def environment() -> dict[str, Any]:
    import triton

    started = time.perf_counter()
    current = import_vllm_module("vllm.platforms").current_platform
    vllm = import_vllm_module("vllm")
    return {
        "device": torch.cuda.get_device_name(0),
        "device_count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "vllm": getattr(vllm, "__version__", "?"),
        "vllm_import_s": round(time.perf_counter() - started, 1),
        "vllm_platform": type(current).__name__,
    }


def parity_section(kernels: SharedKernels) -> dict[str, Any]:
    """Every L2/L3 item of the gpu suite and the benchmark batches, per port."""
    from harness.cases.files import load_cases
    from harness.cases.suites import Suite, load_suite
    from harness.engine import open_oracle
    from harness.sides.loading import load_port
    from harness.sides.runner import run_items
    from harness.verdicts.summary import results_table, summarise_table

    oracle, provenance = open_oracle(allow_drift=False)
    gpu = load_suite("gpu")
    bench = Suite("gpu-bench", tuple(load_cases([BENCH_CASES])), ())
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for port_name in PARITY_PORTS:
        port = load_port(port_name)
        dense_float = tuple(levels_where(lambda spec: spec.floats and not spec.sparse))
        for suite, levels in ((gpu, dense_float), (bench, (Level.PREFILL,))):
            started = time.perf_counter()
            results = list(run_items(oracle, port, suite, levels, None, kernels, device="cuda"))
            table = results_table(results)
            summary = summarise_table(table, suite.name, port_name, levels)
            for level in levels:
                counts, numeric = summary["levels"][level], summary["numeric"][level]
                rows.append(
                    {
                        "port": port_name,
                        "suite": suite.name,
                        "level": level,
                        "items": numeric["items"],
                        "bit_exact": numeric["bit_exact"],
                        "divergent": counts["divergent"],
                        "errors": counts["oracle-error"] + counts["port-error"],
                        "max_ulp": numeric["max_ulp"],
                        "histogram": numeric["histogram"],
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                )
            failures += [f"{port_name}: {r.id}: {r.status}: {r.detail()}" for r in results if not r.ok][:5]
    return {"rows": rows, "first_failures": failures, "oracle": provenance}


def copy_bandwidth(warmup: int, repeats: int) -> float:
    """GB/s of a 1 GiB device-to-device clone (read plus write)."""
    block = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    timing = cuda_ms(lambda: block.clone(), warmup, repeats, KERNEL_LAUNCHES)
    return 2 * block.numel() / float(timing["median"]) / 1e6


def merge_row(shape: tuple[int, int, int, torch.dtype], warmup: int, repeats: int) -> dict[str, Any]:
    """Upstream's Triton merge and the port's on one shape of random partials."""
    from harness.compare.bits import identical_bits
    from ports.per_request.merge_kernel import merge_partials

    oracle_merge = import_vllm_module("vllm.v1.attention.ops.triton_merge_attn_states").merge_attn_states
    tokens, heads, dim, dtype = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    p, s = (torch.randn((tokens, heads, dim), generator=g, device="cuda").to(dtype) for _ in range(2))
    lp, ls = (torch.randn((heads, tokens), generator=g, device="cuda") for _ in range(2))
    out, out_lse = torch.empty_like(p), torch.empty_like(lp)
    moved = 3 * p.numel() * p.element_size() + 3 * lp.numel() * lp.element_size()
    upstream = cuda_ms(lambda: oracle_merge(out, p, lp, s, ls, out_lse), warmup, repeats, KERNEL_LAUNCHES)
    expected, expected_lse = out.clone(), out_lse.clone()
    port = cuda_ms(lambda: merge_partials(p, lp, s, ls, out, out_lse), warmup, repeats, KERNEL_LAUNCHES)
    return {
        "shape": f"{tokens}x{heads}x{dim}",
        "dtype": str(dtype).removeprefix("torch."),
        "bytes": moved,
        "oracle_ms": upstream["median"],
        "port_ms": port["median"],
        "oracle_GBps": moved / upstream["median"] / 1e6,
        "port_GBps": moved / port["median"] / 1e6,
        "port_vs_oracle": upstream["median"] / port["median"],
        "oracle_samples": upstream["samples"],
        "port_samples": port["samples"],
        "bit_identical": identical_bits(out, expected) and identical_bits(out_lse, expected_lse),
    }


def merge_section(warmup: int, repeats: int) -> dict[str, Any]:
    rows = [merge_row(shape, warmup, repeats) for shape in MERGE_SHAPES]
    torch.cuda.empty_cache()
    return {"copy_GBps": copy_bandwidth(warmup, repeats), "rows": rows, "warmup": warmup, "repeats": repeats}


def prefill_row(case: Case, kernels: SharedKernels, warmup: int, repeats: int) -> dict[str, Any]:
    """The context loop of one batch: legacy grid, per-request port, upstream."""
    from harness.kernels.numeric import materialise_prefill
    from oracle.numeric import context_loop
    from ports.equal_share import PORT as LEGACY
    from ports.equal_share.prefill import context_partial as legacy_loop
    from ports.equal_share.prefill import grid_chunks
    from ports.per_request import PORT as PER_REQUEST
    from ports.per_request.prefill import context_partial, device_chunks

    assert case.numeric is not None
    device = torch.device("cuda")
    inputs = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric, "cuda")
    legacy, per_request = LEGACY.plan_layout(case), PER_REQUEST.plan_layout(case)
    legacy_chunks, per_request_chunks = grid_chunks(legacy, device), device_chunks(per_request, device)
    upstream = context_loop(case, inputs, kernels)
    assert upstream is not None, "a benchmark batch without context"
    width = case.workspace_size
    timings = interleaved_cuda_ms(
        {
            "legacy": lambda: legacy_loop(legacy, width, inputs, kernels, legacy_chunks),
            "per_request": lambda: context_partial(per_request, width, inputs, kernels, per_request_chunks),
            "upstream": upstream,
        },
        warmup,
        repeats,
    )
    return {
        "batch": case.name,
        "requests": case.num_requests,
        "context_tokens": sum(case.context_lens),
        "query_tokens": sum(case.query_lens),
        "legacy_chunks": legacy.num_chunks,
        "per_request_chunks": per_request.num_chunks,
        "legacy_ms": timings["legacy"]["median"],
        "per_request_ms": timings["per_request"]["median"],
        "upstream_ms": timings["upstream"]["median"],
        "speedup": timings["legacy"]["median"] / timings["per_request"]["median"],
        "timings": timings,
    }


def prefill_section(kernels: SharedKernels, warmup: int, repeats: int) -> dict[str, Any]:
    from harness.cases.files import load_cases

    cases = load_cases([BENCH_CASES])
    rows = []
    for case in cases:
        rows.append(prefill_row(case, kernels, warmup, repeats))
        torch.cuda.empty_cache()
    spec = cases[0].numeric
    return {
        "rows": rows,
        "warmup": warmup,
        "repeats": repeats,
        "interleaved": True,  # interleaved_cuda_ms
        "spec": spec.to_json() if spec else None,
    }


def run_section(report: dict[str, Any], name: str, build: Callable[[], Any]) -> None:
    started = time.perf_counter()
    try:
        report[name] = build()
    except Exception as exc:
        report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        print(report[name]["traceback"], file=sys.stderr)
    print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/gpu", help="folder for <date>.json and <date>.md")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--skip-parity", action="store_true", help="benchmarks only")
    parser.add_argument("--dcp-only", action="store_true", help="only the DCP row (two GPUs: world size 2 over NCCL)")
    parser.add_argument("--sparse-only", action="store_true", help="only the sparse rows (masked L3 and its timing)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if not torch.cuda.is_available():
        print(f"gpu_report: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    from harness.kernels import CudaKernels
    from reports.gpu import render_markdown

    use_device("cuda")
    kernels = CudaKernels()
    report: dict[str, Any] = {"date": args.date, "command": "tools/gpu_report.sh"}
    run_section(report, "environment", environment)
    only = args.dcp_only or args.sparse_only
    if not args.skip_parity and not only:
        run_section(report, "parity", lambda: parity_section(kernels))
    if not only:
        run_section(report, "merge", lambda: merge_section(args.warmup, args.repeats))
        run_section(report, "prefill", lambda: prefill_section(kernels, args.warmup, args.repeats))
    if not args.dcp_only:
        from benchmarks.gpu_sparse import sparse_section

        run_section(report, "sparse", lambda: sparse_section(kernels, args.warmup, args.repeats))
    if (torch.cuda.device_count() >= 2 and not args.sparse_only) or args.dcp_only:
        from benchmarks.gpu_dcp import dcp_section

        run_section(report, "dcp", dcp_section)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.date}.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / f"{args.date}.md").write_text(render_markdown(report), encoding="utf-8")
    print(render_markdown(report))
    failed = [name for name, section in report.items() if isinstance(section, dict) and "error" in section]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
