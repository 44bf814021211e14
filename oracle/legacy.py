"""The legacy oracle: vllm==0.27.1, the last release with the equal-share grid
(SPEC section 1a), called (never copied) and translated into the harness's data
model, in the form :func:`ports.equal_share.grid_layout` plans it.

It runs only inside the 0.27.1 environment (``.tox/vllm-0.27.1``), served to the
harness as a subprocess (``python -m oracle.serve``). Everything it computes is
0.27.1's own code: ``build_mla_chunked_context_metadata`` plans the grid,
``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size`` sizes the
workspace, ``merge_attn_states`` (its Triton kernel) merges, and L3 is its
``MLACommonBaseImpl.forward_mha`` with its ``_compute_prefill_context`` (the
chunk loop, ``mask_empty_context`` on every chunk that has a request without
rows, the in-loop merges) and its final merge, which covers only the tokens
before ``query_start_loc[number of prefills with context]``.

Only what cannot run on this machine is replaced, exactly as for the pinned
oracle (:mod:`oracle.numeric`): the paged-cache gather, the prefill backend's
two attentions and ``kv_b_proj`` are the harness's shared kernels. Two more
substitutions, neither of which changes a value 0.27.1 computes: its builder
allocates its host tensors with ``pin_memory=True``, which a CPU-only torch has
no allocator for, so the flag is dropped inside the builder's module; and under
decode context parallelism its loop all-gathers across ranks
(``get_dcp_group().all_gather``), which the harness's collective stands in for.
At the layout level that stand-in only needs the shape (every rank gathers the
same number of rows, so the gathered buffer has ``D`` times the local rows: the
shape is all its assertions read). At L3 it is numeric
(:class:`oracle.legacy_prefill._NumericDcpGroup`): the rank-major concatenation of every rank's local
gather of the chunk, each from that rank's own cache; 0.27.1's
``_context_parallel_compute_prefill_context`` and its ``reorg_kvcache`` run once
per rank, and every rank must give the same bits.

Refusals. A case 0.27.1 refuses, or plans but cannot run, raises
:class:`LegacyRefusal` with a one-line reason that is the same for every case of
its class (:data:`REFUSALS` names the classes; a baseline matches them):

- its builder's own assertions (``max_context_chunk > 0``;
  ``max_context_chunk % dcp_world_size == 0`` under DCP);
- under DCP, its metadata builder's ``__init__`` asserts
  ``chunked_prefill_workspace_size % dcp_world_size == 0`` before any batch is
  planned (checked here, from the case's workspace size);
- under DCP, its own ``_context_parallel_compute_prefill_context`` run on the
  plan with the gather and all-gather stood in for (shapes only): any assertion
  or error it raises (the all-gather slot ``toks <= allgather_offset``,
  ``reorg_kvcache``'s row checks) is named by its source line;
- under DCP, a chunk its loop skips (``toks == 0``) although the chunk holds
  context rows: 0.27.1 would run, silently dropping that context.

The translation, field by field (:data:`FIELD_SOURCES`), is what docs/oracles.md lists.

This module holds the side (:class:`LegacyOracleSide`: L1, the workspace size,
L2), its refusals and the shape-only run of its DCP loop; L3 (0.27.1's
``forward_mha`` on the shared kernels, its numeric DCP group) is
:mod:`oracle.legacy_prefill`, and what the side executes of 0.27.1 (the trace
and the pin of ``oracle/pins/vllm-0.27.1.json``) is :mod:`oracle.legacy_pin`.
"""

from __future__ import annotations

import contextlib
import traceback
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

from harness.model import Case, Chunk, Layout, WorkspaceConfig
from oracle.environment import import_vllm_module
from oracle.legacy_prefill import legacy_prefill
from oracle.pin import MLA
from oracle.side import SparseSideMixin

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs

LEGACY_VERSION = "0.27.1"

BUILDER = "build_mla_chunked_context_metadata"
SIZING = "MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size"
DCP_LOOP = "MLACommonBaseImpl._context_parallel_compute_prefill_context"

# Where each field of a translated Layout comes from: 0.27.1's own value (the
# function that computes it) or the harness's translation of the grid into the
# per-chunk data model (0.27.1 has no such field; the value is what its loop
# does with the chunk). ``j`` is the chunk's row in 0.27.1's per-chunk tensors,
# ``n`` the number of prefills, ``qsl`` the batch's query_start_loc.
FIELD_SOURCES: dict[str, str] = {
    "index": "harness translation: j, the chunk's row in 0.27.1's per-chunk tensors",
    "request_start": "harness translation: 0 (0.27.1's chunks span every prefill of the batch)",
    "request_end": "harness translation: n (0.27.1's per-chunk rows hold one entry per prefill)",
    "token_start": "harness translation: 0 (0.27.1's loop hands every chunk the whole batch's q)",
    "token_end": "harness translation: qsl[n] (as token_start)",
    "continuation_token_end": (
        "harness translation: qsl[1] for chunk 0, qsl[n] for later chunks (its loop merges every later chunk "
        "over all tokens)"
    ),
    "is_continuation": "harness translation: j > 0 (its _compute_prefill_context merges every chunk after the first)",
    "num_context_tokens": f"0.27.1's own ({BUILDER}: chunk_total_token[j], the same as seq_tot[j] without DCP)",
    "query_start_loc": (
        "harness translation: the batch's qsl, which 0.27.1's prefill backend hands every chunk's attention "
        "(run_prefill_context_chunk reads prefill_metadata.query_start_loc)"
    ),
    "max_query_len": "harness translation: the batch's longest query (prefill_metadata.max_query_len)",
    "cu_seq_lens": f"0.27.1's own ({BUILDER}: cu_seq_lens[j])",
    "starts": (
        f"0.27.1's own without DCP ({BUILDER}: starts[j]); under DCP harness translation j * max_seq_lens[0] "
        "(0.27.1 keeps only the local starts there)"
    ),
    "seq_lens": f"0.27.1's own ({BUILDER}: seq_lens[j])",
    "max_seq_len": f"0.27.1's own ({BUILDER}: max_seq_lens[j])",
    "token_to_seq": f"0.27.1's own ({BUILDER}: token_to_seq[j][:chunk_total_token[j]], the rest is row padding)",
    "local_starts": f"0.27.1's own ({BUILDER}: starts[j] under DCP, j * chunk_size)",
    "padded_local_seq_lens": f"0.27.1's own ({BUILDER}: padded_local_chunk_seq_lens[j])",
    "padded_local_cu_seq_lens": f"0.27.1's own ({BUILDER}: padded_local_cu_seq_lens[j])",
    "padded_local_token_to_seq": f"0.27.1's own ({BUILDER}: padded_local_token_to_seq[j][:seq_tot[j]])",
    "local_context_lens_allranks": (
        f"0.27.1's own ({BUILDER}: local_context_lens_allranks, from get_dcp_local_seq_lens; one table for the "
        "batch, repeated in every chunk)"
    ),
    "num_local_context_tokens": f"0.27.1's own ({BUILDER}: seq_tot[j] under DCP)",
    "empty_token_slices": (
        "harness translation: () (0.27.1 keeps zero-context prefills inside its chunks and neutralises their "
        "rows with mask_empty_context)"
    ),
    "workspace_size": f"0.27.1's own ({SIZING})",
}

# The refusal classes, each with its reason (the exception's whole message).
# The DCP loop's failures are named by the source line that fails, so each is a
# class of its own: LOOP_FAILS is their common prefix.
REFUSES = "0.27.1 refuses"
CANNOT_RUN = "0.27.1 cannot run its plan"
REFUSALS: dict[str, str] = {
    "workspace-not-divisible": (
        f"{REFUSES}: chunked_prefill_workspace_size % dcp_world_size != 0 "
        "(its MLACommonMetadataBuilder.__init__ assertion)"
    ),
    "share-zero": f"{REFUSES}: `assert max_context_chunk > 0` fails in its {BUILDER}",
    "share-not-divisible": f"{REFUSES}: `assert max_context_chunk % dcp_world_size == 0` fails in its {BUILDER}",
    "chunk-skipped": (
        f"{CANNOT_RUN}: its {DCP_LOOP} skips a chunk with no local rows (toks == 0) that holds context rows, "
        "dropping them"
    ),
}
LOOP_FAILS = f"{CANNOT_RUN}: its DCP loop fails:"


class LegacyRefusal(Exception):
    """0.27.1 refuses the case or cannot run its plan; the message is one of
    :data:`REFUSALS` or starts with :data:`LOOP_FAILS`. ``oracle.serve`` replies
    to it as a refusal (a class a baseline may name), to anything else as the
    oracle failing."""

    refusal = True


def _ints(tensor: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in (tensor.tolist() if hasattr(tensor, "tolist") else tensor))


def _in_vllm(exc: BaseException) -> bool:
    """``exc`` was raised inside vLLM's own code (its innermost frame is vLLM's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "/vllm/" in frames[-1].filename and bool((frames[-1].line or "").strip())


def _failing_line(exc: BaseException) -> str:
    """``function: `source line``` of the innermost vLLM frame ``exc`` passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename]
    if not frames:
        return f"{type(exc).__name__} outside vLLM"
    frame = frames[-1]
    kind = "" if isinstance(exc, AssertionError) else f" ({type(exc).__name__})"
    return f"{frame.name}: `{(frame.line or '').strip()}`{kind}"


class _UnpinnedTorch:
    """The builder module's ``torch`` with ``pin_memory`` dropped from
    allocations: a CPU-only torch has no pinned allocator, and page-locking
    changes no value."""

    def __init__(self, torch_module: types.ModuleType) -> None:
        self._torch = torch_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def empty(self, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return self._torch.empty(*args, **kwargs)

    def zeros(self, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return self._torch.zeros(*args, **kwargs)


class _StandInDcpGroup:
    """One process standing in for the DCP group: every rank gathers the same
    number of rows (they share the metadata), so the all-gather's result has
    ``world_size`` times the local rows; their values do not matter here."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        return tensor.repeat_interleave(self.world_size, dim=dim) if dim else tensor.repeat(self.world_size, 1)


class _NoDeviceOps:
    """``vllm._custom_ops`` for the DCP feasibility run: the gather writes nothing
    (only the shapes reach an assertion)."""

    def cp_gather_cache(self, **kwargs: Any) -> None:
        return None


class _ShapeOnlyBackend:
    """A prefill backend for the DCP feasibility run: zero partials of the right shapes."""

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module

    def run_prefill_context_chunk(self, chunk_idx: int, q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        tokens, heads = q.shape[0], q.shape[1]
        return self._torch.zeros((tokens, heads, v.shape[-1])), self._torch.zeros((heads, tokens))


class LegacyOracleSide(SparseSideMixin):
    """vllm==0.27.1's equal-share grid, through the installed 0.27.1.

    Implements the same interface as :class:`oracle.side.OracleSide`.
    """

    name = "oracle-0.27.1"

    def __init__(self) -> None:
        self._mla = import_vllm_module(MLA)
        self._torch = import_vllm_module("torch")
        version = import_vllm_module("vllm._version").__version__
        if version != LEGACY_VERSION:
            raise LegacyRefusal(f"the legacy oracle needs vllm=={LEGACY_VERSION}, found {version}")

    # -- L1 -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _cpu_allocations(self) -> Iterator[None]:
        with mock.patch.object(self._mla, "torch", _UnpinnedTorch(self._torch)):
            yield

    def upstream_metadata(self, case: Case, workspace: Any = None) -> Any:
        """0.27.1's ``ChunkedContextMetadata`` for ``case`` (None without context);
        its own assertions become :class:`LegacyRefusal`."""
        torch = self._torch
        if case.dcp_world_size > 1 and case.workspace_size % case.dcp_world_size:
            raise LegacyRefusal(REFUSALS["workspace-not-divisible"])
        try:
            with self._cpu_allocations():
                return self._mla.build_mla_chunked_context_metadata(
                    context_lens_cpu=torch.tensor(case.context_lens, dtype=torch.int32),
                    prefill_query_start_loc_cpu=torch.tensor(case.query_start_loc, dtype=torch.int32),
                    num_prefills=case.num_requests,
                    chunked_prefill_workspace=torch.empty(0) if workspace is None else workspace,
                    chunked_prefill_workspace_size=case.workspace_size,
                    block_size=case.block_size,
                    align_chunk_to_block=case.align_to_block,
                    device=torch.device("cpu") if workspace is None else workspace.device,
                    dcp_world_size=case.dcp_world_size,
                    dcp_local_block_size=case.cp_kv_cache_interleave_size,
                    dcp_virtual_block_size=case.cp_kv_cache_interleave_size * case.dcp_world_size,
                )
        except AssertionError as exc:
            line = _failing_line(exc)
            if not _in_vllm(exc):
                raise
            for key in ("share-zero", "share-not-divisible"):
                # The builder's own assertion, named by its exact source line.
                if line.startswith(f"{BUILDER}: `") and line.removeprefix(f"{BUILDER}: ") in REFUSALS[key]:
                    raise LegacyRefusal(REFUSALS[key]) from None
            raise LegacyRefusal(f"{REFUSES}: {line} in its {BUILDER}") from None

    def plan_layout(self, case: Case, check_loop: bool = True) -> Layout:
        """0.27.1's plan of ``case``; under DCP also its context loop's refusals
        (``check_loop``), which only a batch that runs that loop meets: the
        sparse path runs it on the dense-MHA route alone."""
        metadata = self.upstream_metadata(case)
        if metadata is None:
            return Layout(chunks=())
        if case.dcp_world_size > 1 and check_loop:
            self.check_dcp_loop(case, metadata)
        qsl = tuple(case.query_start_loc)
        n = case.num_requests
        rows = _ints(metadata.chunk_total_token)
        dcp = case.dcp_world_size > 1
        chunks = []
        for j, seq_tot in enumerate(metadata.seq_tot):
            starts = _ints(metadata.starts[j])
            local: dict[str, Any] = {}
            if dcp:
                local = {
                    "local_starts": starts,
                    "padded_local_seq_lens": tuple(int(v) for v in metadata.padded_local_chunk_seq_lens[j]),
                    "padded_local_cu_seq_lens": _ints(metadata.padded_local_cu_seq_lens[j]),
                    "padded_local_token_to_seq": _ints(metadata.padded_local_token_to_seq[j][:seq_tot]),
                    "local_context_lens_allranks": tuple(
                        tuple(int(v) for v in ranks) for ranks in metadata.local_context_lens_allranks
                    ),
                    "num_local_context_tokens": int(seq_tot),
                }
                # 0.27.1 keeps only local starts under DCP; every later chunk starts
                # its window at j * max_context_chunk, chunk 0's longest span.
                starts = tuple([j * int(metadata.max_seq_lens[0])] * n)
            chunks.append(
                Chunk(
                    index=j,
                    request_start=0,
                    request_end=n,
                    token_start=0,
                    token_end=qsl[n],
                    continuation_token_end=qsl[n] if j else qsl[1],
                    is_continuation=j > 0,
                    num_context_tokens=rows[j],
                    query_start_loc=qsl,
                    max_query_len=max(case.query_lens),
                    cu_seq_lens=_ints(metadata.cu_seq_lens[j]),
                    starts=starts,
                    seq_lens=_ints(metadata.seq_lens[j]),
                    max_seq_len=int(metadata.max_seq_lens[j]),
                    token_to_seq=_ints(metadata.token_to_seq[j][: rows[j]]),
                    **local,
                )
            )
        return Layout(chunks=tuple(chunks))

    def check_dcp_loop(self, case: Case, metadata: Any) -> None:
        """Run 0.27.1's own DCP context loop over its plan with only the
        gather, the all-gather and the attention stood in for (shapes, no
        values); raise :class:`LegacyRefusal` where it fails or silently
        drops a chunk."""
        torch, mla = self._torch, self._mla
        world = case.dcp_world_size
        latent = 2  # kv_lora_rank 1 + qk_rope_head_dim 1: the narrowest rows its split accepts
        # Its builder's __init__ allocates W + W // D rows under DCP: W / D for the
        # local gather, W for the all-gather.
        workspace = torch.empty((case.workspace_size + case.workspace_size // world, latent))
        metadata = self.upstream_metadata(case, workspace)
        query_start_loc = torch.tensor(case.query_start_loc, dtype=torch.int32)
        prefill = mla.MLACommonPrefillMetadata(
            block_table=torch.zeros((case.num_requests, 1), dtype=torch.int32),
            query_start_loc=query_start_loc,
            max_query_len=max(case.query_lens),
            chunked_context=metadata,
            q_data_type=torch.float32,
            prefill_backend=_ShapeOnlyBackend(torch),
        )
        weight = torch.zeros((2, 1))
        impl = SimpleNamespace(
            kv_cache_dtype="auto",
            kv_lora_rank=1,
            qk_rope_head_dim=1,
            num_heads=1,
            qk_nope_head_dim=1,
            v_head_dim=1,
            kv_b_proj=_ZeroProjection(torch, weight),
            _use_flashinfer_concat_mla_k=False,
        )
        base = mla.MLACommonBaseImpl
        impl._concat_k_nope_k_pe = types.MethodType(base._concat_k_nope_k_pe, impl)
        attn_metadata = SimpleNamespace(prefill=prefill, num_prefills=case.num_requests)
        q = torch.zeros((case.query_start_loc[-1], 1, 2))
        cache = torch.zeros((1, case.block_size, latent))
        try:
            with (
                mock.patch.object(mla, "ops", _NoDeviceOps()),
                mock.patch.object(mla, "get_dcp_group", lambda: _StandInDcpGroup(world)),
                mock.patch.object(mla, "mask_empty_context", lambda *args, **kwargs: None),
                mock.patch.object(mla, "merge_attn_states", lambda **kwargs: None),
            ):
                base._context_parallel_compute_prefill_context(
                    impl, q, cache, attn_metadata, torch.ones(()), dcp_world_size=world
                )
        except AssertionError as exc:
            # Only 0.27.1's own assertion is its loop refusing; anything else
            # (a stand-in's shape error included) is the harness failing, and says so.
            if not _in_vllm(exc):
                raise
            raise LegacyRefusal(f"{LOOP_FAILS} {_failing_line(exc)}") from None
        # Its loop ran through; a chunk it skipped for having no local rows
        # would still have held context rows (dropped without an error).
        for seq_tot, rows in zip(metadata.seq_tot, metadata.chunk_total_token, strict=True):
            if seq_tot == 0 and int(rows) > 0:
                raise LegacyRefusal(REFUSALS["chunk-skipped"])

    def workspace_size(self, config: WorkspaceConfig) -> int:
        """0.27.1's own sizing; its builder's DCP assertion on the result is
        checked where a case is planned, not here (the sizing function has none)."""
        from oracle.vllm_config import workspace_vllm_config

        sizing = self._mla.MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size
        return int(sizing(workspace_vllm_config(config)))

    # -- L2, L3 ---------------------------------------------------------------------------

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """L2: 0.27.1's ``merge_attn_states`` and its Triton kernel."""
        from oracle.numeric import merge_states

        return merge_states(inputs)

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        """L3: 0.27.1's ``forward_mha`` on the shared kernels (under DCP on every rank's cache)."""
        return legacy_prefill(self, case, inputs, kernels)


class _ZeroProjection:
    """``kv_b_proj`` for the DCP feasibility run: zeros of the up-projected width."""

    def __init__(self, torch_module: Any, weight: Any) -> None:
        self._torch, self.weight = torch_module, weight
        self.params_dtype = weight.dtype

    def __call__(self, x: Any) -> tuple[Any, None]:
        return self._torch.zeros((x.shape[0], self.weight.shape[0])), None
