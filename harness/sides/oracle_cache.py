"""The oracle, once: its answers kept by (oracle fingerprint, item digest).

:class:`CachedOracle` wraps the oracle side (any :class:`~harness.protocol.port.Port`).
The first time an item is asked it calls the oracle and keeps the answer; every
later time it hands the kept answer back without calling the oracle. Answers
are kept in two places:

- memory, one store per :class:`CachedOracle`, so every port a run compares
  against one oracle object (the nightly's ports, the kill matrix's mutants,
  explore's candidates) shares the oracle's work, bounded by
  :data:`DEFAULT_MEMORY_LIMIT_BYTES` (tensors by their bytes, layouts and the
  rest by their Python objects'; the oldest entries go first);
- disk, one file per entry under :func:`default_cache_directory`:
  ``$PARITY_ORACLE_CACHE`` when set, else the user's cache directory
  (``$XDG_CACHE_HOME/mla-parity/oracle``, by default
  ``~/.cache/mla-parity/oracle``). Not ``reports/``: entries are no report,
  they survive cleaning a checkout, and every worktree of the same sources
  shares them (the fingerprint covers the sources, so sharing is safe). The
  folder may be deleted at any time; it only costs oracle calls. A
  fingerprint's folder that no run has opened for :data:`STALE_AFTER_S` (two
  weeks) is deleted by the next run that opens the cache
  (:func:`prune_stale_folders`).

Invariants:

- A hit is the fresh answer, bit for bit: a layout equal to the oracle's (and
  of the same types, :func:`harness.protocol.port.check_layout`), the same ``int``, and
  tensors of the same dtype, shape, strides (when dense), device, names in the
  same order and bit patterns (NaN payloads, -0.0 and infinities included).
  Every hit returns new tensors: nothing a caller does to them reaches the store.
- An error is an answer too: an item the oracle raises on is raised again on a
  hit, as an exception of the same class name and message (the same class
  where it can be rebuilt from its message, :class:`CachedOracleError` named
  like it otherwise), so the runner's ``oracle-error`` row reads the same.
  Errors that may not recur are never kept: anything not an ``Exception``
  (``KeyboardInterrupt``, ``SystemExit``), ``OSError``, ``MemoryError``, an
  out-of-memory error, the oracle process's ``OracleProcessError`` (a crash
  or a timeout; its ``OracleRefusal`` is kept, it is the release's answer).
- The fingerprint (:func:`oracle_fingerprint`) is a SHA-256 over the cache
  format, the oracle's provenance (:data:`IDENTITY_KEYS`: release, upstream
  commit, installed version and commit id, every fingerprint status, a served
  release's own Python, torch, Triton and numpy versions; nothing a command
  adds about its run), the release's pin file,
  the oracle's class, the Python, torch and Triton versions, and the text of
  the harness's and the oracle's own sources (``harness/``, ``oracle/``,
  ``requirements/``): another pin, release, fingerprint or translation is
  another key. An oracle run with its fingerprints overridden
  (``--allow-oracle-drift``) is kept in memory only: its provenance says a
  symbol drifted, not what it drifted to.
- The item digest is a SHA-256 over the item's kind and a canonical JSON of
  everything the answer depends on: the whole case or configuration (every
  field, exact harness types only), and at L2 and L3 the input tensors
  themselves (dtype, shape, strides, storage offset and every byte of their
  storage), the device and the numeric environment (torch's CPU capability
  and thread count, the GPU's name, ``TRITON_INTERPRET``), and at L3 the
  shared kernels (exactly :class:`~harness.kernels.CpuKernels` or
  :class:`~harness.kernels.CudaKernels`, with their keyless-row behaviour) and
  the DCP inputs (every rank's cache, this process's rank). What cannot be
  digested so is passed to the oracle uncached (``bypassed``): other types,
  other kernel sets, the harness's kernels patched since import
  (:func:`harness.kernels.kernels_untouched`: an in-process port shares the
  oracle's process), a DCP collective other than
  :class:`~harness.model.dcp.OneProcessRanks`. Real DCP ranks never reach this
  object: :mod:`harness.sides.dcp_ranks` runs its own oracle on each rank.
- A disk entry is written to a temporary file in its folder and renamed over
  its name (``os.replace``): a reader sees no entry or a whole one, and two
  writers of one key write the same bytes. Its bytes end in their SHA-256. An
  entry that cannot be read or parsed, whose digest does not match (a flipped
  bit in a tensor), or that does not name its own key, is a miss (``unreadable``) and
  the fresh answer replaces it; a folder that cannot be written is counted
  (``write_failures``) and the run goes on. The cache never fails an item.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import itertools
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from harness.kernels import CpuKernels, CudaKernels, SharedKernels, kernels_untouched
from harness.kernels.numeric import DcpInputs, MergeInputs, PrefillInputs, RankCache
from harness.model import Case, Chunk, Layout, MergeCase, NumericSpec, WorkspaceConfig
from harness.model.dcp import OneProcessRanks
from harness.protocol.port import Port, check_layout, port_levels

# Part of every key: a change to what an entry holds or how a key is made
# starts a new folder instead of misreading the old one.
CACHE_FORMAT = 2
ENVIRONMENT_VARIABLE = "PARITY_ORACLE_CACHE"
DEFAULT_MEMORY_LIMIT_BYTES = 1 << 30
# A fingerprint's folder no run has opened for this long is deleted (prune_stale_folders).
STALE_AFTER_S = 14 * 24 * 3600.0
LAST_USED = ".last-used"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The sources whose text decides what the oracle answers: the translation of
# upstream into the harness's model, the inputs, the shared kernels, the pins
# and the other releases' requirements.
SOURCE_GLOBS = (("harness", "*.py"), ("oracle", "*.py"), ("oracle", "*.json"), ("requirements", "*.txt"))

# What of the oracle's provenance (harness.engine.open_oracle) says
# which oracle it is; anything a caller adds about the run is not identity.
IDENTITY_KEYS = (
    "release",
    "upstream_commit",
    "upstream_pr",
    "installed_vllm",
    "installed_commit_id",
    "fingerprints",
    "oracle_drift_overridden",
    "oracle_environment",  # a served release's Python, torch, Triton and numpy versions
)

# Exactly these types are digested field by field; a subclass may change what
# the oracle reads (a property), so it is not cached.
_DIGESTED_DATACLASSES: tuple[type, ...] = (
    Case,
    NumericSpec,
    WorkspaceConfig,
    MergeCase,
    PrefillInputs,
    MergeInputs,
    DcpInputs,
    RankCache,
)
_KERNEL_TYPES: tuple[type, ...] = (CpuKernels, CudaKernels)
# Dtypes an entry file can hold (safetensors').
_STORED_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
# Errors that say something about the moment, not the item.
_TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError)
_TRANSIENT_ERROR_NAMES = frozenset(
    {"OracleProcessError", "OutOfMemoryError", "ExternalPortError", "PortTimeout", "AcceleratorError"}
)
# A RuntimeError with one of these in its message is the machine's state, not the
# oracle's answer: a CPU allocation that failed, or a CUDA context a port broke.
_TRANSIENT_MESSAGES = ("allocate memory", "out of memory", "CUDA error", "illegal memory access", "Unable to allocate")
# The names of _TRANSIENT_ERRORS' classes, as a wrapper's message (a repr) shows them.
_TRANSIENT_BUILTIN_NAMES = frozenset({"MemoryError", "OSError", "FileNotFoundError", "PermissionError", "TimeoutError"})


class CachedOracleError(Exception):
    """Raised on a hit for a kept error whose class cannot be rebuilt from its
    message; a subclass named like the original stands in for it."""


class _Uncacheable(Exception):
    """An item or answer with no canonical digest or stored form."""


@dataclass(frozen=True)
class _Error:
    module: str
    name: str
    message: str


@dataclass(frozen=True)
class _Tensors:
    form: str  # "tuple" (merge_states) or "dict" (prefill)
    items: tuple[tuple[str, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.items)


_INT_BYTES = 28


def _memory_bytes(kept: Any) -> int:
    """What a kept answer costs the memory store: its tensors' bytes, or for a
    layout, an int or an error the size of its Python objects (a night keeps
    tens of thousands of layouts: they count against the limit too)."""
    if isinstance(kept, _Tensors):
        return kept.nbytes
    size, pending, seen = 0, [kept], set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        size += sys.getsizeof(value)
        if isinstance(value, tuple | list):
            if value and type(value[0]) is int:
                # A row index per context token: tens of thousands of ints, counted
                # not visited (an int object is 28 bytes, a small one shared).
                size += _INT_BYTES * len(value)
            else:
                pending.extend(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            # The instance's own field values (the model's dataclasses keep a
            # __dict__): dataclasses.fields per chunk cost more than the walk.
            pending.extend(vars(value).values())
    return size


# -- where entries live ------------------------------------------------------------------


def default_cache_directory() -> Path:
    """``$PARITY_ORACLE_CACHE``, else ``$XDG_CACHE_HOME/mla-parity/oracle``, else
    ``~/.cache/mla-parity/oracle``."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mla-parity" / "oracle"


# -- the key -----------------------------------------------------------------------------


def _digest(material: Any) -> str:
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@functools.cache
def sources_digest(root: Path = REPO_ROOT) -> str:
    """SHA-256 over the path and bytes of every file :data:`SOURCE_GLOBS` names."""
    digest = hashlib.sha256()
    for folder, pattern in SOURCE_GLOBS:
        for path in sorted((root / folder).rglob(pattern)):
            if "__pycache__" not in path.parts and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _pin_of(provenance: Mapping[str, Any]) -> Any:
    """The pin file of the provenance's release, parsed (None without one)."""
    from oracle.pin import load_pin, pin_file_for

    match = re.fullmatch(r"vllm==(\d+\.\d+\.\d+)", str(provenance.get("release", "")))
    if match is None:
        return None
    path = pin_file_for(match.group(1))
    return load_pin(path) if path.is_file() else None


def oracle_fingerprint(oracle: Any, provenance: Mapping[str, Any]) -> str:
    """The first half of every key: who the oracle is (module docstring).
    Raises ``TypeError``/``ValueError`` for a provenance that is not plain JSON."""
    # The oracle's numeric code loads on its first merge or prefill: load it now,
    # so the sources hashed below are the ones it runs.
    importlib.import_module("oracle.numeric")

    material = {
        "format": CACHE_FORMAT,
        "oracle": f"{type(oracle).__module__}.{type(oracle).__qualname__}",
        "name": str(getattr(oracle, "name", "")),
        "provenance": {key: provenance[key] for key in IDENTITY_KEYS if key in provenance},
        "pin": _pin_of(provenance),
        "sources": sources_digest(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        # The interpreter's tl.exp and tl.log are numpy's.
        "numpy": _package_version("numpy"),
    }
    return _digest(material)


def drift_overridden(provenance: Mapping[str, Any]) -> bool:
    """Whether the run's oracle has a fingerprint other than its pin's."""
    statuses = provenance.get("fingerprints") or {}
    return bool(provenance.get("oracle_drift_overridden")) or any(s != "ok" for s in statuses.values())


def _float(value: float) -> dict[str, str]:
    if not math.isfinite(value):
        raise _Uncacheable(f"a non-finite float {value!r}")
    return {"float": value.hex()}


def _tensor(value: torch.Tensor) -> dict[str, Any]:
    """A tensor by its geometry and every byte of its storage (a view reads by
    its strides and offset, and what lies around it is part of the input)."""
    if value.layout != torch.strided or value.is_conj() or value.is_neg() or value.is_quantized:
        raise _Uncacheable(f"a {value.layout} tensor")
    storage = value.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=value.device).set_(storage)
    contents = hashlib.sha256(raw.detach().cpu().numpy().data).hexdigest()
    return {
        "tensor": str(value.dtype),
        "shape": list(value.shape),
        "stride": list(value.stride()),
        "offset": value.storage_offset(),
        "device": str(value.device),
        "storage_bytes": storage.nbytes(),
        "storage": contents,
    }


def canonical(value: Any) -> Any:
    """``value`` as plain JSON that two values share only when the oracle cannot
    tell them apart; raises :class:`_Uncacheable` for anything else."""
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        return _float(value)
    if type(value) in (tuple, list):
        return [canonical(v) for v in value]
    if type(value) is torch.Tensor:
        return _tensor(value)
    if type(value) is OneProcessRanks:
        return {"type": "OneProcessRanks", "world_size": value.world_size, "rank": value.rank}
    if type(value) in _DIGESTED_DATACLASSES:
        fields = {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__qualname__, "fields": fields}
    raise _Uncacheable(f"a {type(value).__module__}.{type(value).__qualname__}")


def _kernels_identity(kernels: SharedKernels) -> dict[str, Any]:
    if type(kernels) not in _KERNEL_TYPES:
        raise _Uncacheable(f"kernels {type(kernels).__qualname__}")
    if not kernels_untouched(kernels):
        # Something patched them (an in-process port can): the answer is not the
        # harness's kernels', so it is computed afresh and kept nowhere.
        raise _Uncacheable("kernels patched since import")
    return {
        "type": type(kernels).__qualname__,
        "name": str(getattr(kernels, "name", "")),
        "keyless_rows": str(getattr(kernels, "keyless_rows", "")),
    }


@functools.cache
def _gpu_identity(device: str) -> dict[str, Any]:
    index = torch.device(device).index
    return {
        "name": torch.cuda.get_device_name(index),
        "capability": list(torch.cuda.get_device_capability(index)),
        "cuda": torch.version.cuda,
    }


def numeric_environment(device: torch.device) -> dict[str, Any]:
    """What beyond the inputs can change an L2/L3 bit: the device and how
    torch and Triton run on it."""
    out: dict[str, Any] = {
        "device": str(device),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        # Whether Triton fuses a * b + c on the GPU changes upstream's compiled merge.
        "triton_fp_fusion": [os.environ.get(n) for n in ("TRITON_DEFAULT_FP_FUSION", "TRITON_FORCE_DISABLE_FP_FUSION")],
        "vllm_target_device": os.environ.get("VLLM_TARGET_DEVICE"),
    }
    if device.type == "cuda":
        out["gpu"] = _gpu_identity(str(device))
    return out


def item_digest(kind: str, material: Any) -> str:
    """The second half of a key: the item's kind and its canonical material."""
    return _digest({"format": CACHE_FORMAT, "kind": kind, "item": material})


# -- answers: checked, copied, stored ----------------------------------------------------


def _kept_error(exc: BaseException) -> _Error | None:
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
    return _Error(type(exc).__module__, type(exc).__qualname__, message)


_STAND_INS: dict[tuple[str, str], type[CachedOracleError]] = {}


def rebuilt_error(error: _Error) -> Exception:
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


def _kept_tensors(form: str, items: list[tuple[str, Any]]) -> _Tensors:
    """The store's own copies (dense strides kept), or :class:`_Uncacheable`."""
    kept = []
    for name, value in items:
        if type(name) is not str or type(value) is not torch.Tensor or value.dtype not in _STORED_DTYPES:
            raise _Uncacheable(f"a {type(value).__qualname__} named {name!r}")
        if value.layout != torch.strided or value.is_conj() or value.is_neg() or value.requires_grad:
            raise _Uncacheable(f"tensor {name!r} is not a plain tensor")
        kept.append((name, value.detach().clone()))
    return _Tensors(form, tuple(kept))


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``shape`` out without gaps or overlaps."""
    expected = 1
    for size, step in sorted(((sz, st) for sz, st in zip(shape, stride, strict=True) if sz != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


def _fresh_copy(value: torch.Tensor, device: torch.device | str, stride: tuple[int, ...]) -> torch.Tensor:
    """A new tensor of ``value``'s bits on ``device`` in ``stride`` when dense."""
    shape = tuple(value.shape)
    if value.numel() and _dense(shape, stride):
        out = torch.empty_strided(shape, stride, dtype=value.dtype, device=device)
    else:
        out = torch.empty(shape, dtype=value.dtype, device=device)
    return out.copy_(value)


def _handed_out(tensors: _Tensors) -> Any:
    copies = [(name, _fresh_copy(t, t.device, tuple(t.stride()))) for name, t in tensors.items]
    if tensors.form == "tuple":
        return tuple(t for _, t in copies)
    return dict(copies)


def _entry_header(fingerprint: str, item: str, kind: str) -> dict[str, Any]:
    return {"format": CACHE_FORMAT, "fingerprint": fingerprint, "item": item, "kind": kind}


def _expanded(runs: list[list[int]]) -> tuple[int, ...]:
    return tuple(itertools.chain.from_iterable(itertools.repeat(value, count) for value, count in runs))


def _layout_of(data: dict[str, Any]) -> Layout:
    """The inverse of :meth:`Layout.to_json` for the store's own entries, without
    :func:`~harness.model.layout_from_json`'s per-field checks (which guard
    against a port's replies and cost as much as asking the pinned oracle
    again); the caller checks the result with :func:`check_layout`."""
    decoders = _chunk_decoders()
    chunks = []
    for fields in data["chunks"]:
        values: dict[str, Any] = {}
        for name, decode in decoders:
            value = fields[name]
            values[name] = value if value is None or decode is None else decode(value)
        chunks.append(Chunk(**values))
    return Layout(tuple(chunks), tuple((start, stop) for start, stop in data["empty_token_slices"]))


def _ranks(value: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(ranks) for ranks in value)


@functools.cache
def _chunk_decoders() -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    """Each chunk field with what turns its JSON form back into its value
    (None: the JSON value itself, an int or a bool)."""
    sequences = set(Chunk.sequence_field_names())
    decoders: list[tuple[str, Callable[[Any], Any] | None]] = []
    for name in Chunk.field_names():
        if name.endswith("token_to_seq"):
            decoders.append((name, _expanded))
        elif name == "local_context_lens_allranks":
            decoders.append((name, _ranks))
        else:
            decoders.append((name, tuple if name in sequences else None))
    return tuple(decoders)


def _encode_json_entry(header: dict[str, Any], answer: Any) -> bytes:
    payload = dict(header)
    if isinstance(answer, _Error):
        payload["error"] = dataclasses.asdict(answer)
    elif isinstance(answer, Layout):
        payload["layout"] = answer.to_json()
    else:
        payload["value"] = answer
    # Insertion order is fixed, so equal answers are equal bytes without sorting.
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def _decode_json_entry(data: bytes, header: dict[str, Any]) -> Any:
    payload = json.loads(data.decode("utf-8"))
    if not isinstance(payload, dict) or {k: payload.get(k) for k in header} != header:
        raise ValueError("the entry names another key")
    if "error" in payload:
        return _Error(**payload["error"])
    if header["kind"] == "layout":
        return check_layout(_layout_of(payload["layout"]))
    value = payload["value"]
    if type(value) is not int:
        raise ValueError("the entry's value is not an int")
    return value


def _encode_tensor_entry(header: dict[str, Any], answer: _Tensors | _Error) -> bytes:
    from safetensors.torch import save

    entry = dict(header)
    tensors: dict[str, torch.Tensor] = {}
    if isinstance(answer, _Error):
        entry["error"] = dataclasses.asdict(answer)
    else:
        entry["form"] = answer.form
        # Names in the answer's order (safetensors sorts its own), and what a
        # contiguous host copy loses: the device and the strides.
        entry["tensors"] = [[name, str(t.device), list(t.stride())] for name, t in answer.items]
        # Host copies of their own: safetensors refuses tensors that share storage.
        tensors = {name: t.detach().to("cpu").clone(memory_format=torch.contiguous_format) for name, t in answer.items}
    # One metadata string: the format keeps its metadata in a hash map, so
    # several would be written in any order, and equal answers would not be equal bytes.
    return save(tensors, metadata={"entry": json.dumps(entry, sort_keys=True, separators=(",", ":"))})


def _sealed(data: bytes) -> bytes:
    """``data`` followed by its SHA-256: a flipped bit anywhere is caught on reading."""
    return data + hashlib.sha256(data).digest()


def _unsealed(stored: bytes) -> bytes:
    """What :func:`_sealed` sealed; ValueError when the digest does not match."""
    data, seal = stored[:-32], stored[-32:]
    if len(stored) < 32 or hashlib.sha256(data).digest() != seal:
        raise ValueError("the entry's digest does not match its bytes")
    return data


def _decode_tensor_entry(data: bytes, header: dict[str, Any]) -> _Tensors | _Error:
    from safetensors.torch import load

    loaded = load(data)
    # The format's header: its length (8 bytes, little-endian), then JSON whose
    # "__metadata__" holds the strings written beside the tensors.
    length = int.from_bytes(data[:8], "little")
    entry = json.loads(json.loads(data[8 : 8 + length].decode("utf-8"))["__metadata__"]["entry"])
    if {key: entry.get(key) for key in header} != header:
        raise ValueError("the entry names another key")
    if "error" in entry:
        return _Error(**entry["error"])
    listed = entry["tensors"]
    if sorted(name for name, _, _ in listed) != sorted(loaded) or entry["form"] not in ("tuple", "dict"):
        raise ValueError("the entry's tensors are not the ones it lists")
    items = tuple((name, _fresh_copy(loaded[name], device, tuple(stride))) for name, device, stride in listed)
    return _Tensors(entry["form"], items)


# -- the wrapper ------------------------------------------------------------------------


STAT_NAMES = ("memory_hits", "disk_hits", "misses", "bypassed", "stored", "unreadable", "write_failures")


class CachedOracle:
    """``oracle`` with its answers kept (module docstring); everything else it
    has (``close``, ``upstream_metadata``, ``hello`` ...) is the oracle's own."""

    # Every layout plan_layout returns has passed harness.protocol.port.check_layout: a fresh
    # answer is checked before it is kept (a mistyped one raises PortValueError), a
    # kept one was checked when kept and decodes to the same exact types. The
    # runner skips its own check of the oracle's layout on this promise.
    returns_checked_layouts = True

    def __init__(
        self,
        oracle: Port,
        fingerprint: str,
        directory: Path | None,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    ) -> None:
        self.wrapped = oracle
        self.name = oracle.name
        self.fingerprint = fingerprint
        # None: memory only.
        self.directory = directory / f"format-{CACHE_FORMAT}" / fingerprint[:32] if directory is not None else None
        self.memory_limit_bytes = memory_limit_bytes
        # key -> (answer, the bytes the limit counts for it)
        self._memory: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._memory_bytes = 0
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STAT_NAMES, 0)

    def __getattr__(self, attribute: str) -> Any:
        # Only called for what this class lacks; never for dunders (copy, pickle).
        if attribute.startswith("__") or "wrapped" not in self.__dict__:
            raise AttributeError(attribute)
        return getattr(self.__dict__["wrapped"], attribute)

    @property
    def levels(self) -> tuple[str, ...]:
        """The oracle's levels, not this wrapper's methods."""
        return port_levels(self.wrapped)

    @property
    def memory_bytes(self) -> int:
        """What the memory store holds now, as its limit counts it."""
        with self._lock:
            return self._memory_bytes

    def stats(self) -> dict[str, int]:
        """Counts since this object was made: hits from memory and from disk,
        misses (the oracle was called and its answer kept), items passed through
        uncached, entries kept, entries that could not be read, failed writes."""
        with self._lock:
            return dict(self._counts)

    # -- the oracle's four questions

    def plan_layout(self, case: Case) -> Layout:
        answer: Layout = self._answer("layout", lambda: canonical(case), lambda: self.wrapped.plan_layout(case))
        return answer

    def workspace_size(self, config: WorkspaceConfig) -> int:
        answer: int = self._answer("workspace", lambda: canonical(config), lambda: self.wrapped.workspace_size(config))
        return answer

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        def material() -> Any:
            device = inputs.prefix_output.device if type(inputs.prefix_output) is torch.Tensor else None
            if device is None:
                raise _Uncacheable("merge inputs without tensors")
            return {"inputs": canonical(inputs), "environment": numeric_environment(device)}

        merge = self.wrapped.merge_states  # type: ignore[attr-defined]
        answer: tuple[torch.Tensor, torch.Tensor] = self._answer("merge", material, lambda: merge(inputs))
        return answer

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        def material() -> Any:
            device = inputs.q.device if type(inputs.q) is torch.Tensor else None
            if device is None:
                raise _Uncacheable("prefill inputs without tensors")
            return {
                "case": canonical(case),
                "inputs": canonical(inputs),
                "kernels": _kernels_identity(kernels),
                "environment": numeric_environment(device),
            }

        prefill = self.wrapped.prefill  # type: ignore[attr-defined]
        answer: dict[str, torch.Tensor] = self._answer("prefill", material, lambda: prefill(case, inputs, kernels))
        return answer

    # -- the cache

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _answer(self, kind: str, material: Callable[[], Any], ask: Callable[[], Any]) -> Any:
        try:
            item = item_digest(kind, material())
        except _Uncacheable:
            self._count("bypassed")
            answer = ask()
            return check_layout(answer) if kind == "layout" else answer
        key = f"{kind}-{item}"
        with self._lock:
            held = self._memory.get(key)
            kept = held[0] if held is not None else None
            if held is not None:
                self._memory.move_to_end(key)
                self._counts["memory_hits"] += 1
        if kept is None:
            kept = self._read(kind, item)
            if kept is not None:
                self._count("disk_hits")
                self._remember(key, kept)
        if kept is not None:
            return self._hand_out(kept)
        self._count("misses")
        try:
            answer = ask()
        except BaseException as exc:
            error = _kept_error(exc)
            if error is not None:
                self._keep(kind, item, key, error)
            raise
        if kind == "layout":
            # returns_checked_layouts: whatever the check raises is the oracle's error.
            stored = self._storable(kind, answer)
        else:
            try:
                stored = self._storable(kind, answer)
            except (_Uncacheable, ValueError, TypeError):
                return answer
        with contextlib.suppress(_Uncacheable, ValueError, TypeError):
            self._keep(kind, item, key, stored)
        return answer

    @staticmethod
    def _storable(kind: str, answer: Any) -> Any:
        """The answer as the store keeps it, checked to come back exactly."""
        if kind == "layout":
            # Exact types (plain ints, bools and tuples) are what makes
            # Layout.to_json and _layout_of invert each other.
            return check_layout(answer)  # frozen, of tuples: safe to share
        if kind == "workspace":
            if type(answer) is not int:
                raise _Uncacheable(f"a workspace size of type {type(answer).__qualname__}")
            return answer
        if kind == "merge":
            if type(answer) is not tuple or len(answer) != 2:
                raise _Uncacheable("a merge answer that is not (output, lse)")
            return _kept_tensors("tuple", [("output", answer[0]), ("lse", answer[1])])
        if type(answer) is not dict:
            raise _Uncacheable("a prefill answer that is not a dict")
        return _kept_tensors("dict", list(answer.items()))

    @staticmethod
    def _hand_out(kept: Any) -> Any:
        if isinstance(kept, _Error):
            raise rebuilt_error(kept)
        if isinstance(kept, _Tensors):
            return _handed_out(kept)
        return kept

    def _remember(self, key: str, kept: Any) -> None:
        size = _memory_bytes(kept)
        if size > self.memory_limit_bytes:
            return
        with self._lock:
            if key in self._memory:
                return
            self._memory[key] = (kept, size)
            self._memory_bytes += size
            while self._memory_bytes > self.memory_limit_bytes:
                _, (_, dropped_size) = self._memory.popitem(last=False)
                self._memory_bytes -= dropped_size

    def _keep(self, kind: str, item: str, key: str, kept: Any) -> None:
        self._remember(key, kept)
        self._count("stored")
        if self.directory is None:
            return
        header = _entry_header(self.fingerprint, item, kind)
        try:
            if kind in ("layout", "workspace"):
                data = _encode_json_entry(header, kept)
            else:
                data = _encode_tensor_entry(header, kept)
            _write_atomically(self._path(kind, item), _sealed(data))
        except Exception:
            self._count("write_failures")

    def _path(self, kind: str, item: str) -> Path:
        assert self.directory is not None
        suffix = ".json" if kind in ("layout", "workspace") else ".safetensors"
        return self.directory / f"{kind}-{item}{suffix}"

    def _read(self, kind: str, item: str) -> Any:
        """The disk entry's answer, or None (missing, or unreadable: counted)."""
        if self.directory is None:
            return None
        try:
            data = self._path(kind, item).read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            self._count("unreadable")
            return None
        header = _entry_header(self.fingerprint, item, kind)
        try:
            data = _unsealed(data)
            if kind in ("layout", "workspace"):
                return _decode_json_entry(data, header)
            return _decode_tensor_entry(data, header)
        except Exception:
            self._count("unreadable")
            return None


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all, whoever reads meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def with_oracle_cache(
    oracle: Port,
    provenance: Mapping[str, Any],
    *,
    enabled: bool = True,
    directory: Path | None = None,
    memory_only: bool = False,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
) -> Port:
    """``oracle`` behind a :class:`CachedOracle`, or ``oracle`` itself when not
    ``enabled`` (``--no-oracle-cache``). Entries go under ``directory`` (default
    :func:`default_cache_directory`) unless ``memory_only``, or the provenance
    says the fingerprints were overridden, or it is not plain JSON."""
    if not enabled:
        return oracle
    try:
        fingerprint = oracle_fingerprint(oracle, provenance)
    except (TypeError, ValueError):
        fingerprint, memory_only = "unfingerprinted", True
    on_disk = not memory_only and not drift_overridden(provenance)
    folder = (directory or default_cache_directory()) if on_disk else None
    cached = CachedOracle(oracle, fingerprint, folder, memory_limit_bytes)
    if cached.directory is not None:
        prune_stale_folders(cached.directory)
    return cached


def prune_stale_folders(in_use: Path, unused_for_s: float = STALE_AFTER_S) -> list[Path]:
    """Mark ``in_use`` (one fingerprint's folder) as used now and delete every other
    fingerprint's folder beside it, of any cache format, that no run has opened
    for ``unused_for_s`` seconds: each edit of the harness's sources starts a new
    fingerprint, and nothing else would ever remove the old ones. A folder in
    use elsewhere was marked when that run opened it; deleting one under a
    reader is a miss there, never a wrong answer. Never raises; what it deleted."""
    stamp = in_use / LAST_USED
    with contextlib.suppress(OSError):
        in_use.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    root, now, removed = in_use.parent.parent, time.time(), []
    for folder in root.glob("format-*/*"):
        if folder == in_use or not folder.is_dir():
            continue
        try:
            marked = folder / LAST_USED
            last = (marked if marked.exists() else folder).stat().st_mtime
        except OSError:
            continue
        if now - last > unused_for_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
