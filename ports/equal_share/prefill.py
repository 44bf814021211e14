"""The legacy context loop over the equal-share grid (SPEC section 1a).

Every chunk spans the whole prefill batch. The first chunk's partial is the
running partial; every later chunk is merged into it over all tokens. A request
that contributes no rows to a chunk has its rows' partial neutralised (output 0,
LSE -inf) before the merge: a finite LSE there was the upstream bug of seeds/003.

The per-chunk device work and the merge kernel did not change in b38e111d3e, so
this port reuses per_request's: whatever differs from the oracle is the grid.
"""

from __future__ import annotations

import torch

from harness.kernels import SharedKernels, new_token_attention
from harness.model import Layout
from harness.numeric import PrefillInputs
from ports.per_request.merge_kernel import merge_partials
from ports.per_request.prefill import chunk_partial


def neutralise_empty_rows(layout_chunk_seq_lens: tuple[int, ...], qsl: tuple[int, ...], out: torch.Tensor, lse: torch.Tensor) -> None:
    for request, rows in enumerate(layout_chunk_seq_lens):
        if rows == 0:
            out[qsl[request] : qsl[request + 1]] = 0
            lse[:, qsl[request] : qsl[request + 1]] = float("-inf")


def prefill(layout: Layout, workspace_rows: int, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
    spec = inputs.spec
    suffix_out, suffix_lse = new_token_attention(
        kernels,
        inputs.q,
        inputs.new_kv_c,
        inputs.new_k_pe,
        inputs.kv_b_weight,
        inputs.query_start_loc,
        spec.num_heads,
        spec.qk_nope_head_dim,
        spec.v_head_dim,
        inputs.scale,
    )
    if not layout.chunks:
        return {"output": suffix_out, "lse": suffix_lse}
    workspace = torch.empty((workspace_rows, spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    total: tuple[torch.Tensor, torch.Tensor] | None = None
    for chunk in layout.chunks:
        out, lse = chunk_partial(chunk, inputs, kernels, workspace)
        neutralise_empty_rows(chunk.seq_lens, chunk.query_start_loc, out, lse)
        if total is None:
            total = (out, lse)
            continue
        merge_partials(total[0], total[1], out, lse, out=total[0], out_lse=total[1])
    assert total is not None
    context_out, context_lse = total
    output, lse = torch.empty_like(suffix_out), torch.empty_like(suffix_lse)
    merge_partials(
        context_out[..., : spec.v_head_dim], context_lse, suffix_out[..., : spec.v_head_dim], suffix_lse, output, lse
    )
    return {"context_output": context_out, "context_lse": context_lse, "output": output, "lse": lse}
