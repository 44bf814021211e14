"""What every mutant shares: :class:`Mutant`, the per_request port that carries
one fault, and :func:`swapped`, which puts a fault in place for one call.

A mutant is the real per_request port except for one thing: a function its
``swaps()`` replaces for the duration of each call (a module's or a class's),
a method it overrides (``workspace_size``, ``plan_layout``, ``prefill``...), or
a field ``rewrite_chunk`` edits in each planned chunk. :func:`merge_swaps` is
the swap of per_request's merge of two partials, which both the merging and
the merge-numerics families replace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.model import Case, Chunk, Layout, WorkspaceConfig
from ports.per_request import PerRequestPort
from ports.per_request import merge_kernel as merge_module
from ports.per_request import prefill as prefill_module


@contextlib.contextmanager
def swapped(swaps: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Replace attributes for the duration of a call, and always restore them."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in swaps]
    try:
        for obj, name, value in swaps:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


class Mutant(PerRequestPort):
    """per_request with one fault: ``swaps()`` replaces functions during every
    call; ``rewrite_chunk`` edits each planned chunk."""

    name = "mutant"
    description = ""
    source = ""  # where the bug comes from (a seed document, or "hand port")
    # The input class that kills it and the level that sees it (empty for a mutant
    # not aimed at one), so a suite's generators can be checked against it.
    aimed_at = ""
    # The declared decision conditions it gets wrong, ``(decision id, condition)``
    # (harness/search/decisions_*.py): the condition's MC/DC pair on ci kills it.
    conditions: tuple[tuple[str, str], ...] = ()
    # The levels the kill matrix searches it at; empty: every level.
    shows_at: tuple[str, ...] = ()

    def swaps(self) -> list[tuple[Any, str, Any]]:
        return []

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return chunk

    def plan_layout(self, case: Case) -> Layout:
        with swapped(self.swaps()):
            layout = super().plan_layout(case)
        chunks = tuple(self.rewrite_chunk(c, case) for c in layout.chunks)
        return Layout(chunks, layout.empty_token_slices)

    def workspace_size(self, config: WorkspaceConfig) -> int:
        with swapped(self.swaps()):
            return super().workspace_size(config)

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with swapped(self.swaps()):
            return super().merge_states(inputs)

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        layout = self.plan_layout(case)
        with swapped(self.swaps()):
            return prefill_module.prefill(layout, case.workspace_size, inputs, kernels)

    # The sparse path (ports/per_request/sparse.py), under the same swaps.
    def plan_sparse(self, case: Any) -> Any:
        with swapped(self.swaps()):
            return super().plan_sparse(case)

    def sparse_workspace_size(self, config: Any) -> int:
        with swapped(self.swaps()):
            return super().sparse_workspace_size(config)

    def build_topk_mask(self, case: Any, topk: list[torch.Tensor]) -> torch.Tensor:
        with swapped(self.swaps()):
            return super().build_topk_mask(case, topk)

    def remap_topk(self, case: Any, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        with swapped(self.swaps()):
            return super().remap_topk(case, topk)

    def sparse_prefill(self, case: Any, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        with swapped(self.swaps()):
            return super().sparse_prefill(case, inputs, kernels)


def merge_swaps(merge: Callable[..., None]) -> list[tuple[Any, str, Any]]:
    """The swaps that put ``merge`` in place of per_request's ``merge_partials``:
    where it is defined and where the context loop calls it."""
    return [(merge_module, "merge_partials", merge), (prefill_module, "merge_partials", merge)]
