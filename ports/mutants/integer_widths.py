"""Integer-width mutants: per_request storing one value in a narrower integer
than the value can reach.

A port that stores a value in a narrower integer than the value can reach
wraps it silently. Each of these mutants wraps one value (a chunk-local request
index, a DCP local start, a batch request range, the workspace heuristic's
products) exactly as a C/CUDA port (or a torch tensor of that dtype) would, in
int8, uint8, int16 or int32; the value reaches the width only on inputs past
that width, so only such inputs can tell. Each names that input class and the
level that sees it in ``aimed_at``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.model import Case, Chunk, Layout, WorkspaceConfig, alignment_unit
from ports.mutants.base import Mutant
from ports.per_request import DENSE_WORKSPACE_CAP
from ports.per_request import prefill as prefill_module


def wrap_signed(value: int, bits: int) -> int:
    """``value`` stored in a two's-complement integer of ``bits`` bits."""
    half = 1 << (bits - 1)
    return (value + half) % (1 << bits) - half


def wrap_unsigned(value: int, bits: int) -> int:
    """``value`` stored in an unsigned integer of ``bits`` bits."""
    return value % (1 << bits)


class TokenToSeqUint8(Mutant):
    name = "token-to-seq-uint8"
    aimed_at = "L1: a chunk holding more than 256 requests with context (token_to_seq reaches 256)"
    description = (
        "stores the chunk-local request index (token_to_seq) as uint8: wraps in a chunk of more than 256 requests"
    )
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, token_to_seq=tuple(wrap_unsigned(v, 8) for v in chunk.token_to_seq))


class DcpTokenToSeqInt8(Mutant):
    name = "dcp-token-to-seq-int8"
    aimed_at = "L1: a DCP chunk holding more than 128 requests with context"
    description = "stores the DCP padded local token_to_seq as int8: wraps in a DCP chunk of more than 128 requests"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        if chunk.padded_local_token_to_seq is None:
            return chunk
        wrapped = tuple(wrap_signed(v, 8) for v in chunk.padded_local_token_to_seq)
        return dataclasses.replace(chunk, padded_local_token_to_seq=wrapped)


class DcpLocalStartsInt16(Mutant):
    name = "dcp-local-starts-int16"
    aimed_at = "L1: a DCP request whose later piece has a local start of 32768 or more (D=2: a start of 65536)"
    description = (
        "stores the DCP local starts (the gather's starts) as int16: wraps once a rank's start passes 32767 rows"
    )
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        if chunk.local_starts is None:
            return chunk
        wrapped = tuple(wrap_signed(v, 16) for v in chunk.local_starts)
        return dataclasses.replace(chunk, local_starts=wrapped, starts=wrapped)


class RequestIndexInt16(Mutant):
    name = "request-index-int16"
    aimed_at = "L1: a batch of more than 32768 requests with a chunk reaching past request 32767"
    description = "stores a chunk's batch request range as int16: wraps in a batch of more than 32768 requests"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(
            chunk,
            request_start=wrap_signed(chunk.request_start, 16),
            request_end=wrap_signed(chunk.request_end, 16),
        )


class DeviceTokenToSeqUint8(Mutant):
    """The layout it reports is right (built from host ints); only the device
    copy the gather reads is narrowed, so no layout check can see it: only an
    L3 chunk of more than 256 requests with context."""

    name = "device-token-to-seq-uint8"
    aimed_at = "L3: a chunk holding more than 256 requests with context"
    description = (
        "packs the device copy of token_to_seq as uint8 (the reported layout stays right): in a chunk of more than "
        "256 requests the gather indexes the wrong request (past the chunk's block table: an IndexError on the CPU "
        "kernels, which is how ci kills it)"
    )
    source = "hand port"

    def swaps(self) -> list[tuple[Any, str, Any]]:
        real = prefill_module.device_chunks

        def narrowed(layout: Layout, device: torch.device) -> tuple[prefill_module.DeviceChunk, ...]:
            planned = real(layout, device)
            return tuple(dataclasses.replace(p, token_to_seq=p.token_to_seq.remainder(256)) for p in planned)

        return [(prefill_module, "device_chunks", narrowed)]


class WorkspaceInt32(Mutant):
    name = "workspace-int32"
    aimed_at = "L1 workspace grid: max_model_len of 2^28 or more (8 x max_model_len past 2^31)"
    description = (
        "computes the workspace heuristic's 8 x max_model_len and 4 x max_num_seqs x block_size in int32: "
        "they wrap negative past 2^31"
    )
    source = "hand port"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        unit = alignment_unit(config.block_size, config.dcp_world_size, config.cp_kv_cache_interleave_size)
        by_length = wrap_signed(8 * config.max_model_len, 32)
        by_seqs = wrap_signed(4 * wrap_signed(config.max_num_seqs * config.block_size, 32), 32)
        wanted = max(min(max(by_length, by_seqs), DENSE_WORKSPACE_CAP), unit)
        return -(-wanted // unit) * unit
