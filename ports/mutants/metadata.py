"""Metadata mutants: per_request with the right chunks but one wrong field in a
chunk's metadata.

The planner's cuts are right; what the port reports about a chunk is not: the
token range a continuation merges over, the request the continuation flag is
taken from, or a chunk-local ``query_start_loc`` that keeps the batch's
offsets. Each rewrites every planned chunk (:meth:`Mutant.rewrite_chunk`).
"""

from __future__ import annotations

import dataclasses

from harness.model import Case, Chunk
from ports.mutants.base import Mutant


class ContinuationOverWholeChunk(Mutant):
    name = "continuation-whole-chunk"
    description = "merges a continuation over the chunk's whole token range, not just its first request"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, continuation_token_end=chunk.token_end) if chunk.is_continuation else chunk


class ContinuationFromLastRequest(Mutant):
    name = "continuation-wrong-request"
    description = "takes the continuation flag from the chunk's last request instead of its first"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        return dataclasses.replace(chunk, is_continuation=chunk.starts[-1] > 0)


class QueryStartNotRebased(Mutant):
    name = "query-start-not-rebased"
    description = "chunk-local query_start_loc keeps batch offsets instead of starting at 0"
    source = "hand port"

    def rewrite_chunk(self, chunk: Chunk, case: Case) -> Chunk:
        offset = chunk.token_start
        return dataclasses.replace(chunk, query_start_loc=tuple(q + offset for q in chunk.query_start_loc))
