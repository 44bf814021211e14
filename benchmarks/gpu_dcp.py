"""The GPU report's DCP row: DCP at L3 with real ranks, one GPU each, over NCCL.

Two processes (world size 2), each on its own GPU with its own rank's cache
(harness.kernels.numeric.case_prefill_inputs with a TorchDistributedRanks collective):
the all-gather of every chunk is a real ``all_gather_into_tensor`` over NCCL,
the shared kernels are the CUDA ones (harness.kernels.CudaKernels), the
oracle is upstream's DCP loop (oracle.numeric) with upstream's own
``MLADCPManager.kv_gather`` set up over the NCCL group (its calls are counted
and must be more than 0), and the port per_request's own DCP step over
``all_gather_into_tensor``. Every rank writes its tensors; the parent checks that both ranks of
each side gave the same bits and compares rank 0's oracle and port tensors bit
for bit (harness.compare.bits.compare_bits). Each rank also times both context loops
(CUDA events, median over repeats, the same calls on both ranks, since every
all-gather is collective).

    python -m benchmarks.gpu_dcp [--cases cases/gpu/dcp.json]    # or a section of gpu_report
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.cuda_timing import cuda_ms

DCP_CASES = Path(__file__).resolve().parent.parent / "cases" / "gpu" / "dcp.json"
WORLD_SIZE = 2
RANK_TIMEOUT_S = 900


def _rank_main(rank: int, cases_path: str, scratch: str, warmup: int, repeats: int, on_gpu: bool) -> None:
    """One rank: its inputs, both sides' prefill and context loop, its tensors to
    ``scratch``. ``on_gpu`` False is a CPU rehearsal (gloo, CPU kernels, no timing)."""
    from oracle.environment import prepare_environment, use_device

    if on_gpu:
        use_device("cuda")
    else:
        prepare_environment()
    import torch.distributed as dist

    from harness.cases.files import load_case_file
    from harness.kernels import CpuKernels, CudaKernels
    from harness.kernels.numeric import case_prefill_inputs
    from harness.model.dcp import TorchDistributedRanks
    from oracle import numeric as oracle_numeric
    from ports.per_request import PORT
    from ports.per_request import prefill as port_prefill

    backend = "nccl" if on_gpu else "gloo"
    if on_gpu:
        torch.cuda.set_device(rank)
    device = f"cuda:{rank}" if on_gpu else "cpu"
    dist.init_process_group(backend, init_method=f"file://{scratch}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    ranks = TorchDistributedRanks(WORLD_SIZE, rank, backend)
    kernels = CudaKernels() if on_gpu else CpuKernels()
    records: list[dict[str, Any]] = []
    for case in load_case_file(Path(cases_path)):
        record: dict[str, Any] = {"case": case.name}
        try:
            gathers_before = oracle_numeric.UpstreamKvGather.calls
            oracle_out = oracle_numeric.prefill(case, case_prefill_inputs(case, device, ranks), kernels)
            # Real ranks: the oracle's all-gathers are upstream's own kv_gather.
            record["oracle_kv_gathers"] = oracle_numeric.UpstreamKvGather.calls - gathers_before
            assert record["oracle_kv_gathers"] > 0, "the oracle's DCP loop never called upstream's kv_gather"
            port_out = PORT.prefill(case, case_prefill_inputs(case, device, ranks), kernels)
            tensors = {f"oracle.{k}": v.contiguous().cpu() for k, v in oracle_out.items()}
            tensors |= {f"port.{k}": v.contiguous().cpu() for k, v in port_out.items()}
            # torch.save: the lent GPU image is not promised safetensors.
            torch.save(tensors, f"{scratch}/{case.name}.rank{rank}.pt")
            layout = PORT.plan_layout(case)
            record["chunks"] = layout.num_chunks
            if not on_gpu:
                records.append(record)
                continue
            inputs = case_prefill_inputs(case, device, ranks)
            oracle_loop = oracle_numeric.context_loop(case, inputs, kernels)
            assert oracle_loop is not None
            record["oracle_ms"] = cuda_ms(oracle_loop, warmup, repeats)["median"]
            record["port_ms"] = cuda_ms(
                functools.partial(port_prefill.context_partial, layout, case.workspace_size, inputs, kernels),
                warmup,
                repeats,
            )["median"]
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()[-2000:]
        records.append(record)
    Path(f"{scratch}/rank{rank}.json").write_text(json.dumps(records), encoding="utf-8")
    dist.destroy_process_group()


def dcp_section(
    cases_path: Path = DCP_CASES, warmup: int = 3, repeats: int = 10, on_gpu: bool = True
) -> dict[str, Any]:
    """Every case of ``cases_path`` on two real ranks: per case, the rank check,
    the bitwise verdict per tensor and both loops' times (GPU only)."""
    from harness.cases.files import load_case_file
    from harness.compare.bits import compare_bits, identical_bits

    if on_gpu and torch.cuda.device_count() < WORLD_SIZE:
        return {"skipped": f"{torch.cuda.device_count()} GPU(s) visible; the DCP row needs {WORLD_SIZE}"}
    context = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as scratch:
        processes = [
            context.Process(target=_rank_main, args=(rank, str(cases_path), scratch, warmup, repeats, on_gpu))
            for rank in range(WORLD_SIZE)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(RANK_TIMEOUT_S)
        exits = [p.exitcode for p in processes]
        for process in processes:
            if process.is_alive():
                process.kill()
        if any(code != 0 for code in exits):
            return {"error": f"rank processes exited {exits}"}
        per_rank = [json.loads(Path(f"{scratch}/rank{r}.json").read_text(encoding="utf-8")) for r in range(WORLD_SIZE)]
        rows = []
        for case, *records in zip(load_case_file(cases_path), *per_rank, strict=True):
            spec = case.numeric
            assert spec is not None
            row: dict[str, Any] = {
                "case": case.name,
                "heads": spec.num_heads,
                "latent": spec.latent_dim,
                "dtype": spec.dtype,
                "interleave": case.cp_kv_cache_interleave_size,
                "contexts": sum(case.context_lens),
                "tokens": sum(case.query_lens),
            }
            errors = [r["error"] for r in records if "error" in r]
            if errors:
                rows.append({**row, "error": errors[0]})
                continue
            ranks = [torch.load(f"{scratch}/{case.name}.rank{r}.pt") for r in range(WORLD_SIZE)]
            row["ranks_agree"] = all(
                identical_bits(ranks[0][name], other[name]) for other in ranks[1:] for name in ranks[0]
            )
            tensors = []
            for name in sorted(k.removeprefix("oracle.") for k in ranks[0] if k.startswith("oracle.")):
                axes = ("head", "token") if name.endswith("lse") else ("token", "head", "dim")
                tensors.append(compare_bits(name, ranks[0][f"oracle.{name}"], ranks[0][f"port.{name}"], axes))
            row["bit_exact"] = all(t.exact for t in tensors)
            row["max_ulp"] = max(t.max_ulp for t in tensors)
            row["chunks"] = records[0]["chunks"]
            row["oracle_kv_gathers"] = records[0]["oracle_kv_gathers"]
            if on_gpu:
                row["oracle_ms"] = max(r["oracle_ms"] for r in records)
                row["port_ms"] = max(r["port_ms"] for r in records)
            rows.append(row)
    return {"world_size": WORLD_SIZE, "backend": "nccl" if on_gpu else "gloo (CPU rehearsal)", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DCP_CASES)
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU: gloo, CPU kernels, no timing")
    args = parser.parse_args(argv)
    section = dcp_section(args.cases, on_gpu=not args.cpu)
    print(json.dumps(section, indent=2))
    rows = section.get("rows", [])
    return 0 if rows and all(r.get("bit_exact") and r.get("ranks_agree") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
