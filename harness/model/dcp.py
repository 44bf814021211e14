"""Decode context parallelism at the numeric levels: who holds which context
row, and the one cross-rank step, the all-gather.

Under DCP (world size ``D``, interleave ``I``) a request's context rows are
dealt out to the ranks ``I`` at a time: global position ``p`` lives on rank
``(p // I) % D`` at local position ``(p // (I*D)) * I + p % I`` of that rank's
paged cache (SPEC 1b; upstream's ``get_dcp_local_seq_lens`` counts them).
Each rank gathers its own interleaved share of a chunk into its workspace; the
all-gather concatenates every rank's local buffer, rank-major; each side then
restores context order from that concatenation by its own code.

The all-gather's contract is exactly that concatenation, so one process can
play every rank (:class:`OneProcessRanks`, the default and CI's): it builds the
concatenation from every rank's local buffer, each computed from that rank's
cache. :class:`TorchDistributedRanks` is the real collective, one process per
rank over ``torch.distributed`` (``--dcp-backend gloo``, or NCCL on GPUs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    # Imported where ranks' rows are built: the model's layout half never loads torch.
    import torch

DCP_BACKENDS = ("one-process", "gloo", "nccl")


def rank_context_len(context_len: int, world_size: int, interleave: int, rank: int) -> int:
    """How many of a request's ``context_len`` rows rank ``rank`` holds."""
    stride = world_size * interleave
    full_rounds, tail = divmod(context_len, stride)
    return full_rounds * interleave + min(max(tail - rank * interleave, 0), interleave)


def padded_local_len(context_len: int, world_size: int, interleave: int) -> int:
    """The local rows a rank's gather may read for a request: ``ceil(c / (I*D)) * I``
    (the busiest rank's count, which the others pad up to)."""
    return -(-context_len // (world_size * interleave)) * interleave


def global_positions(local_len: int, world_size: int, interleave: int, rank: int) -> torch.Tensor:
    """The global context position of each of rank ``rank``'s first ``local_len`` local rows."""
    import torch

    local = torch.arange(local_len)
    return (local // interleave) * (interleave * world_size) + rank * interleave + local % interleave


class RankCollective(Protocol):
    """The all-gather of a chunk's local buffers across the DCP group.

    ``all_gather(local_of)`` returns the rank-major concatenation
    ``cat([local_of(0), ..., local_of(D-1)])``; ``local_of`` is called only for
    ranks this process holds (all of them in one process, its own with real
    ranks), and every buffer has the same shape.
    """

    world_size: int
    rank: int
    backend: str

    def holds(self, rank: int) -> bool:
        """Whether this process holds rank ``rank``'s cache."""
        ...

    def all_gather(self, local_of: Callable[[int], torch.Tensor]) -> torch.Tensor: ...


class OneProcessRanks:
    """Every rank in this process: the concatenation built directly."""

    backend = "one-process"

    def __init__(self, world_size: int, rank: int = 0) -> None:
        self.world_size, self.rank = world_size, rank

    def holds(self, rank: int) -> bool:
        return True

    def all_gather(self, local_of: Callable[[int], torch.Tensor]) -> torch.Tensor:
        import torch

        return torch.cat([local_of(rank) for rank in range(self.world_size)])


class TorchDistributedRanks:
    """One rank per process: ``all_gather_into_tensor`` over an initialised
    ``torch.distributed`` group (gloo on CPU, NCCL on GPUs)."""

    def __init__(self, world_size: int, rank: int, backend: str, group: Any = None) -> None:
        self.world_size, self.rank, self.backend, self.group = world_size, rank, backend, group

    def holds(self, rank: int) -> bool:
        return rank == self.rank

    def all_gather(self, local_of: Callable[[int], torch.Tensor]) -> torch.Tensor:
        import torch
        import torch.distributed as dist

        local = local_of(self.rank).contiguous()
        gathered = torch.empty(
            (self.world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device
        )
        dist.all_gather_into_tensor(gathered, local, group=self.group)
        return gathered
