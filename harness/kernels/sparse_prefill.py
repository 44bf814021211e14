"""L3 of the sparse path (level ``sparse-prefill``): a sparse batch's tensors
and its tokens' top-k indices (the cases are generated in
:mod:`harness.cases.sparse_prefill_generate`).

A side's ``sparse_prefill(case, inputs, kernels)`` runs the batch on the route
it decides (SPEC 1d): dense MHA (the section 1c loop in the sparse workspace)
or masked MHA (suffix attention over the new tokens with indices remapped by
the context length, then per chunk the gather, the up-projection, masked
attention of the chunk's own tokens and the fold, then the final merge). Its
result is the dense L3's: ``context_output``/``context_lse`` when any request
has context, and ``output``/``lse``. A case routed to sparse MQA (decode-style)
or to a masked run upstream cannot make is compared at L1 only: its L3 item is
not run, and says why.

Top-k indices are positions into the token's request's sequence (context, then
new tokens), ``-1`` padding, never past the token itself but in the ``future``
selection; each token's are drawn from its own seed (:func:`token_selection`), so a shrunk case keeps the
selections of the tokens it keeps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from harness.kernels.numeric import PrefillInputs, materialise_prefill
from harness.model.sparse import ROW_SELECTIONS, SELECTIONS, Route, SparseCase

# The routes L3 compares; every other one is compared at L1 only.
L3_ROUTES = (Route.DENSE_MHA, Route.MASKED_MHA)


@dataclass(frozen=True)
class SparsePrefillInputs:
    """A sparse L3 case's tensors: the dense L3's (:class:`PrefillInputs`) and
    ``topk`` ``[num_tokens, index_topk]`` int32 on the same device, row ``t``
    the indices of prefill token ``t`` (tokens in request order)."""

    prefill: PrefillInputs
    topk: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.prefill.num_tokens


def token_selection(case: SparseCase, request: int, token: int, pattern: str | None = None) -> list[int]:
    """The ``index_topk`` indices of new token ``token`` of ``request``:
    positions in ``[0, context + token]`` as :data:`SELECTIONS` describes,
    then ``-1`` to fill the row."""
    assert case.numeric is not None
    rng = random.Random(f"{case.numeric.seed}:{request}:{token}")
    pattern = pattern or case.selection
    if pattern == "mixed":
        pattern = rng.choice(SELECTIONS[:-1])
    position = case.context_lens[request] + token
    limit = min(case.index_topk, position + 1)
    if pattern in ROW_SELECTIONS:
        return _edge_selection(rng, pattern, position, case.index_topk)
    count = rng.randint(1, limit)
    if pattern == "uniform":
        chosen = rng.sample(range(position + 1), count)
    elif pattern == "boundary":
        block, context = case.block_size, case.context_lens[request]
        near = {p for edge in range(0, position + 2, block) for p in (edge - 2, edge - 1, edge, edge + 1)}
        near |= {context - 2, context - 1, context, context + 1}
        candidates = sorted(p for p in near if 0 <= p <= position)
        chosen = rng.sample(candidates, min(count, len(candidates)))
    elif pattern == "recent":
        chosen = list(range(position + 1 - max(1, count // 2), position + 1))
    elif pattern == "early":
        chosen = list(range(max(1, count // 2)))
    elif pattern == "future":
        # Anywhere in the sequence, past the token too: the suffix's causal
        # mask must hide what follows it.
        length = case.context_lens[request] + case.query_lens[request]
        chosen = rng.sample(range(length), min(case.index_topk, length, count + 2))
    else:  # sparse
        chosen = rng.sample(range(position + 1), min(rng.randint(0, 2), position + 1))
    rng.shuffle(chosen)
    return chosen + [-1] * (case.index_topk - len(chosen))


def _edge_selection(rng: random.Random, pattern: str, position: int, topk: int) -> list[int]:
    """A row of :data:`ROW_SELECTIONS` for a token at ``position``."""
    if pattern == "full":
        chosen = rng.sample(range(position + 1), min(topk, position + 1))
    elif pattern == "single":
        chosen = [rng.randrange(position + 1)]
    elif pattern == "duplicates":
        pool = rng.sample(range(position + 1), min(3, position + 1))
        chosen = [rng.choice(pool) for _ in range(topk)]
    else:  # empty
        chosen = []
    return chosen + [-1] * (topk - len(chosen))


def case_topk(case: SparseCase) -> torch.Tensor:
    """``[num_tokens, index_topk]`` int32, on the host: every token's indices."""
    rows = [token_selection(case, r, t) for r, q in enumerate(case.query_lens) for t in range(q)]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), case.index_topk)


def materialise_sparse_prefill(case: SparseCase, device: str = "cpu") -> SparsePrefillInputs:
    """Fresh tensors for ``case`` (each call its own copy of the same values)."""
    assert case.numeric is not None, f"sparse case {case.name} has no numeric section"
    prefill = materialise_prefill(case.context_lens, case.query_lens, case.block_size, case.numeric, device)
    return SparsePrefillInputs(prefill, case_topk(case).to(device))
