"""The GPU report's sparse rows: the sparse path's masked prefill at DeepSeek-V3.2 head
shapes (128 heads, a 576-wide latent, ``index_topk`` 2048) on the GPU.

* parity: each batch of :func:`sparse_batches` at level sparse-prefill,
  per_request against the pinned oracle (upstream's own ``forward_mha`` and
  ``_compute_context_mha``, its Triton mask builder and merge compiled), both
  on the shared CUDA kernels (the masked kernel is the harness's deterministic
  reference: FlashAttention 4's masked kernel exists on Blackwell only);
* timing: per_request's masked forward (its suffix, context loop and final
  merge) against upstream's on the same shared kernels and inputs, plans and
  metadata built before timing (upstream builds its metadata before the
  forward pass), CUDA events, medians over repeats, the two interleaved.

    python -m benchmarks.gpu_sparse [--device cpu --small]   # or a section of gpu_report

``--device cpu --small`` is the CPU rehearsal (the tiny preset, short batches,
no timing): every code path of the section, on this machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from typing import Any

import torch

from harness.model import PRESETS, NumericSpec
from harness.model.sparse import SparseCase

# DeepSeek-V3.2: the head shapes _is_masked_mha_available asks for (128 heads,
# kv_lora_rank 512, nope 128, rope 64, v 128) and its indexer's top-k.
DEEPSEEK_V32 = dataclasses.replace(PRESETS["deepseek-v3"], dtype="bf16", seed=29)
INDEX_TOPK = 2048


def sparse_batches(spec: NumericSpec = DEEPSEEK_V32, scale: int = 1) -> list[SparseCase]:
    """The masked route both ways (global mask, per-range indices), without
    context, and the dense route, at the TP-8 FLASHMLA_SPARSE thresholds (a
    longest sequence within 4096 takes masked MHA from 512 queries).

    ``scale`` > 1 is the CPU rehearsal: every length divided by it, and, as the
    thresholds are then out of reach, ``index_topk`` at the longest sequence
    with masked MHA forced and a 32-row workspace (the L3 generator's recipe)."""

    def lens(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(max(1, v // scale) if v else 0 for v in values)

    context, query = lens((3000, 0, 1500, 2500)), lens((600, 512, 900, 1000))
    rehearsal = scale > 1
    topk = max(c + q for c, q in zip(context, query, strict=True)) if rehearsal else INDEX_TOPK
    common: dict[str, Any] = {
        "block_size": 4 if rehearsal else 64,
        "max_model_len": 4 if rehearsal else 163840,
        "index_topk": topk,
        "backend": "FLASHMLA_SPARSE",
        "tensor_parallel_size": 8,
        "numeric": spec,
        "family": "gpu-sparse",
    }
    masked = {**common, "force_masked_mha": rehearsal}
    tile = 128 if max(query) <= 128 else 256
    batch, rows = len(query), -(-max(query) // tile) * tile
    # Room for the suffix's and every chunk's per-range mask (a chunk holds at
    # most index_topk rows here: the sparse workspace), not for the global one.
    per_range_words = batch * rows * -(-max(max(query), topk) // 32)
    return [
        SparseCase("gpu-sparse-masked-global", context, query, max_num_seqs=1, selection="mixed", **masked),
        SparseCase(
            "gpu-sparse-masked-ranges",
            context,
            query,
            max_num_seqs=1,
            selection="boundary",
            mask_workspace_words=per_range_words,
            **masked,
        ),
        SparseCase(
            "gpu-sparse-masked-suffix",
            (0, 0),
            lens((1500, 800)),
            max_num_seqs=4,
            selection="uniform",
            **{**common, "force_masked_mha": True},
        ),
        SparseCase("gpu-sparse-dense-route", lens((1200, 0, 700)), lens((600, 300, 900)), max_num_seqs=1, **common),
    ]


def parity_rows(oracle: Any, kernels: Any, device: str, batches: list[SparseCase]) -> list[dict[str, Any]]:
    from harness.sides.loading import load_port
    from harness.sides.runner import run_item

    port = load_port("per_request")
    rows = []
    for case in batches:
        plan = oracle.plan_sparse(case)
        result = run_item(oracle, port, "sparse-prefill", case, kernels, device)
        rows.append(
            {
                "batch": case.name,
                "route": plan.route,
                "form": (
                    "-"
                    if plan.route != "masked-mha"
                    else "global"
                    if plan.global_mask_fits
                    else "per-range"
                    if plan.layout.chunks
                    else "suffix"
                ),
                "chunks": plan.layout.num_chunks,
                "continuations": sum(c.is_continuation for c in plan.layout.chunks),
                "heads": case.numeric.num_heads if case.numeric else None,
                "tokens": sum(case.query_lens),
                "status": result.status,
                "bit_exact": bool(result.tensors) and all(t.exact for t in result.tensors),
                "max_ulp": max((t.max_ulp for t in result.tensors), default=None),
                "detail": None if result.ok else result.detail()[:300],
            }
        )
    return rows


def timing_rows(
    oracle: Any, kernels: Any, batches: list[SparseCase], warmup: int, repeats: int
) -> list[dict[str, Any]]:
    from benchmarks.cuda_timing import interleaved_cuda_ms
    from harness.kernels.context_chunks import device_chunks
    from harness.kernels.sparse_prefill import materialise_sparse_prefill
    from oracle.sparse_prefill import masked_forward
    from ports.per_request.sparse import plan_sparse
    from ports.per_request.sparse_prefill import masked_prefill

    rows = []
    for case in batches:
        plan = plan_sparse(case)
        if plan.route != "masked-mha":
            continue
        inputs = materialise_sparse_prefill(case, "cuda")
        upstream = masked_forward(oracle._sparse(), case, inputs, kernels)
        planned = device_chunks(plan.layout, torch.device("cuda"))
        port = functools.partial(masked_prefill, case, plan, inputs, kernels, planned)
        timings = interleaved_cuda_ms(
            {"per_request": port, "upstream": upstream},
            warmup,
            repeats,
        )
        rows.append(
            {
                "batch": case.name,
                "chunks": plan.layout.num_chunks,
                "per_request_ms": timings["per_request"]["median"],
                "upstream_ms": timings["upstream"]["median"],
                "ratio": timings["per_request"]["median"] / timings["upstream"]["median"],
                "timings": timings,
            }
        )
        torch.cuda.empty_cache()
    return rows


def sparse_section(kernels: Any, warmup: int, repeats: int, device: str = "cuda", scale: int = 1) -> dict[str, Any]:
    from harness.engine import open_oracle

    oracle, provenance = open_oracle(allow_drift=False)
    spec = DEEPSEEK_V32 if scale == 1 else dataclasses.replace(PRESETS["tiny"], seed=29)
    batches = sparse_batches(spec, scale)
    section: dict[str, Any] = {
        "spec": spec.to_json(),
        "index_topk": batches[0].index_topk,
        "parity": parity_rows(oracle, kernels, device, batches),
        "oracle": provenance,
    }
    if device == "cuda":
        section["timing"] = timing_rows(oracle, kernels, batches, warmup, repeats)
        section["warmup"], section["repeats"] = warmup, repeats
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--small", action="store_true", help="the tiny preset and lengths / 16 (the CPU rehearsal)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    from harness.kernels import kernels_for
    from oracle.environment import prepare_environment, use_device

    if args.device == "cuda":
        use_device("cuda")
    else:
        prepare_environment()
    section = sparse_section(kernels_for(args.device), args.warmup, args.repeats, args.device, 16 if args.small else 1)
    print(json.dumps(section, indent=2, default=str))
    bad = [r for r in section["parity"] if r["status"] != "parity"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
