"""The shared kernels: the device work both sides run, on identical inputs.
This package: the interface and its CPU and CUDA sets here; the L3 inputs and
the context loop's steps in :mod:`.numeric` and :mod:`.context_chunks`; the
masked (sparse) kernel in :mod:`.masked_attention` and the sparse L3 inputs in
:mod:`.sparse_prefill`. Imports: the data model only; ports may import it.

The oracle's context loop and every port's call these same functions for the
paged gather, the up-projection (``kv_b_proj``) and attention, so when two sides'
bits differ the difference lies in their planning or merging, never here.

:class:`SharedKernels` is the interface; :class:`CpuKernels` fills it with plain
PyTorch (fp32 accumulation, one request at a time, so results depend only on
the inputs and the call's shapes); :class:`CudaKernels` fills it on the GPU
with FlashAttention-2's varlen operator and cuBLAS. ``--device`` picks one
(:func:`kernels_for`); both sides of a comparison always get the same object.

Rows without keys. A query row that sees no key has no defined attention, and
real prefill backends disagree on what they report for it (SPEC 1a, seeds/003);
the legacy grid hands them such rows and must neutralise them before merging.
Both kernel sets take the behaviour as ``keyless_rows`` (one of
:data:`~harness.model.KEYLESS_ROWS`): ``"neg-inf"`` output 0 and LSE -inf (the
default, the ideal), ``"pos-inf"`` output 0 and LSE +inf (FlashAttention), or
``"finite"``: LSE :data:`KEYLESS_FINITE_LSE` and output
:data:`KEYLESS_FINITE_OUTPUT`, a stand-in for undefined memory. A case picks its
behaviour in its ``numeric`` section; the runner hands both sides the kernels
:func:`kernels_for_case` returns, so they always run under the same one.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Protocol

import torch

from harness.kernels import masked_attention
from harness.kernels.masked_attention import Selection, masked_reference_attention
from harness.model import KEYLESS_ROWS

if TYPE_CHECKING:
    from harness.model import Case

# "finite": the LSE log(1) = 0, as though the row had seen one key of score 0,
# which sits among the real LSEs of these cases, so an un-neutralised row takes a
# real share of a merge (seeds/003's corruption); the output a fixed 1024, exact
# in bf16, fp16 and fp32, far from any real attention output, and finite (NaN
# would be reported as a port fault, not as the wrong numbers it stands for).
KEYLESS_FINITE_LSE = 0.0
KEYLESS_FINITE_OUTPUT = 1024.0


class SharedKernels(Protocol):
    def gather(
        self,
        kv_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        token_to_seq: torch.Tensor,
        starts: torch.Tensor,
        num_rows: int,
    ) -> None:
        """Fill ``dst[:num_rows]`` from the paged cache.

        Row ``i`` belongs to request ``s = token_to_seq[i]`` (chunk-local, indexing
        ``block_table`` and ``starts``) at context position
        ``p = starts[s] + i - cu_seq_lens[s]``, stored at
        ``kv_cache[block_table[s, p // block_size], p % block_size]``.
        """
        ...

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """``latent @ weight.T``: ``[rows, kv_lora_rank]`` to ``[rows, heads * (nope + v)]``."""
        ...

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Varlen attention with LSE.

        ``q``: ``[tokens, heads, qk]``, ``k``: ``[rows, heads, qk]``, ``v``:
        ``[rows, heads, v_dim]``; sequence ``i`` is ``q[cu_q[i]:cu_q[i+1]]`` against
        ``k[cu_k[i]:cu_k[i+1]]``. Causal masking is bottom-right aligned (the last
        query sees every key). Returns the output ``[tokens, heads, v_dim]`` in
        ``q.dtype`` and the LSE ``[heads, tokens]`` in fp32. A query that sees no
        key (its sequence has none, or causal masking hides them all) gets what
        the kernels' ``keyless_rows`` behaviour says: output 0 and LSE -inf by
        default (see the module docstring).
        """
        ...

    def masked_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        selection: Selection,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attention` with each query row restricted to the keys its top-k
        ``selection`` names (:mod:`harness.kernels.masked_attention`: per-range indices or
        a packed mask with key starts, the same bits for the same selection). A
        row that sees no key gets the ``keyless_rows`` behaviour."""
        ...


def paged_gather(
    kv_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    starts: torch.Tensor,
    num_rows: int,
) -> None:
    """The gather of :meth:`SharedKernels.gather` in tensor indexing, on any device
    (no host synchronisation: every index is computed where the cache lives)."""
    if num_rows == 0:
        return
    block_size = kv_cache.shape[1]
    seq = token_to_seq[:num_rows].long()
    rows = torch.arange(num_rows, device=kv_cache.device)
    position = starts.long()[seq] + rows - cu_seq_lens.long()[seq]
    block = block_table.long()[seq, position // block_size]
    dst[:num_rows] = kv_cache[block, position % block_size]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`SharedKernels.attention` one sequence at a time in fp32 einsum."""
    tokens, heads, _ = q.shape
    out = torch.zeros((tokens, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=q.device)
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    for i in range(len(q_bounds) - 1):
        q0, q1 = q_bounds[i], q_bounds[i + 1]
        k0, k1 = k_bounds[i], k_bounds[i + 1]
        if q1 == q0 or k1 == k0:
            continue
        scores = torch.einsum("thd,shd->hts", q[q0:q1].float(), k[k0:k1].float()) * scale
        if causal:
            # Bottom-right aligned: query t of n sees keys up to t + (m - n).
            offset = (k1 - k0) - (q1 - q0)
            visible = torch.ones((q1 - q0, k1 - k0), dtype=torch.bool, device=q.device).tril(offset)
            scores = scores.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hts,shd->thd", weights, v[k0:k1].float()).to(q.dtype)
        lse[:, q0:q1] = row_lse
    return out, lse


def check_keyless_rows(behaviour: str) -> str:
    if behaviour not in KEYLESS_ROWS:
        raise ValueError(f"unknown keyless-row behaviour {behaviour!r} (one of {', '.join(KEYLESS_ROWS)})")
    return behaviour


def keyless_query_rows(cu_q: torch.Tensor, cu_k: torch.Tensor, causal: bool, tokens: int) -> torch.Tensor:
    """A ``[tokens]`` bool mask, on ``cu_q``'s device, of the query rows that see
    no key: their sequence has none, or (causal, bottom-right aligned) query
    ``t`` of ``n`` over ``m`` keys with ``t + m - n < 0``. ``cu_q[-1]`` must be
    ``tokens``; no host synchronisation."""
    q_lens = (cu_q[1:] - cu_q[:-1]).long()
    k_lens = (cu_k[1:] - cu_k[:-1]).long().to(cu_q.device)
    seq = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=cu_q.device), q_lens, output_size=tokens)
    if not causal:
        return k_lens[seq] == 0
    position = torch.arange(tokens, device=cu_q.device) - cu_q.long()[seq]
    return position + k_lens[seq] - q_lens[seq] < 0


def report_keyless_rows(
    out: torch.Tensor, lse: torch.Tensor, keyless: torch.Tensor, behaviour: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` ``[tokens, heads, v]`` and ``lse`` ``[heads, tokens]`` with the
    ``keyless`` rows set as ``behaviour`` says; every other row untouched."""
    keyless = keyless.to(out.device)
    if behaviour == "finite":
        fill_out, fill_lse = KEYLESS_FINITE_OUTPUT, KEYLESS_FINITE_LSE
    else:
        fill_out, fill_lse = 0.0, float("-inf") if behaviour == "neg-inf" else float("inf")
    return out.masked_fill(keyless[:, None, None], fill_out), lse.masked_fill(keyless[None, :], fill_lse)


def masked_attention_reporting_keyless(
    kernels: CpuKernels | CudaKernels,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
    selection: Selection,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`SharedKernels.masked_attention` of the two kernel sets: the
    reference (:func:`masked_reference_attention`), keyless rows as
    ``kernels.keyless_rows`` says."""
    out, lse, keyless = masked_reference_attention(q, k, v, cu_q, cu_k, causal, scale, selection)
    return report_keyless_rows(out, lse, keyless, kernels.keyless_rows)


class CpuKernels:
    """Plain PyTorch: fp32 accumulation, one request at a time; rows without keys
    as ``keyless_rows`` says (module docstring)."""

    name = "cpu"

    # One gather for both devices: it is indexing, exact wherever it runs.
    gather = staticmethod(paged_gather)

    def __init__(self, keyless_rows: str = "neg-inf") -> None:
        self.keyless_rows = check_keyless_rows(keyless_rows)

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return (latent.float() @ weight.float().T).to(latent.dtype)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = reference_attention(q, k, v, cu_q, cu_k, causal, scale)
        if self.keyless_rows == "neg-inf":
            return out, lse  # the reference already reports (0, -inf) there
        return report_keyless_rows(out, lse, keyless_query_rows(cu_q, cu_k, causal, q.shape[0]), self.keyless_rows)

    # The reference on whatever device the tensors are (deterministic).
    masked_attention = masked_attention_reporting_keyless


# FlashAttention-2 (PyTorch's own varlen operator) takes these; anything else
# goes to the reference attention on the same device.
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


class CudaKernels:
    """The GPU: tensor-indexing gather, cuBLAS projection in the cache's dtype,
    and FlashAttention-2 varlen (``aten::_flash_attention_forward``) with LSE.

    FlashAttention wants one head size for q, k and v: all three are zero-padded
    to ``round_up(max(qk, v), 8)`` (zeros add exact zeros to every dot product)
    and the output is cut back to ``v``'s width. Every input is made contiguous
    first, so two callers that hand over the same values in different strides get
    the same bits. A query row without keys gets what ``keyless_rows`` says
    (module docstring), whichever path computed it: FlashAttention reports +inf
    there, the reference and the empty shortcut -inf, and every path is masked
    to the selected behaviour.
    """

    name = "cuda"

    # One gather for both devices: it is indexing, exact wherever it runs.
    gather = staticmethod(paged_gather)

    def __init__(self, keyless_rows: str = "neg-inf") -> None:
        self.keyless_rows = check_keyless_rows(keyless_rows)

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return latent.contiguous() @ weight.T

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = -(-max(q.shape[-1], v.shape[-1]) // 8) * 8
        tokens, heads, v_dim = q.shape[0], q.shape[1], v.shape[-1]
        if q.dtype not in FLASH_DTYPES or width > FLASH_MAX_HEAD_DIM:
            out, lse = reference_attention(q, k, v, cu_q, cu_k, causal, scale)
        elif tokens == 0 or k.shape[0] == 0:
            out = torch.zeros((tokens, heads, v_dim), dtype=q.dtype, device=q.device)
            lse = torch.full((heads, tokens), float("-inf"), dtype=torch.float32, device=q.device)
        else:
            if max_q is None or max_k is None:
                max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
            padded = [torch.nn.functional.pad(t.contiguous(), (0, width - t.shape[-1])) for t in (q, k, v)]
            cu_q32, cu_k32 = cu_q.to(torch.int32).contiguous(), cu_k.to(torch.int32).contiguous()
            out, lse, *_ = torch.ops.aten._flash_attention_forward(
                *padded, cu_q32, cu_k32, max_q, max_k, 0.0, causal, False, scale=scale
            )
            out, lse = out[..., :v_dim], unpadded_lse(lse, cu_q32, tokens)
        # Rows without keys as selected, whichever path computed them.
        keyless = keyless_query_rows(cu_q.to(q.device), cu_k.to(q.device), causal, tokens)
        out, lse = report_keyless_rows(out, lse, keyless, self.keyless_rows)
        return out.contiguous(), lse.contiguous()

    # The reference on the GPU: deterministic, and the same meaning as FA4's mask.
    masked_attention = masked_attention_reporting_keyless


def unpadded_lse(lse: torch.Tensor, cu_q: torch.Tensor, tokens: int) -> torch.Tensor:
    """FlashAttention's LSE as ``[heads, tokens]`` fp32.

    Its varlen forward reports ``[heads, tokens]`` in recent builds and
    ``[batch, heads, max_q]`` (padded per sequence) in older ones.
    """
    if lse.dim() == 2:
        return lse.float()
    batch = lse.shape[0]
    lens = cu_q[1:] - cu_q[:-1]
    seq = torch.repeat_interleave(torch.arange(batch, device=lse.device), lens, output_size=tokens)
    position = torch.arange(tokens, device=lse.device) - cu_q.long()[seq]
    return lse[seq, :, position].transpose(0, 1).float()


def kernels_for(device: str, keyless_rows: str = "neg-inf") -> SharedKernels:
    """The shared kernels for ``"cpu"`` or ``"cuda"``."""
    if device == "cuda":
        return CudaKernels(keyless_rows)
    if device == "cpu":
        return CpuKernels(keyless_rows)
    raise ValueError(f"unknown device {device!r} (cpu or cuda)")


class KeylessRowsKernels:
    """Any :class:`SharedKernels` with its attention's report on rows without
    keys replaced by ``keyless_rows`` (every other row, the gather and the
    projection are the inner kernels' own): for kernel sets other than
    :class:`CpuKernels` and :class:`CudaKernels`, which take the behaviour
    themselves."""

    def __init__(self, inner: SharedKernels, keyless_rows: str) -> None:
        self.inner, self.keyless_rows = inner, check_keyless_rows(keyless_rows)
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}+keyless-{keyless_rows}"

    def gather(
        self,
        kv_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        token_to_seq: torch.Tensor,
        starts: torch.Tensor,
        num_rows: int,
    ) -> None:
        self.inner.gather(kv_cache, dst, block_table, cu_seq_lens, token_to_seq, starts, num_rows)

    def kv_b_proj(self, weight: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.inner.kv_b_proj(weight, latent)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        max_q: int | None = None,
        max_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = self.inner.attention(q, k, v, cu_q, cu_k, causal, scale, max_q, max_k)
        return report_keyless_rows(out, lse, keyless_query_rows(cu_q, cu_k, causal, q.shape[0]), self.keyless_rows)

    def masked_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        causal: bool,
        scale: float,
        selection: Selection,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = self.inner.masked_attention(q, k, v, cu_q, cu_k, causal, scale, selection)
        # Which rows are keyless is the selection's: the reference says so.
        keyless = masked_reference_attention(
            q[:, :1, :1], k[:, :1, :1], v[:, :1, :1], cu_q, cu_k, causal, 1.0, selection
        )[2]
        return report_keyless_rows(out, lse, keyless, self.keyless_rows)


def with_keyless_rows(kernels: SharedKernels, keyless_rows: str) -> SharedKernels:
    """``kernels`` with rows without keys reported as ``keyless_rows``: the same
    object when it already does, a new :class:`CpuKernels`/:class:`CudaKernels`
    for those, :class:`KeylessRowsKernels` around anything else."""
    check_keyless_rows(keyless_rows)
    if isinstance(kernels, KeylessRowsKernels) and kernels.keyless_rows != keyless_rows:
        kernels = kernels.inner
    # Kernel sets without the attribute keep the protocol's default, (0, -inf).
    if getattr(kernels, "keyless_rows", KEYLESS_ROWS[0]) == keyless_rows:
        return kernels
    # Exact types: a subclass may take other constructor arguments.
    if type(kernels) is CpuKernels:
        return CpuKernels(keyless_rows)
    if type(kernels) is CudaKernels:
        return CudaKernels(keyless_rows)
    return KeylessRowsKernels(kernels, keyless_rows)


def kernels_for_case(kernels: SharedKernels, case: Case) -> SharedKernels:
    """The kernels both sides run ``case``'s L3 on: ``kernels`` under the case's
    keyless-row behaviour (its ``numeric`` section; the default without one)."""
    return with_keyless_rows(kernels, case.numeric.keyless_rows if case.numeric else KEYLESS_ROWS[0])


# The snapshots themselves, which are not definitions.
_SNAPSHOTS = frozenset({"_AS_DEFINED", "_CLASSES_AS_DEFINED"})


def module_definitions(module: types.ModuleType) -> dict[str, object]:
    """What ``module`` holds, by name: each callable by identity, each constant
    (``FLASH_DTYPES``, ``FLASH_MAX_HEAD_DIM``, the keyless-row values, the masked
    kernel's block sizes) by its pickled bytes, so a value changed in place or
    rebound shows, and a NaN constant still equals itself."""
    import pickle

    found: dict[str, object] = {}
    for name, value in vars(module).items():
        if name.startswith("__") or name in _SNAPSHOTS or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            # A function by identity and by what it runs: its code, defaults and
            # closure can be swapped in place (``f.__code__ = ...``) on the same object.
            found[name] = (value, *_function_parts(value))
            continue
        try:
            found[name] = pickle.dumps(value)
        except Exception:  # a value pickle cannot write is compared by its text
            found[name] = repr(value)
    return found


def _function_parts(value: object) -> tuple[object, ...]:
    if isinstance(value, types.FunctionType):
        return (value.__code__, value.__defaults__, value.__kwdefaults__, value.__closure__)
    return ()


def record_definitions(module: types.ModuleType) -> None:
    """Take ``module``'s definitions as the harness defines them, when it is first
    imported (before any port's code can run); :func:`kernels_untouched` then
    checks them. For the kernels' helper modules that import this one (the chunk
    gather), which it therefore cannot import itself."""
    _AS_DEFINED[module.__name__] = module_definitions(module)


def _classes() -> dict[str, object]:
    found: dict[str, object] = {}
    for cls in (CpuKernels, CudaKernels):
        found |= {f"{cls.__qualname__}.{name}": (value, *_function_parts(value)) for name, value in vars(cls).items()}
    return found


def kernels_untouched(kernels: SharedKernels) -> bool:
    """Whether ``kernels`` computes what the harness defines: nothing set on the
    object but its keyless-row behaviour, and nothing of this module, the
    modules recorded with :func:`record_definitions` (the masked kernel's
    helpers, the chunk gather) or the kernel classes replaced or changed since
    import: code or data (an in-process port shares this process with the
    oracle; what it patches would change the oracle's answers)."""
    if set(vars(kernels)) - {"keyless_rows"} or _classes() != _CLASSES_AS_DEFINED:
        return False
    return all(module_definitions(sys.modules[name]) == taken for name, taken in _AS_DEFINED.items())


# As the harness defines them, taken when each module is first imported: before
# any port's code can run.
_AS_DEFINED: dict[str, dict[str, object]] = {}
record_definitions(sys.modules[__name__])
record_definitions(masked_attention)
_CLASSES_AS_DEFINED = _classes()
