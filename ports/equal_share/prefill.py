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

from harness.kernels import SharedKernels
from harness.model import Layout
from harness.numeric import PrefillInputs, new_token_partial
from ports.per_request.merge_kernel import merge_partials
from ports.per_request.prefill import chunk_partial, final_merge


def neutralise_empty_rows(
    seq_lens: tuple[int, ...], qsl: tuple[int, ...], out: torch.Tensor, lse: torch.Tensor
) -> None:
    """Zero output, -inf LSE for the tokens of every request with no rows in this chunk."""
    for request, rows in enumerate(seq_lens):
        if rows == 0:
            out[qsl[request] : qsl[request + 1]] = 0
            lse[:, qsl[request] : qsl[request + 1]] = float("-inf")


def prefill(
    layout: Layout, workspace_rows: int, inputs: PrefillInputs, kernels: SharedKernels
) -> dict[str, torch.Tensor]:
    suffix = new_token_partial(inputs, kernels)
    if not layout.chunks:
        return {"output": suffix[0], "lse": suffix[1]}
    workspace = torch.empty((workspace_rows, inputs.spec.latent_dim), dtype=inputs.q.dtype, device=inputs.q.device)
    total: tuple[torch.Tensor, torch.Tensor] | None = None
    for chunk in layout.chunks:
        out, lse = chunk_partial(chunk, inputs, kernels, workspace)
        neutralise_empty_rows(chunk.seq_lens, chunk.query_start_loc, out, lse)
        if total is None:
            total = (out, lse)
            continue
        merge_partials(total[0], total[1], out, lse, out=total[0], out_lse=total[1])
    assert total is not None
    return final_merge(total, suffix, inputs.spec.v_head_dim)
