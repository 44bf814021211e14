"""Merging mutants: per_request with one bug in how the context loop combines
partial attention results.

The context loop attends each chunk apart and merges the partials by their
log-sum-exps (LSE). These mutants get that bookkeeping wrong: rows of
zero-context requests left with a finite LSE, rows without keys merged as the
kernel reported them, the prefix's and suffix's LSEs swapped, the weighted sum
done in bf16.

One mutant, ``equal-share-no-neutralise``, is the legacy equal_share port
instead, with its neutralisation of rows without keys swapped out (seeds/003):
its grid diverges from the oracle anyway, so the kill that counts for it is an
L3 item on which equal_share itself is bit-exact (see its docstring).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.model import Case, Layout, WorkspaceConfig
from ports.mutants.base import Mutant, merge_swaps, swapped
from ports.per_request import merge_kernel as merge_module
from ports.per_request import prefill as prefill_module


class FiniteLseOnEmptyRows(Mutant):
    name = "finite-lse-empty-rows"
    description = "leaves a finite LSE (0) on the rows of zero-context requests"
    source = "seeds/003"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = prefill_module.context_partial

        def partial(layout: Layout, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
            out, lse = real(layout, *args)
            for start, stop in layout.empty_token_slices:
                lse[:, start:stop] = 0.0
            return out, lse

        return [(prefill_module, "context_partial", partial)]


class EqualShareNoNeutralise(Mutant):
    """The legacy equal_share port with its neutralisation of rows without keys
    deleted (seeds/003's bug in the loop it fixed): each grid chunk's partial is
    merged as the attention kernel reported it.

    What counts as its kill. It is equal_share in every other respect, so it
    diverges at L1 (the grid) and on most L3 cases wherever equal_share itself
    does; those items prove nothing about neutralisation. Its honest kill is an
    L3 item on which the real equal_share is bit-exact with the oracle and this
    mutant is not: the smoke files ``keyless-finite`` and ``keyless-pos-inf``
    (one request with context among zero-context ones, whose grid cuts the
    context where the oracle does), which are the first prefill items of the
    smoke and ci suites, so the kill matrix names one of them (a test checks
    that equal_share reaches parity there). Under the default ``neg-inf``
    kernels the mutant is equal_share bit for bit, which is why the suites run
    keyless rows under every behaviour.
    """

    name = "equal-share-no-neutralise"
    description = (
        "equal_share without neutralising rows without keys before merging; killed at L3 on a case where "
        "equal_share itself is bit-exact (keyless rows under the finite or +inf kernel behaviour)"
    )
    source = "seeds/003"

    def plan_layout(self, case: Case) -> Layout:
        from ports.equal_share import grid_layout

        return grid_layout(case)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        from ports.equal_share import legacy_workspace_size

        return legacy_workspace_size(config)

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        import ports.equal_share.prefill as legacy

        def keep(rowless: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
            """The deleted step: the kernel's report stands."""

        with swapped([(legacy, "neutralise_empty_rows", keep)]):
            return legacy.prefill(self.plan_layout(case), case.workspace_size, inputs, kernels)


class SwappedLse(Mutant):
    name = "merge-lse-swapped"
    description = "merge with prefix and suffix swapped in the LSE but not in the output"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = merge_module.merge_partials

        def merge(prefix: Any, prefix_lse: Any, suffix: Any, suffix_lse: Any, *rest: Any, **kw: Any) -> None:
            real(prefix, suffix_lse, suffix, prefix_lse, *rest, **kw)

        return merge_swaps(merge)


def merge_in_bf16(
    prefix: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix: torch.Tensor,
    suffix_lse: torch.Tensor,
    out: torch.Tensor,
    out_lse: torch.Tensor,
    tokens_with_context: int | None = None,
) -> None:
    """SPEC 1c's merge with the weighted sum done in bf16 instead of fp32."""
    n = out.shape[0] if tokens_with_context is None else tokens_with_context
    p_lse, s_lse = prefix_lse[:, :n], suffix_lse[:, :n]
    p_lse = torch.where(p_lse == float("inf"), float("-inf"), p_lse)
    s_lse = torch.where(s_lse == float("inf"), float("-inf"), s_lse)
    top = torch.maximum(p_lse, s_lse)
    empty = top == float("-inf")
    safe = torch.where(empty, 0.0, top)
    p_w, s_w = torch.exp(p_lse - safe), torch.exp(s_lse - safe)
    total = p_w + s_w
    weights_p = (p_w / total).T.unsqueeze(-1).to(torch.bfloat16)
    weights_s = (s_w / total).T.unsqueeze(-1).to(torch.bfloat16)
    merged = prefix[:n].to(torch.bfloat16) * weights_p + suffix[:n].to(torch.bfloat16) * weights_s
    merged = torch.where(empty.T.unsqueeze(-1), 0.0, merged.float())
    lse = torch.where(empty, float("-inf"), torch.log(total) + top)
    rest_out, rest_lse = suffix[n:].clone(), suffix_lse[:, n:].clone()
    out[:n] = merged.to(out.dtype)
    out_lse[:, :n] = lse
    out[n:] = rest_out
    out_lse[:, n:] = rest_lse


class MergeInBf16(Mutant):
    name = "merge-in-bf16"
    description = "computes the merge's weighted sum in bf16 instead of fp32"
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return merge_swaps(merge_in_bf16)
