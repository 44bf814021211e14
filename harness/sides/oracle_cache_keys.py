"""The oracle cache's key: who the oracle is (its fingerprint) and what the item is (its digest).

A key of :class:`harness.sides.oracle_cache.CachedOracle` is two SHA-256s:
:func:`oracle_fingerprint`, once per oracle, and :func:`item_digest`, once per
question. Two questions share a key only when the oracle cannot tell them
apart; anything this module cannot say that of raises :class:`Uncacheable`, and
the question goes to the oracle uncached.

Invariants:

- The fingerprint (:func:`oracle_fingerprint`) is a SHA-256 over the cache
  format, the oracle's provenance (:data:`IDENTITY_KEYS`: release, upstream
  commit, installed version and commit id, every fingerprint status, a served
  release's own Python, torch, Triton and numpy versions; nothing a command
  adds about its run), the release's pin file,
  the oracle's class, the installed source files of the vLLM modules its sparse
  path runs (:func:`sparse_sources`; None when it cannot say, and then no sparse
  answer is kept on disk), the Python, torch and Triton versions, and the text of
  the harness's and the oracle's own sources (``harness/``, ``oracle/``,
  ``requirements/``; :data:`SOURCE_GLOBS`, rooted at :data:`REPO_ROOT`, so
  every module of ``harness/``, this one and the rest of the cache included):
  another pin, release, fingerprint or translation is another key.
- The item digest is a SHA-256 over the item's kind and a canonical JSON of
  everything the answer depends on: the whole case or configuration (every
  field, exact harness types only), and at L2 and L3 (the sparse levels' top-k
  indices among them) the input tensors
  themselves (dtype, shape, strides, storage offset and every byte of their
  storage), the device and the numeric environment (the machine's
  architecture, the BLAS's code path (:func:`harness.kernels.machine.blas_mode`),
  torch's thread count, the GPU's name, ``TRITON_INTERPRET``; the CPU's model
  and torch's CPU capability unless
  :func:`harness.kernels.machine.shares_kernel_bits`, where the kernels were
  shown to compute the same bits under any), and at L3 the
  shared kernels (exactly :class:`~harness.kernels.CpuKernels` or
  :class:`~harness.kernels.CudaKernels`, with their keyless-row behaviour) and
  the DCP inputs (every rank's cache, this process's rank). What cannot be
  digested so raises :class:`Uncacheable`: other types, other kernel sets, the
  harness's kernels patched since import
  (:func:`harness.kernels.kernels_untouched`: an in-process port shares the
  oracle's process), a DCP collective other than
  :class:`~harness.model.dcp.OneProcessRanks`.
- :data:`CACHE_FORMAT` is part of every key and of every entry's header: a
  change to what an entry holds or how a key is made bumps it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import math
import os
import platform
import re
import sys
from collections.abc import Mapping
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.model import Case, MergeCase, NumericSpec, WorkspaceConfig
from harness.model.dcp import OneProcessRanks
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase

if TYPE_CHECKING:
    import torch

    from harness.kernels import SharedKernels

# Part of every key: a change to what an entry holds or how a key is made
# starts a new folder instead of misreading the old one.
CACHE_FORMAT = 4
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
# the oracle reads (a property), so it is not cached. The cases and configurations:
_MODEL_DATACLASSES: tuple[type, ...] = (
    Case,
    NumericSpec,
    WorkspaceConfig,
    MergeCase,
    SparseCase,
    SparseWorkspaceConfig,
    TopkMaskCase,
)


@functools.cache
def _input_dataclasses() -> tuple[type, ...]:
    """And the L2/L3 inputs: their modules load torch, so they are imported for
    the first value that is not a model type (a layout-only run never loads torch)."""
    from harness.kernels.numeric import DcpInputs, MergeInputs, PrefillInputs, RankCache
    from harness.kernels.sparse_prefill import SparsePrefillInputs

    return (PrefillInputs, MergeInputs, DcpInputs, RankCache, SparsePrefillInputs)


class Uncacheable(Exception):
    """An item or answer with no canonical digest or stored form."""


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


def _torch_version() -> str | None:
    """The imported torch's own version where torch is loaded (a run that
    compares tensors), else its installed distribution's (a layout-only run)."""
    torch = sys.modules.get("torch")
    return str(torch.__version__) if torch is not None else _package_version("torch")


def _pin_of(provenance: Mapping[str, Any]) -> Any:
    """The pin file of the provenance's release, parsed (None without one)."""
    from oracle.pin import load_pin, pin_file_for

    match = re.fullmatch(r"vllm==(\d+\.\d+\.\d+)", str(provenance.get("release", "")))
    if match is None:
        return None
    path = pin_file_for(match.group(1))
    return load_pin(path) if path.is_file() else None


def sparse_sources(oracle: Any) -> str | None:
    """The oracle's digest of the vLLM sources its sparse path runs
    (``sparse_source_digest``), or None for an oracle that cannot say (a served
    release, a fake, a sparse backend that does not import): the pin's
    fingerprints cover the dense symbols only, so without it the sparse levels'
    answers are kept in memory only (:class:`~harness.sides.oracle_cache.CachedOracle`)."""
    digest = getattr(oracle, "sparse_source_digest", None)
    if not callable(digest):
        return None
    try:
        value = digest()
    except Exception:
        return None
    return value if type(value) is str else None


def oracle_fingerprint(oracle: Any, provenance: Mapping[str, Any], sparse: str | None = None) -> str:
    """The first half of every key: who the oracle is (module docstring), and
    ``sparse``, the digest of the sources its sparse path runs (:func:`sparse_sources`).
    Raises ``TypeError``/``ValueError`` for a provenance that is not plain JSON."""
    if "torch" in sys.modules:
        # A run that compares tensors (its device selected, torch loaded): the
        # oracle's numeric code loads now, not on its first merge or prefill, so
        # the sources hashed below are the ones it runs. A layout-only run never loads it.
        importlib.import_module("oracle.numeric")
    material = {
        "format": CACHE_FORMAT,
        "oracle": f"{type(oracle).__module__}.{type(oracle).__qualname__}",
        "name": str(getattr(oracle, "name", "")),
        "provenance": {key: provenance[key] for key in IDENTITY_KEYS if key in provenance},
        "pin": _pin_of(provenance),
        "sources": sources_digest(),
        "sparse_sources": sparse,
        "python": platform.python_version(),
        "torch": _torch_version(),
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
        raise Uncacheable(f"a non-finite float {value!r}")
    return {"float": value.hex()}


def _tensor(value: torch.Tensor) -> dict[str, Any]:
    """A tensor by its geometry and every byte of its storage (a view reads by
    its strides and offset, and what lies around it is part of the input)."""
    import torch

    if value.layout != torch.strided or value.is_conj() or value.is_neg() or value.is_quantized:
        raise Uncacheable(f"a {value.layout} tensor")
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
    tell them apart; raises :class:`Uncacheable` for anything else."""
    if value is None or type(value) in (bool, str, int):
        return value
    if isinstance(value, StrEnum):
        # A closed set's member (a mask form, a route) is its text to the oracle.
        return value.value
    if type(value) is float:
        return _float(value)
    if type(value) in (tuple, list):
        return [canonical(v) for v in value]
    # A tensor's module is loaded before the tensor: a layout-only run never loads torch.
    torch = sys.modules.get("torch")
    if torch is not None and type(value) is torch.Tensor:
        return _tensor(value)
    if type(value) is OneProcessRanks:
        return {"type": "OneProcessRanks", "world_size": value.world_size, "rank": value.rank}
    if type(value) in _MODEL_DATACLASSES or (dataclasses.is_dataclass(value) and type(value) in _input_dataclasses()):
        fields = {
            f.name: canonical(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("keyed_when_set") and getattr(value, f.name) == f.default)
        }
        return {"type": type(value).__qualname__, "fields": fields}
    raise Uncacheable(f"a {type(value).__module__}.{type(value).__qualname__}")


def kernels_identity(kernels: SharedKernels) -> dict[str, Any]:
    from harness.kernels import CpuKernels, CudaKernels, kernels_untouched

    if type(kernels) not in (CpuKernels, CudaKernels):
        raise Uncacheable(f"kernels {type(kernels).__qualname__}")
    if not kernels_untouched(kernels):
        # Something patched them (an in-process port can): the answer is not the
        # harness's kernels', so it is computed afresh and kept nowhere.
        raise Uncacheable("kernels patched since import")
    return {
        "type": type(kernels).__qualname__,
        "name": str(getattr(kernels, "name", "")),
        "keyless_rows": str(getattr(kernels, "keyless_rows", "")),
    }


@functools.cache
def _gpu_identity(device: str) -> dict[str, Any]:
    import torch

    index = torch.device(device).index
    return {
        "name": torch.cuda.get_device_name(index),
        "capability": list(torch.cuda.get_device_capability(index)),
        "cuda": torch.version.cuda,
    }


def numeric_environment(device: torch.device) -> dict[str, Any]:
    """What beyond the inputs can change an L2/L3 bit: the device and how
    torch and Triton run on it."""
    import torch

    from harness.kernels.machine import blas_mode, cpu_identity, shares_kernel_bits

    out: dict[str, Any] = {
        "device": str(device),
        "machine": platform.machine(),
        # MKL's code path changes a matmul's bits.
        "blas": blas_mode(),
        "threads": torch.get_num_threads(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        # Whether Triton fuses a * b + c on the GPU changes upstream's compiled merge.
        "triton_fp_fusion": [os.environ.get(n) for n in ("TRITON_DEFAULT_FP_FUSION", "TRITON_FORCE_DISABLE_FP_FUSION")],
        "vllm_target_device": os.environ.get("VLLM_TARGET_DEVICE"),
    }
    if not shares_kernel_bits():
        # The CPU's model and torch's capability: measured not to change a bit
        # only with MKL in its compatible mode and the interpreter's exp and log
        # defined (tests/test_output_digests.py); elsewhere answers stay per CPU.
        out |= cpu_identity()
    if device.type == "cuda":
        out["gpu"] = _gpu_identity(str(device))
    return out


def item_digest(kind: str, material: Any) -> str:
    """The second half of a key: the item's kind and its canonical material."""
    return _digest({"format": CACHE_FORMAT, "kind": kind, "item": material})
