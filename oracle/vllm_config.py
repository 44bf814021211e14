"""Stand-ins for the vLLM config objects the oracle's calls read: only the
attributes those calls touch, so no engine config is built."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.model import WorkspaceConfig


def workspace_vllm_config(config: WorkspaceConfig) -> SimpleNamespace:
    """The attributes of a VllmConfig that ``determine_chunked_prefill_workspace_size``
    reads (0.27.1's and 0.28.0's alike); a stand-in avoids building a whole engine config."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=config.max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=config.max_num_seqs),
        cache_config=SimpleNamespace(block_size=config.block_size),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=config.dcp_world_size,
            cp_kv_cache_interleave_size=config.cp_kv_cache_interleave_size,
        ),
    )
