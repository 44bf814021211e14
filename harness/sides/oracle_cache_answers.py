"""What the oracle cache keeps of an answer, and how a hit hands it back.

An answer is kept as itself (a layout, a sparse layout, an ``int``), as
:class:`KeptTensors` (the store's own copies of the tensors of a merge, a
prefill, a sparse prefill, a top-k mask or a remap) or as
:class:`KeptError` (what the oracle raised). :func:`kept_tensors` and
:func:`kept_error` make the kept forms; :func:`handed_out` and
:func:`rebuilt_error` turn them back into what the oracle returned or raised.

Invariants:

- A hit is the fresh answer, bit for bit: a layout equal to the oracle's (and
  of the same types, :func:`harness.protocol.port.check_layout`; a sparse layout
  :func:`harness.compare.sparse.check_sparse_layout`), the same ``int``, and
  tensors of the same dtype, shape, strides (when dense), device, names in the
  same order and bit patterns (NaN payloads, -0.0 and infinities included).
  Every hit returns new tensors (:func:`handed_out`, :func:`fresh_copy`):
  nothing a caller does to them reaches the store.
- An error is an answer too: an item the oracle raises on is raised again on a
  hit, as an exception of the same class name and message (the same class
  where it can be rebuilt from its message, :class:`CachedOracleError` named
  like it otherwise), so the runner's ``oracle-error`` row reads the same.
  Errors that may not recur are never kept (:func:`kept_error` returns None):
  anything not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``),
  ``OSError``, ``MemoryError``, an out-of-memory error, the oracle process's
  ``OracleProcessError`` (a crash or a timeout; its ``OracleRefusal`` is kept,
  it is the release's answer).
- Only tensors of a dtype an entry file can hold are kept (a plain, strided
  tensor of one of the dtypes safetensors holds); anything else raises
  :class:`~harness.sides.oracle_cache_keys.Uncacheable`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.sides.oracle_cache_keys import Uncacheable

if TYPE_CHECKING:
    # Imported where tensors are kept or handed out: a layout-only run never loads torch.
    import torch

# The forms an answer's tensors come back in (handed_out).
TENSOR_FORMS = ("tuple", "dict", "tensor", "list")


@functools.cache
def _stored_dtypes() -> frozenset[torch.dtype]:
    """Dtypes an entry file can hold (safetensors')."""
    import torch

    return frozenset(
        {
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.bool,
        }
    )


# Errors that say something about the moment, not the item.
_TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError)
_TRANSIENT_ERROR_NAMES = frozenset(
    # OracleUnavailable: an import of the oracle failed (an environment being set up).
    {
        "OracleProcessError",
        "OutOfMemoryError",
        "ExternalPortError",
        "PortTimeout",
        "AcceleratorError",
        "OracleUnavailable",
    }
)
# A RuntimeError with one of these in its message is the machine's state, not the
# oracle's answer: a CPU allocation that failed, or a CUDA context a port broke.
_TRANSIENT_MESSAGES = ("allocate memory", "out of memory", "CUDA error", "illegal memory access", "Unable to allocate")
# The names of _TRANSIENT_ERRORS' classes, as a wrapper's message (a repr) shows them.
_TRANSIENT_BUILTIN_NAMES = frozenset(
    {
        "MemoryError",
        "OSError",
        "FileNotFoundError",
        "PermissionError",
        "TimeoutError",
        "ImportError",
        "ModuleNotFoundError",
    }
)


class CachedOracleError(Exception):
    """Raised on a hit for a kept error whose class cannot be rebuilt from its
    message; a subclass named like the original stands in for it."""


@dataclass(frozen=True)
class KeptError:
    module: str
    name: str
    message: str


@dataclass(frozen=True)
class KeptTensors:
    # "tuple" (merge_states), "dict" (prefill, sparse_prefill), "tensor"
    # (build_topk_mask) or "list" (remap_topk): TENSOR_FORMS.
    form: str
    items: tuple[tuple[str, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.items)


def error_of(fields: Any) -> KeptError:
    """A kept error as an entry holds it (its three fields, each a str); ValueError otherwise."""
    if type(fields) is not dict or sorted(fields) != ["message", "module", "name"]:
        raise ValueError("the entry's error is not a module, a name and a message")
    if not all(type(v) is str for v in fields.values()) or not fields["name"]:
        raise ValueError("the entry's error fields are not strings")
    return KeptError(fields["module"], fields["name"], fields["message"])


def kept_error(exc: BaseException) -> KeptError | None:
    """The error as kept, or None for one that may not recur (module docstring):
    judged on the whole chain (``__cause__``, ``__context__``), since a wrapper
    (Triton's interpreter raises ``InterpreterError(repr(e))`` for whatever an
    interpreted kernel raised) may hide a ``MemoryError`` or an ``OSError``."""
    try:
        message = str(exc)
    except Exception:
        return None
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    for link in chain:
        if not isinstance(link, Exception) or isinstance(link, _TRANSIENT_ERRORS):
            return None
        if any(cls.__name__ in _TRANSIENT_ERROR_NAMES | _TRANSIENT_BUILTIN_NAMES for cls in type(link).__mro__):
            return None
    # A wrapper's message may be all that is left of what it wrapped.
    if any(text in message for text in (*_TRANSIENT_MESSAGES, *_TRANSIENT_BUILTIN_NAMES)):
        return None
    return KeptError(type(exc).__module__, type(exc).__qualname__, message)


_STAND_INS: dict[tuple[str, str], type[CachedOracleError]] = {}


def rebuilt_error(error: KeptError) -> Exception:
    """An exception whose class name and message are the kept ones: the class
    itself where its module is loaded and it takes the message back as it
    printed it, else a :class:`CachedOracleError` named like it."""
    module = sys.modules.get(error.module)
    cls: Any = module
    for part in error.name.split("."):
        cls = getattr(cls, part, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        with contextlib.suppress(Exception):
            rebuilt = cls(error.message)
            if type(rebuilt).__name__ == error.name.rpartition(".")[2] and str(rebuilt) == error.message:
                return rebuilt
    key = (error.module, error.name)
    if key not in _STAND_INS:
        short = error.name.rpartition(".")[2]
        _STAND_INS[key] = type(short, (CachedOracleError,), {"__module__": error.module, "__qualname__": error.name})
    return _STAND_INS[key](error.message)


def kept_tensors(form: str, items: list[tuple[str, Any]]) -> KeptTensors:
    """The store's own copies (dense strides kept), or :class:`Uncacheable`."""
    import torch

    kept = []
    for name, value in items:
        if type(name) is not str or type(value) is not torch.Tensor or value.dtype not in _stored_dtypes():
            raise Uncacheable(f"a {type(value).__qualname__} named {name!r}")
        if value.layout != torch.strided or value.is_conj() or value.is_neg() or value.requires_grad:
            raise Uncacheable(f"tensor {name!r} is not a plain tensor")
        kept.append((name, value.detach().clone()))
    return KeptTensors(form, tuple(kept))


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``shape`` out without gaps or overlaps."""
    expected = 1
    for size, step in sorted(((sz, st) for sz, st in zip(shape, stride, strict=True) if sz != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


def fresh_copy(value: torch.Tensor, device: torch.device | str, stride: tuple[int, ...]) -> torch.Tensor:
    """A new tensor of ``value``'s bits on ``device`` in ``stride`` when dense."""
    import torch

    shape = tuple(value.shape)
    if value.numel() and _dense(shape, stride):
        out = torch.empty_strided(shape, stride, dtype=value.dtype, device=device)
    else:
        out = torch.empty(shape, dtype=value.dtype, device=device)
    return out.copy_(value)


def handed_out(tensors: KeptTensors) -> Any:
    copies = [(name, fresh_copy(t, t.device, tuple(t.stride()))) for name, t in tensors.items]
    if tensors.form == "tuple":
        return tuple(t for _, t in copies)
    if tensors.form == "tensor":
        [(_, tensor)] = copies
        return tensor
    if tensors.form == "list":
        return [t for _, t in copies]
    return dict(copies)
