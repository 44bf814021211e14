"""The sparse MLA path's oracle: the installed release's own sparse backend, called.

Every value of a :class:`~harness.model.sparse.SparseLayout` and every L2 tensor
comes from the release's own functions (module
``vllm.model_executor.layers.attention.sparse_mla_attention``, ``SPARSE``):

- the workspace size: ``SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``;
- the chunks: the release's side (:class:`oracle.side.OracleSide` or
  :class:`oracle.legacy.LegacyOracleSide`) planning the batch into that workspace;
- ``masked_threshold``: ``_use_masked_mha``; ``masks_fit``:
  ``SparseMLACommonImpl.masked_mha_workspace_fits`` on the release's own chunk
  metadata (0.27.1 has no such check: None);
- the global mask's shape and verdict: ``_try_build_global_mask`` on a
  stand-in workspace whose ``numel()`` is the case's mask workspace and whose
  view records the shape it is asked for (0.27.1 checks a module constant, 64
  MiB, instead of the workspace; its shape is read with that constant raised);
- the suffix's and each chunk's per-range mask shapes: ``_run_masked_mha``,
  called as the release's own loop calls it, up to the view of the workspace;
- L2: ``_run_masked_mha`` building the mask for real (``_build_topk_mask``,
  its Triton kernels interpreted; the global form through
  ``_try_build_global_mask`` and the key-starts copy), with
  ``flash_attn_varlen_func`` stood in for by a function that keeps the mask it
  is handed; ``_remap_topk_to_ranges`` for the remap.

Two pieces are the harness's translation of upstream code that is not a
function of its own, and say so: the builder's ``use_dense_mha`` flag
(``SparseMLACommonMetadataBuilder.build``) and the route's conjunctions
(``MLAAttention.forward_impl`` and ``SparseMLACommonImpl.forward_mha``), each
transcribed beside its source below. The masked kernel module and
``vllm.vllm_flash_attn`` cannot be imported without CUDA; stand-ins replace
them in ``sys.modules`` for the duration of a call.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from unittest import mock

from harness.model import PRESETS, Case, Layout
from harness.model.sparse import Shape, SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase
from oracle.environment import import_vllm_module, stood_in_modules

if TYPE_CHECKING:
    import torch

SPARSE = "vllm.model_executor.layers.attention.sparse_mla_attention"
MASK_MODULE = "vllm.model_executor.layers.attention.sparse_mla_mask"
FLASH_MODULE = "vllm.vllm_flash_attn"
# The model the sparse path stands for, DeepSeek-V3.2, whose MLA heads are V3's
# (qk 128 + 64, v 128): the route's threshold table is for it (section 1d).
DSV32_HEADS = PRESETS["deepseek-v3"]
# Beyond any mask a case can ask for: the probe's numel when only a shape is wanted.
_UNBOUNDED = 1 << 62


class _ShapeAsked(Exception):
    """Raised by the workspace probe's view: the shape upstream asked for."""

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        self.shape = shape


class _ViewFails(Exception):
    """Raised by the workspace probe where torch's ``view`` would fail: the slice
    holds fewer words than the shape asked for (0.27.1 never checks first)."""


class _WorkspaceProbe:
    """A mask workspace of ``words`` int32 words that allocates nothing: a slice
    ``[:n]`` holds ``min(n, words)`` of them, and its ``view`` raises
    :class:`_ShapeAsked` with the requested shape, or :class:`_ViewFails` when
    the slice is too short for it (as torch's view would)."""

    def __init__(self, words: int) -> None:
        self.words = words

    def numel(self) -> int:
        return self.words

    def __getitem__(self, key: slice) -> _WorkspaceProbe:
        return _WorkspaceProbe(min(self.words, key.stop if key.stop is not None else self.words))

    def view(self, *shape: int) -> Any:
        asked = (int(shape[0]), int(shape[1]), int(shape[2]))
        if asked[0] * asked[1] * asked[2] != self.words:
            raise _ViewFails(asked)
        raise _ShapeAsked(asked)


class _KeptMask(Exception):
    """Raised by the stand-in attention: the mask ``_run_masked_mha`` handed it."""

    def __init__(self, mask: Any) -> None:
        super().__init__("mask")
        self.mask = mask


def _stand_in_attention(**kwargs: Any) -> Any:
    raise _KeptMask(kwargs["aux_tensors"][0])


@contextlib.contextmanager
def _without_cuda_modules() -> Iterator[None]:
    """The masked kernel's mask functions and the CUDA flash-attention module,
    stood in for: ``_run_masked_mha`` imports both before it builds a mask."""
    mask_module = types.ModuleType(MASK_MODULE)
    mask_module.dense_mask_mod = "dense_mask_mod"  # type: ignore[attr-defined]
    mask_module.offset_dense_mask_mod = "offset_dense_mask_mod"  # type: ignore[attr-defined]
    flash_module = types.ModuleType(FLASH_MODULE)
    flash_module.flash_attn_varlen_func = _stand_in_attention  # type: ignore[attr-defined]
    with stood_in_modules({MASK_MODULE: mask_module, FLASH_MODULE: flash_module}):
        yield


class SparseOracle:
    """The sparse backend of the release ``side`` runs (0.28.0 or 0.27.1).

    ``side`` is the release's dense oracle side: its ``plan_layout`` and
    ``upstream_metadata`` plan a :class:`~harness.model.Case`.
    """

    def __init__(self, side: Any) -> None:
        self.side = side
        self.sparse = import_vllm_module(SPARSE)
        self.mla = import_vllm_module("vllm.model_executor.layers.attention.mla_attention")
        self.torch = import_vllm_module("torch")
        # 0.27.1 predates the shared shape function and the fit check.
        self.legacy = not hasattr(self.sparse, "_topk_mask_shape")

    # -- L1 ---------------------------------------------------------------------------------

    def workspace_size(self, config: SparseWorkspaceConfig) -> int:
        from oracle.vllm_config import workspace_vllm_config

        vllm_config = workspace_vllm_config(config)  # type: ignore[arg-type]
        # The model's config, where index_topk lives: 0.27.1 and 0.28.0 read it as
        # ``hf_config``, 0.33.0 as ``hf_text_config`` (the text model's, the same object here).
        hf_config = SimpleNamespace(index_topk=config.index_topk)
        vllm_config.model_config.hf_config = vllm_config.model_config.hf_text_config = hf_config
        sizing = self.sparse.SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size
        return int(sizing(vllm_config))

    def _per_range_shape(
        self, q_lens: list[int], max_query_len: int, max_key_len: int, words: int = _UNBOUNDED
    ) -> Shape:
        """The view ``_run_masked_mha`` takes of a ``words``-word mask workspace for
        a per-range mask; raises :class:`_ViewFails` or the release's own error
        where the mask does not fit."""
        impl = self.sparse.SparseMLACommonImpl
        try:
            with _without_cuda_modules():
                impl._run_masked_mha(
                    SimpleNamespace(scale=1.0),
                    q=None,
                    k=None,
                    v=None,
                    cu_seqlens_q=None,
                    cu_seqlens_k=None,
                    max_seqlen_q=max_query_len,
                    max_seqlen_k=max_key_len,
                    topk_per_req=[],
                    q_lens=q_lens,
                    causal=False,
                    topk_mask_workspace=_WorkspaceProbe(words),
                )
        except _ShapeAsked as asked:
            return asked.shape
        raise RuntimeError("_run_masked_mha built no per-range mask view")

    def _overflows(self, calls: list[tuple[list[int], int, int]], words: int) -> bool:
        """Whether any of these ``_run_masked_mha`` calls (q_lens, max query, max
        keys) fails for want of mask workspace: 0.28.0 raises its ValueError
        ("needs N int32 words"), 0.27.1's view of a short slice fails."""
        for q_lens, max_query, max_keys in calls:
            try:
                self._per_range_shape(q_lens, max_query, max_keys, words)
            except _ViewFails:
                return True
            except ValueError as exc:
                if "int32 words" not in str(exc):
                    raise
                return True
        return False

    def _global_mask(
        self, q_lens: list[int], max_query_len: int, max_seq_len: int, words: int
    ) -> tuple[Shape, bool, bool]:
        """``_try_build_global_mask``'s shape and verdict for a ``words``-word
        workspace, and whether its view of that workspace fails (0.27.1 checks a
        fixed 64 MiB, then views the workspace it was given unchecked)."""
        build = self.sparse.SparseMLACommonImpl._try_build_global_mask

        def attempt(workspace_words: int) -> Shape | bool | None:
            try:
                found = build([], q_lens, max_query_len, max_seq_len, _WorkspaceProbe(workspace_words))
            except _ShapeAsked as asked:
                return asked.shape
            except _ViewFails:
                return False
            if found is not None:
                raise RuntimeError("_try_build_global_mask returned a mask from a probe")
            return None

        if self.legacy:
            with mock.patch.object(self.sparse, "GLOBAL_TOPK_MASK_MAX_BYTES", _UNBOUNDED):
                shape = attempt(_UNBOUNDED)
        else:
            shape = attempt(_UNBOUNDED)
        verdict = attempt(words)
        if not isinstance(shape, tuple):
            raise RuntimeError("_try_build_global_mask refused an unbounded workspace")
        return shape, verdict is not None, verdict is False

    def _threshold_model(self, has_context: bool) -> dict[str, Any]:
        """What a later release's ``_use_masked_mha`` also asks (0.33.0: the model's
        head dimensions, its table keyed by them, and whether the batch has context,
        ``prefill.chunked_context is not None`` in ``MLAAttention._use_sparse_mha``);
        nothing for a release whose table is DeepSeek-V3.2's alone (0.27.1, 0.28.0:
        ``_DSV32_MASKED_MHA_THRESHOLDS``). The model is DeepSeek-V3.2's, as that
        table's: its MLA heads (:data:`DSV32_HEADS`), whatever a numeric case's
        scaled-down tensors are."""
        asked = inspect.signature(self.mla._use_masked_mha).parameters
        model = {
            "qk_head_dim": DSV32_HEADS.qk_head_dim,
            "v_head_dim": DSV32_HEADS.v_head_dim,
            "has_context": has_context,
        }
        return {name: value for name, value in model.items() if name in asked}

    def plan(self, case: SparseCase) -> SparseLayout:
        torch = self.torch
        workspace = self.workspace_size(case.workspace_config)
        planned: Case = case.planned_case(workspace)
        metadata = self.side.upstream_metadata(planned) if any(case.context_lens) else None
        # 0.27.1's DCP context loop runs on the dense-MHA route only: its refusals are checked there (below).
        layout: Layout = Layout(chunks=())
        if metadata is not None:
            layout = self.side.plan_layout(planned, check_loop=False) if self.legacy else self.side.plan_layout(planned)
        q_lens = list(case.query_lens)
        max_query = max(q_lens)
        # SparseMLACommonMetadataBuilder.build: prefill_max_seq_len is the
        # longest seq_lens_cpu entry of the prefills (context plus new tokens).
        max_seq = max(c + q for c, q in zip(case.context_lens, case.query_lens, strict=True))
        mask_words = self._mask_words(case)
        # SparseMLACommonMetadataBuilder.build:
        #   use_dense_mha = prefill_max_seq_len <= self.topk_tokens and not sparse_mla_force_mqa
        use_dense = max_seq <= case.index_topk and not case.force_mqa
        threshold = bool(
            self.mla._use_masked_mha(
                backend_name=case.backend,
                tensor_parallel_size=case.tensor_parallel_size,
                query_len=max_query,
                seq_len=max_seq,
                **self._threshold_model(metadata is not None),
            )
        )
        fits: bool | None = None
        if not self.legacy:
            prefill = SimpleNamespace(
                topk_mask_workspace=_WorkspaceProbe(mask_words) if case.masked_kernel else None,
                query_lens_cpu=torch.tensor(q_lens, dtype=torch.int32),
                max_query_len=max_query,
                chunked_context=metadata,
            )
            fits = bool(self.sparse.SparseMLACommonImpl.masked_mha_workspace_fits(prefill))
        # MLAAttention.forward_impl (prefill_backend is not None: a backend exists):
        #   use_masked_mha = masked_mha_available and dcp_world_size <= 1 and _use_masked_mha(...)
        #                    [0.28.0: and masked_mha_workspace_fits(prefill)]
        #   use_mha = (use_dense_mha or use_masked_mha) and not sparse_mla_force_mqa
        use_masked = case.masked_kernel and case.dcp_world_size <= 1 and threshold and (fits is not False)
        route = "mqa"
        if (use_dense or use_masked) and not case.force_mqa:
            # SparseMLACommonImpl.forward_mha: dense when forced, or when
            # prefill_max_seq_len <= topk_tokens and masked is not forced; the
            # masked path asserts masked_mha_available.
            dense = case.force_dense_mha or (max_seq <= case.index_topk and not case.force_masked_mha)
            route = "dense-mha" if dense else ("masked-mha" if case.masked_kernel else "masked-mha-unavailable")
        if self.legacy and route == "dense-mha" and metadata is not None and case.dcp_world_size > 1:
            self.side.check_dcp_loop(planned, metadata)
        global_shape: Shape | None = None
        global_fits: bool | None = None
        global_view_fails = False
        if metadata is not None:
            global_shape, global_fits, global_view_fails = self._global_mask(q_lens, max_query, max_seq, mask_words)
        suffix_call = (q_lens, max_query, max_query)
        chunk_calls = [self._chunk_call(q_lens, max_query, c) for c in layout.chunks]
        if global_shape is not None and global_fits:
            suffix_shape = global_shape
            # _compute_context_mha: 0.28.0 reads dense_mask[chunk.request_slice];
            # 0.27.1 hands every chunk the whole mask.
            chunk_shapes = tuple(
                (len(q_lens) if self.legacy else c.request_end - c.request_start, global_shape[1], global_shape[2])
                for c in layout.chunks
            )
            suffix_fails, chunk_calls = global_view_fails, []
        else:
            suffix_shape = self._per_range_shape(*suffix_call)
            chunk_shapes = tuple(self._per_range_shape(*call) for call in chunk_calls)
            suffix_fails = self._overflows([suffix_call], mask_words)
        if route == "masked-mha":
            # forward_mha's order: the global mask's build, the suffix's run, then
            # _compute_context_mha (its DCP refusal, then each chunk's run); the
            # first that fails decides.
            if suffix_fails:
                route = "masked-mha-overflow"
            elif metadata is not None and self._context_loop_refuses(case.dcp_world_size):
                route = "masked-mha-unavailable"
            elif self._overflows(chunk_calls, mask_words):
                route = "masked-mha-overflow"
        return SparseLayout(
            workspace_size=workspace,
            layout=layout,
            prefill_max_query_len=max_query,
            prefill_max_seq_len=max_seq,
            use_dense_mha=use_dense,
            masked_threshold=threshold,
            masks_fit=fits,
            use_masked_mha=use_masked,
            route=route,
            global_mask_shape=global_shape,
            global_mask_fits=global_fits,
            suffix_mask_shape=suffix_shape,
            chunk_mask_shapes=chunk_shapes,
        )

    def _context_loop_refuses(self, dcp_world_size: int) -> bool:
        """Whether ``_compute_context_mha`` refuses to run (it raises
        NotImplementedError under decode context parallelism), called on a batch
        of no chunks so that nothing past its own checks runs."""
        # No chunks in either release's form (0.28.0 walks chunks, 0.27.1 seq_tot).
        chunked = SimpleNamespace(chunks=[], seq_tot=[], workspace=None, empty_token_slices=[])
        try:
            self.sparse.SparseMLACommonImpl._compute_context_mha(
                SimpleNamespace(dcp_world_size=dcp_world_size),
                q=None,
                kv_c_and_k_pe_cache=None,
                prefill_metadata=SimpleNamespace(chunked_context=chunked),
                k_scale=None,
                q_lens=[],
                topk_per_req=[],
            )
        except NotImplementedError:
            return True
        except AssertionError:
            return False  # past its checks: a loop of no chunks leaves no partial
        raise RuntimeError("_compute_context_mha ran a loop of no chunks to the end")

    def _mask_words(self, case: SparseCase) -> int:
        """The mask workspace: none without the masked kernel (upstream allocates
        none), else the case's, or the release's own (its GLOBAL_TOPK_MASK_MAX_BYTES)."""
        if not case.masked_kernel:
            return 0
        if case.mask_workspace_words is None:
            return int(self.sparse.GLOBAL_TOPK_MASK_MAX_BYTES) // 4
        return case.mask_workspace_words

    def _chunk_call(self, q_lens: list[int], max_query: int, chunk: Any) -> tuple[list[int], int, int]:
        """``_compute_context_mha``'s per-range call for ``chunk``: 0.28.0 passes the
        chunk's own requests and query maximum, 0.27.1 every request and the batch's."""
        if self.legacy:
            return q_lens, max_query, chunk.max_seq_len
        return q_lens[chunk.request_start : chunk.request_end], chunk.max_query_len, chunk.max_seq_len

    # -- L2 ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _host_tensors(self) -> Iterator[None]:
        """0.27.1's ``np_to_pinned_tensor`` pins host memory, which a CPU-only
        torch cannot allocate; the same values in plain host memory stand in
        (0.28.0's version already skips pinning where it cannot pin)."""
        if not self.legacy:
            yield
            return
        torch = self.torch
        with mock.patch.object(self.sparse, "np_to_pinned_tensor", lambda array: torch.from_numpy(array.copy())):
            yield

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        torch = self.torch
        impl = self.sparse.SparseMLACommonImpl
        q_lens = [int(t.shape[0]) for t in topk]
        max_query, max_keys = max(q_lens), max(case.seq_lens)
        # Room for any shape the release may ask for (rows padded to 256, one spare word).
        room = len(q_lens) * (-(-max_query // 256) * 256 + 256) * (-(-max_keys // 32) + 1)
        workspace = torch.zeros(room, dtype=torch.int32)
        dense_mask = None
        key_starts = None
        if case.form == "global":
            with self._host_tensors():
                dense_mask = impl._try_build_global_mask(topk, q_lens, max_query, max_keys, workspace)
            if dense_mask is None:
                raise RuntimeError(f"the release's global mask does not fit for {case.name}")
            key_starts = torch.tensor(case.key_starts or [0] * len(q_lens), dtype=torch.int32)
        try:
            with _without_cuda_modules(), self._host_tensors():
                impl._run_masked_mha(
                    SimpleNamespace(scale=1.0),
                    q=None,
                    k=None,
                    v=None,
                    cu_seqlens_q=None,
                    cu_seqlens_k=None,
                    max_seqlen_q=max_query,
                    max_seqlen_k=max_keys,
                    topk_per_req=topk,
                    q_lens=q_lens,
                    causal=False,
                    dense_mask=dense_mask,
                    key_starts=key_starts,
                    topk_mask_workspace=workspace,
                )
        except _KeptMask as kept:
            return kept.mask.clone()  # type: ignore[no-any-return]
        raise RuntimeError("_run_masked_mha never reached the attention call")

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        remap = self.sparse.SparseMLACommonImpl._remap_topk_to_ranges
        return [t.clone() for t in remap(topk, list(case.range_starts), list(case.range_lens))]
