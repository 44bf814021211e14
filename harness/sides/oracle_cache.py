"""The oracle, once: its answers kept by (oracle fingerprint, item digest).

:class:`CachedOracle` wraps the oracle side (any :class:`~harness.protocol.port.Port`).
The first time an item is asked it calls the oracle and keeps the answer; every
later time it hands the kept answer back without calling the oracle. Answers
are kept in two places:

- memory, one store per :class:`CachedOracle` (this module), so every port a
  run compares against one oracle object (the nightly's ports, the kill
  matrix's mutants, explore's candidates) shares the oracle's work, bounded by
  :data:`DEFAULT_MEMORY_LIMIT_BYTES` (tensors by their bytes, layouts and the
  rest by their Python objects'; the oldest entries go first);
- disk, one file per entry under
  :func:`~harness.sides.oracle_cache_store.default_cache_directory`
  (:mod:`harness.sides.oracle_cache_store`: where, in what format, and when a
  folder is pruned).

A key is :mod:`harness.sides.oracle_cache_keys`' (who the oracle is, what the
item is); what is kept of an answer and how a hit hands it back is
:mod:`harness.sides.oracle_cache_answers`'. Each of those modules states its
own invariants in full; these are the ones a reader of the wrapper must keep.

Invariants:

- A hit is the fresh answer, bit for bit (and an error the same error):
  :mod:`harness.sides.oracle_cache_answers`. Every hit returns new tensors:
  nothing a caller does to them reaches the store. Every layout
  :meth:`CachedOracle.plan_layout` returns has passed
  :func:`harness.protocol.port.check_layout` (``returns_checked_layouts``).
- The sparse levels' answers go to disk only when the oracle names the vLLM
  sources its sparse path runs (they are part of the fingerprint,
  :func:`~harness.sides.oracle_cache_keys.sparse_sources`); otherwise in memory only.
- Another pin, release, fingerprint or translation is another key
  (:func:`~harness.sides.oracle_cache_keys.oracle_fingerprint`). An oracle run
  with its fingerprints overridden (``--allow-oracle-drift``) is kept in memory
  only: its provenance says a symbol drifted, not what it drifted to; so is one
  whose provenance is not plain JSON (:func:`with_oracle_cache`).
- What cannot be digested (:class:`~harness.sides.oracle_cache_keys.Uncacheable`)
  is passed to the oracle uncached (``bypassed``), and an answer that cannot be
  stored is handed on unkept. Real DCP ranks never reach this object:
  :mod:`harness.sides.dcp_ranks` runs its own oracle on each rank.
- A tensor entry records the machine that computed it
  (:func:`harness.kernels.machine.machine_label`), outside the key. Read on
  another machine, the first :data:`ELSEWHERE_CHECKS` of each kind are asked of
  the oracle again and its answer is handed out; one that differs (any bit) is
  said on stderr once, and from then on every answer written elsewhere is
  asked afresh: another machine's bits are never charged to the port.
- A disk entry that cannot be read, or whose answer is not its kind's (checked
  as strictly for the sparse kinds as for the dense ones,
  :mod:`harness.sides.oracle_cache_store`), is a miss (``unreadable``) and the fresh
  answer replaces it; a folder that cannot be written is counted
  (``write_failures``) and the run goes on. The cache never fails an item.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.model import Case, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase
from harness.protocol.port import Port, port_levels
from harness.sides.oracle_cache_answers import (
    KeptError,
    KeptTensors,
    handed_out,
    kept_error,
    rebuilt_error,
)
from harness.sides.oracle_cache_keys import (
    CACHE_FORMAT,
    Uncacheable,
    canonical,
    drift_overridden,
    item_digest,
    kernels_identity,
    numeric_environment,
    oracle_fingerprint,
    sparse_sources,
)
from harness.sides.oracle_cache_store import (
    decode_json_entry,
    decode_tensor_entry,
    default_cache_directory,
    encode_json_entry,
    encode_tensor_entry,
    entry_format,
    entry_header,
    prune_stale_folders,
    sealed,
    tensor_entry_writer,
    unsealed,
    write_atomically,
)

if TYPE_CHECKING:
    # The numeric levels' types: a layout-only run never loads torch.
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs

DEFAULT_MEMORY_LIMIT_BYTES = 1 << 30


_INT_BYTES = 28


def _memory_bytes(kept: Any) -> int:
    """What a kept answer costs the memory store: its tensors' bytes, or for a
    layout, an int or an error the size of its Python objects (a night keeps
    tens of thousands of layouts: they count against the limit too)."""
    if isinstance(kept, KeptTensors):
        return kept.nbytes
    size, pending, seen = 0, [kept], set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if type(value) is Layout:
            size += _layout_bytes(value)
            continue
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


def _layout_bytes(layout: Layout) -> int:
    """:func:`_memory_bytes`'s estimate for a layout, counted field by field
    without the general walk (a ci run keeps thousands of layouts of about 25
    chunks): each tuple its own size and an int's per element, each other value
    one int's; shared objects are counted each time (an estimate for the memory
    store's limit, never part of an answer)."""
    size = sys.getsizeof(layout) + sys.getsizeof(layout.chunks)
    size += sys.getsizeof(layout.empty_token_slices) + 3 * _INT_BYTES * len(layout.empty_token_slices)
    for chunk in layout.chunks:
        size += sys.getsizeof(chunk)
        for value in vars(chunk).values():
            if type(value) is tuple and value and type(value[0]) is tuple:  # a tuple per rank
                size += sys.getsizeof(value) + sum(sys.getsizeof(v) + _INT_BYTES * len(v) for v in value)
            elif type(value) is tuple:
                size += sys.getsizeof(value) + _INT_BYTES * len(value)
            elif value is not None:
                size += _INT_BYTES
    return size


STAT_NAMES = (
    "memory_hits",
    "disk_hits",
    "misses",
    "bypassed",
    "stored",
    "unreadable",
    "write_failures",
    "elsewhere_checked",
    "elsewhere_disagreed",
)
# How many tensor answers written on another machine (another CPU model, torch
# capability, numpy SIMD or BLAS mode: the key does not tell them apart where
# the kernels were shown to agree) each kind asks the oracle again, per process.
ELSEWHERE_CHECKS = 2


class CachedOracle:
    """``oracle`` with its answers kept (module docstring); everything else it
    has (``close``, ``upstream_metadata``, ``hello`` ...) is the oracle's own."""

    # Every layout plan_layout returns has passed harness.protocol.port.check_layout: a fresh
    # answer is checked before it is kept (a mistyped one raises PortValueError), a
    # kept one was checked when kept and decodes to the same exact types. The
    # runner skips its own check of the oracle's layout on this promise.
    returns_checked_layouts = True
    # Asking it again is cheap: harness.search.coverage_measuring asks it for layouts
    # rather than for the oracle's planner alone, which no cache can keep.
    keeps_answers = True

    def __init__(
        self,
        oracle: Port,
        fingerprint: str,
        directory: Path | None,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
        *,
        sparse_on_disk: bool = False,
    ) -> None:
        self.wrapped = oracle
        # Whether the fingerprint holds the sparse path's vLLM sources
        # (harness.sides.oracle_cache_keys.sparse_sources): without, sparse answers stay in memory.
        self.sparse_on_disk = sparse_on_disk
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
        # Answers written elsewhere asked again, per kind; once one differs, every one is.
        self._checked_elsewhere: dict[str, int] = {}
        self._distrust_elsewhere = False

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

    # -- the oracle's questions: the dense levels' four, the sparse levels' five

    def plan_layout(self, case: Case) -> Layout:
        answer: Layout = self._answer("layout", lambda: canonical(case), lambda: self.wrapped.plan_layout(case))
        return answer

    def workspace_size(self, config: WorkspaceConfig) -> int:
        answer: int = self._answer("workspace", lambda: canonical(config), lambda: self.wrapped.workspace_size(config))
        return answer

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        def material() -> Any:
            return {"inputs": canonical(inputs), "environment": _environment_of(inputs.prefix_output, "merge")}

        merge = self.wrapped.merge_states  # type: ignore[attr-defined]
        answer: tuple[torch.Tensor, torch.Tensor] = self._answer("merge", material, lambda: merge(inputs))
        return answer

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        prefill = self.wrapped.prefill  # type: ignore[attr-defined]
        answer: dict[str, torch.Tensor] = self._answer(
            "prefill", lambda: _l3_material(case, inputs, kernels, inputs.q), lambda: prefill(case, inputs, kernels)
        )
        return answer

    # The oracle's own method is looked up before any question is asked: an
    # oracle without the level raises AttributeError, which is no answer to keep.

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        plan = self.wrapped.plan_sparse  # type: ignore[attr-defined]
        answer: SparseLayout = self._answer("sparse-layout", lambda: canonical(case), lambda: plan(case))
        return answer

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        size = self.wrapped.sparse_workspace_size  # type: ignore[attr-defined]
        answer: int = self._answer("sparse-workspace", lambda: canonical(config), lambda: size(config))
        return answer

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        build = self.wrapped.build_topk_mask  # type: ignore[attr-defined]
        answer: torch.Tensor = self._answer(
            "sparse-mask", lambda: _topk_material(case, topk), lambda: build(case, topk)
        )
        return answer

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        remap = self.wrapped.remap_topk  # type: ignore[attr-defined]
        answer: list[torch.Tensor] = self._answer(
            "sparse-remap", lambda: _topk_material(case, topk), lambda: remap(case, topk)
        )
        return answer

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        prefill = self.wrapped.sparse_prefill  # type: ignore[attr-defined]
        answer: dict[str, torch.Tensor] = self._answer(
            "sparse-prefill",
            lambda: _l3_material(case, inputs, kernels, inputs.prefill.q),
            lambda: prefill(case, inputs, kernels),
        )
        return answer

    # -- the cache

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _answer(self, kind: str, material: Callable[[], Any], ask: Callable[[], Any]) -> Any:
        try:
            item = item_digest(kind, material())
        except Uncacheable:
            self._count("bypassed")
            answer = ask()
            entry = entry_format(kind)
            return entry.keep(answer) if entry.keep_is_the_oracles_check else answer
        key = f"{kind}-{item}"
        with self._lock:
            held = self._memory.get(key)
            kept = held[0] if held is not None else None
            if held is not None:
                self._memory.move_to_end(key)
                self._counts["memory_hits"] += 1
        if kept is None:
            kept, writer = self._read(kind, item)
            if kept is not None:
                self._count("disk_hits")
                if self._check_elsewhere(kind, kept, writer):
                    return self._asked_again(kind, item, writer, kept, ask)
                self._remember(key, kept)
        if kept is not None:
            return self._hand_out(kept)
        self._count("misses")
        try:
            answer = ask()
        except BaseException as exc:
            error = kept_error(exc)
            if error is not None:
                self._keep(kind, item, key, error)
            raise
        entry = entry_format(kind)
        if entry.keep_is_the_oracles_check:
            # returns_checked_layouts: whatever the check raises is the oracle's error.
            stored = entry.keep(answer)
        else:
            try:
                stored = entry.keep(answer)
            except (Uncacheable, ValueError, TypeError):
                return answer
        with contextlib.suppress(Uncacheable, ValueError, TypeError):
            self._keep(kind, item, key, stored)
        return answer

    def _check_elsewhere(self, kind: str, kept: Any, writer: str | None) -> bool:
        """Whether a tensor answer read from disk is asked of the oracle again:
        one written on another machine, the first :data:`ELSEWHERE_CHECKS` of
        its kind, or every one once one has differed."""
        if not isinstance(kept, KeptTensors):
            return False  # layouts and sizes: host work, the same on every machine
        from harness.kernels.machine import machine_label

        if writer == machine_label():
            return False
        with self._lock:
            if self._distrust_elsewhere:
                return True
            checked = self._checked_elsewhere.get(kind, 0)
            self._checked_elsewhere[kind] = checked + 1
            return checked < ELSEWHERE_CHECKS

    def _asked_again(self, kind: str, item: str, writer: str | None, kept: KeptTensors, ask: Callable[[], Any]) -> Any:
        """The oracle's own answer, held against the one another machine wrote:
        on a difference the run goes on with this machine's answers only (every
        later one written elsewhere is asked too) and says so on stderr once."""
        answer = ask()
        self._count("elsewhere_checked")
        try:
            fresh = entry_format(kind).keep(answer)
        except (Uncacheable, ValueError, TypeError):
            fresh = None
        if not isinstance(fresh, KeptTensors) or not _same_bits(fresh, kept):
            self._count("elsewhere_disagreed")
            with self._lock:
                first, self._distrust_elsewhere = not self._distrust_elsewhere, True
                self._memory.clear()
                self._memory_bytes = 0
            if first:
                print(
                    f"oracle cache: an answer written on {writer or 'an unnamed machine'} differs from this "
                    f"machine's oracle ({kind} {item[:12]}); answers written elsewhere are asked afresh for the "
                    "rest of this run",
                    file=sys.stderr,
                )
        return answer

    @staticmethod
    def _hand_out(kept: Any) -> Any:
        if isinstance(kept, KeptError):
            raise rebuilt_error(kept)
        if isinstance(kept, KeptTensors):
            return handed_out(kept)
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
        if not self._on_disk(kind):
            return
        header = entry_header(self.fingerprint, item, kind)
        try:
            if entry_format(kind).json:
                data = encode_json_entry(header, kept)
            else:
                from harness.kernels.machine import machine_label

                data = encode_tensor_entry(header, kept, machine_label())
            write_atomically(self._path(kind, item), sealed(data))
        except Exception:
            self._count("write_failures")

    def _on_disk(self, kind: str) -> bool:
        return self.directory is not None and (self.sparse_on_disk or not entry_format(kind).sparse)

    def _path(self, kind: str, item: str) -> Path:
        assert self.directory is not None
        suffix = ".json" if entry_format(kind).json else ".safetensors"
        return self.directory / f"{kind}-{item}{suffix}"

    def _read(self, kind: str, item: str) -> tuple[Any, str | None]:
        """The disk entry's answer and which machine wrote it (tensor entries),
        or (None, None) (missing, or unreadable: counted)."""
        if not self._on_disk(kind):
            return None, None
        try:
            data = self._path(kind, item).read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError:
            self._count("unreadable")
            return None, None
        header = entry_header(self.fingerprint, item, kind)
        try:
            data = unsealed(data)
            if entry_format(kind).json:
                return decode_json_entry(data, header), None
            return decode_tensor_entry(data, header), tensor_entry_writer(data)
        except Exception:
            self._count("unreadable")
            return None, None


def _same_bits(a: KeptTensors, b: KeptTensors) -> bool:
    """The same form, names, dtypes, shapes and bytes (bit patterns: -0.0 is not +0.0)."""
    import torch

    if a.form != b.form or [n for n, _ in a.items] != [n for n, _ in b.items]:
        return False
    for (_, x), (_, y) in zip(a.items, b.items, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        x_bytes = x.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        y_bytes = y.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(x_bytes, y_bytes):
            return False
    return True


def _environment_of(tensor: Any, what: str) -> dict[str, Any]:
    """The numeric environment of the device ``tensor`` is on (Uncacheable for
    inputs that are not plain tensors)."""
    import torch

    if type(tensor) is not torch.Tensor:
        raise Uncacheable(f"{what} inputs without tensors")
    return numeric_environment(tensor.device)


def _l3_material(case: Case | SparseCase, inputs: object, kernels: SharedKernels, queries: torch.Tensor) -> object:
    """An L3 question's key material (dense or sparse): the whole case, every
    input tensor, the shared kernels, and the environment of the device the
    queries are on."""
    return {
        "case": canonical(case),
        "inputs": canonical(inputs),
        "kernels": kernels_identity(kernels),
        "environment": _environment_of(queries, "prefill"),
    }


def _topk_material(case: TopkMaskCase, topk: list[torch.Tensor]) -> Any:
    if type(topk) is not list or not topk:
        raise Uncacheable("top-k indices that are not a list of tensors")
    return {"case": canonical(case), "topk": canonical(topk), "environment": _environment_of(topk[0], "top-k mask")}


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
    sparse = sparse_sources(oracle)
    try:
        fingerprint = oracle_fingerprint(oracle, provenance, sparse)
    except (TypeError, ValueError):
        fingerprint, memory_only = "unfingerprinted", True
    on_disk = not memory_only and not drift_overridden(provenance)
    folder = (directory or default_cache_directory()) if on_disk else None
    cached = CachedOracle(oracle, fingerprint, folder, memory_limit_bytes, sparse_on_disk=sparse is not None)
    if cached.directory is not None:
        prune_stale_folders(cached.directory)
    return cached
