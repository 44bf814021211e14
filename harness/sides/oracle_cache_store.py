"""The oracle cache on disk: where its entries live, their bytes, and pruning old folders.

One file per entry under :func:`default_cache_directory`:
``$PARITY_ORACLE_CACHE`` when set, else the user's cache directory
(``$XDG_CACHE_HOME/mla-parity/oracle``, by default
``~/.cache/mla-parity/oracle``), in a folder per cache format and fingerprint
(``format-N/FINGERPRINT[:32]``, :class:`harness.sides.oracle_cache.CachedOracle`).
Not ``reports/``: entries are no report, they survive cleaning a checkout, and
every worktree of the same sources shares them (the fingerprint covers the
sources, so sharing is safe). The folder may be deleted at any time; it only
costs oracle calls. A fingerprint's folder that no run has opened for
:data:`STALE_AFTER_S` (two weeks) is deleted by the next run that opens the
cache (:func:`prune_stale_folders`).

An entry is JSON (a layout, a sparse layout, a workspace size or an error:
:func:`encode_json_entry`; the kinds of :data:`ENTRY_FORMATS` without a tensor form) or safetensors (the
tensors of a merge, a prefill, a sparse prefill, a top-k mask or a remap, or an
error: :func:`encode_tensor_entry`), its header naming its own key
(:func:`entry_header`), sealed by its SHA-256 (:func:`sealed`).

Invariants:

- Equal answers are equal bytes: the JSON's insertion order is fixed and a
  safetensors entry holds one metadata string. Changing any byte an entry holds
  changes the on-disk format: bump
  :data:`~harness.sides.oracle_cache_keys.CACHE_FORMAT`.
- A disk entry is written to a temporary file in its folder and renamed over
  its name (``os.replace``, :func:`write_atomically`): a reader sees no entry
  or a whole one, and two writers of one key write the same bytes. Its bytes
  end in their SHA-256. An entry that cannot be parsed, whose digest does not
  match (a flipped bit in a tensor), that does not name its own key, or whose
  answer is mistyped for its kind (the dense and the sparse kinds alike: a
  layout or sparse layout its check refuses, a size that is not an ``int``, an
  error that is not three strings, tensors of another form or names than the
  kind's, :meth:`EntryFormat.fits`),
  raises on decoding (the cache counts it ``unreadable``, a miss).
- Pruning never raises, and deletes only other fingerprints' folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.compare.sparse import check_sparse_layout
from harness.model import Chunk, Layout, expanded_runs
from harness.model.sparse import SparseLayout, sparse_layout_from_json
from harness.protocol.port import check_layout
from harness.sides.oracle_cache_answers import (
    KeptError,
    KeptTensors,
    error_of,
    fresh_copy,
    kept_tensors,
)
from harness.sides.oracle_cache_keys import CACHE_FORMAT, Uncacheable

if TYPE_CHECKING:
    # Imported where tensors are kept: a layout-only run never loads torch.
    import torch

ENVIRONMENT_VARIABLE = "PARITY_ORACLE_CACHE"
# A fingerprint's folder no run has opened for this long is deleted (prune_stale_folders).
STALE_AFTER_S = 14 * 24 * 3600.0
LAST_USED = ".last-used"


def default_cache_directory() -> Path:
    """``$PARITY_ORACLE_CACHE``, else ``$XDG_CACHE_HOME/mla-parity/oracle``, else
    ``~/.cache/mla-parity/oracle``."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mla-parity" / "oracle"


def entry_header(fingerprint: str, item: str, kind: str) -> dict[str, Any]:
    return {"format": CACHE_FORMAT, "fingerprint": fingerprint, "item": item, "kind": kind}


def _layout_of(data: dict[str, Any]) -> Layout:
    """The inverse of :meth:`Layout.to_json` for the store's own entries, without
    :func:`~harness.model.layout_from_json`'s per-field checks (which guard
    against a port's replies and cost as much as asking the pinned oracle
    again); the caller checks the result with :func:`check_layout` (the row maps
    are expanded from runs checked here, :data:`ROW_MAPS`)."""
    decoders = _chunk_decoders()
    chunks = []
    for fields in data["chunks"]:
        values: dict[str, Any] = {}
        for name, decode in decoders:
            value = fields[name]
            values[name] = value if value is None or decode is None else decode(value)
        chunks.append(Chunk(**values))
    return Layout(tuple(chunks), tuple((start, stop) for start, stop in data["empty_token_slices"]))


# The row-map fields, expanded from runs whose values and counts are checked to
# be ints: check_layout need not visit their millions of elements again.
ROW_MAPS = frozenset(name for name in Chunk.field_names() if name.endswith("token_to_seq"))


def _expanded_checked_runs(runs: Any) -> tuple[int, ...]:
    if type(runs) is not list or not all(
        type(run) is list and len(run) == 2 and type(run[0]) is int and type(run[1]) is int and run[1] >= 0
        for run in runs
    ):
        raise ValueError("a row map that is not a list of [value, count] int pairs")
    return expanded_runs(runs)


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
            decoders.append((name, _expanded_checked_runs))
        elif name == "local_context_lens_allranks":
            decoders.append((name, _ranks))
        else:
            decoders.append((name, tuple if name in sequences else None))
    return tuple(decoders)


def _sparse_layout_of(fields: dict[str, Any]) -> SparseLayout:
    """A sparse layout entry: the route's fields through the checked decoder;
    the chunks, which are most of it, through the store's own (as a dense layout's)."""
    sparse = sparse_layout_from_json({**fields, "layout": {"chunks": [], "empty_token_slices": []}})
    return check_sparse_layout(dataclasses.replace(sparse, layout=_layout_of(fields["layout"])), built=ROW_MAPS)


def _int_value(value: Any) -> int:
    if type(value) is not int:
        raise ValueError("the entry's value is not an int")
    return value


def _kept_size(answer: Any) -> int:
    if type(answer) is not int:
        raise Uncacheable(f"a workspace size of type {type(answer).__qualname__}")
    return answer


def _kept_merge(answer: Any) -> KeptTensors:
    if type(answer) is not tuple or len(answer) != 2:
        raise Uncacheable("a merge answer that is not (output, lse)")
    return kept_tensors("tuple", [("output", answer[0]), ("lse", answer[1])])


def _kept_named(answer: Any) -> KeptTensors:
    if type(answer) is not dict:
        raise Uncacheable(f"an answer of type {type(answer).__qualname__}, not a dict of tensors")
    return kept_tensors("dict", list(answer.items()))


def _kept_remap(answer: Any) -> KeptTensors:
    if type(answer) is not list:
        raise Uncacheable("a remap answer that is not a list")
    return kept_tensors("list", [(str(i), t) for i, t in enumerate(answer)])


@dataclass(frozen=True)
class EntryFormat:
    """How the cache keeps the answers of one oracle method (an entry's ``kind``).

    ``keep(answer)`` is the answer as the store keeps it, checked to come back
    exactly; an answer it cannot keep raises :class:`Uncacheable`,
    ``ValueError`` or ``TypeError`` and is handed on unkept, except where
    ``keep_is_the_oracles_check``: then what it raises is the oracle's own
    error (a layout the oracle gave that fails the layout check). A JSON entry
    (``form`` None) holds the answer under ``field`` and ``read`` gives it back
    from there; a tensor entry holds tensors of ``form`` (one of
    :data:`~harness.sides.oracle_cache_answers.TENSOR_FORMS`) named ``names``
    (None: any names, none twice; ``indexed``: "0", "1", ... in order).
    ``sparse`` entries are on disk only when the cache keeps the sparse path's."""

    keep: Callable[[Any], Any]
    form: str | None = None
    field: str = "value"
    read: Callable[[Any], Any] = _int_value
    names: tuple[str, ...] | None = None
    indexed: bool = False
    keep_is_the_oracles_check: bool = False
    sparse: bool = False

    @property
    def json(self) -> bool:
        return self.form is None

    def fits(self, form: str, names: list[str]) -> bool:
        """Whether tensors of ``form`` named ``names`` (in order) can be this kind's answer."""
        if self.json or form != self.form or not all(type(n) is str for n in names) or len(set(names)) != len(names):
            return False
        if self.indexed:
            return names == [str(i) for i in range(len(names))]
        return self.names is None or tuple(names) == self.names


# Every oracle method the cache keeps, by its entry kind (the oracle cache's own
# vocabulary: a remap is no item kind). Exact types (plain ints, bools and
# tuples) are what makes Layout.to_json and _layout_of invert each other; the
# runner checks the oracle's sparse layout itself, with its own message, so one
# the check refuses is handed on unkept.
ENTRY_FORMATS: dict[str, EntryFormat] = {
    "layout": EntryFormat(
        check_layout,
        field="layout",
        read=lambda fields: check_layout(_layout_of(fields), built=ROW_MAPS),
        keep_is_the_oracles_check=True,
    ),
    "workspace": EntryFormat(_kept_size),
    "merge": EntryFormat(_kept_merge, form="tuple", names=("output", "lse")),
    "prefill": EntryFormat(_kept_named, form="dict"),
    "sparse-layout": EntryFormat(check_sparse_layout, field="sparse_layout", read=_sparse_layout_of, sparse=True),
    "sparse-workspace": EntryFormat(_kept_size, sparse=True),
    "sparse-mask": EntryFormat(
        lambda answer: kept_tensors("tensor", [("mask", answer)]), form="tensor", names=("mask",), sparse=True
    ),
    "sparse-remap": EntryFormat(_kept_remap, form="list", indexed=True, sparse=True),
    "sparse-prefill": EntryFormat(_kept_named, form="dict", sparse=True),
}


def entry_format(kind: str) -> EntryFormat:
    """The format of ``kind``'s entries; ValueError for a kind the cache keeps none of."""
    try:
        return ENTRY_FORMATS[kind]
    except KeyError:
        raise ValueError(f"the cache keeps no entries of kind {kind!r}") from None


def encode_json_entry(header: dict[str, Any], answer: Any) -> bytes:
    payload = dict(header)
    if isinstance(answer, KeptError):
        payload["error"] = dataclasses.asdict(answer)
    elif isinstance(answer, Layout):
        payload["layout"] = answer.to_json()
    elif isinstance(answer, SparseLayout):
        payload["sparse_layout"] = answer.to_json()
    else:
        payload["value"] = answer
    # Insertion order is fixed, so equal answers are equal bytes without sorting.
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def decode_json_entry(data: bytes, header: dict[str, Any]) -> Any:
    payload = json.loads(data.decode("utf-8"))
    if not isinstance(payload, dict) or {k: payload.get(k) for k in header} != header:
        raise ValueError("the entry names another key")
    if "error" in payload:
        return error_of(payload["error"])
    entry = entry_format(header["kind"])
    if not entry.json:
        raise ValueError("the entry's kind keeps tensors, not JSON")
    return entry.read(payload[entry.field])


def encode_tensor_entry(
    header: dict[str, Any], answer: KeptTensors | KeptError, written_on: str | None = None
) -> bytes:
    """The entry's bytes; ``written_on`` (:func:`harness.kernels.machine.machine_label`)
    says which machine computed it, outside the key: another machine with the
    same key reads it, and checks a few (:class:`harness.sides.oracle_cache.CachedOracle`)."""
    import torch
    from safetensors.torch import save

    entry = dict(header)
    if written_on is not None:
        entry["written_on"] = written_on
    tensors: dict[str, torch.Tensor] = {}
    if isinstance(answer, KeptError):
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


def sealed(data: bytes) -> bytes:
    """``data`` followed by its SHA-256: a flipped bit anywhere is caught on reading."""
    return data + hashlib.sha256(data).digest()


def unsealed(stored: bytes) -> bytes:
    """What :func:`sealed` sealed; ValueError when the digest does not match."""
    data, seal = stored[:-32], stored[-32:]
    if len(stored) < 32 or hashlib.sha256(data).digest() != seal:
        raise ValueError("the entry's digest does not match its bytes")
    return data


def _tensor_entry_metadata(data: bytes) -> dict[str, Any]:
    # The format's header: its length (8 bytes, little-endian), then JSON whose
    # "__metadata__" holds the strings written beside the tensors.
    length = int.from_bytes(data[:8], "little")
    entry: dict[str, Any] = json.loads(json.loads(data[8 : 8 + length].decode("utf-8"))["__metadata__"]["entry"])
    return entry


def tensor_entry_writer(data: bytes) -> str | None:
    """Which machine wrote a tensor entry (``written_on``), or None when it does not say."""
    writer = _tensor_entry_metadata(data).get("written_on")
    return writer if isinstance(writer, str) else None


def decode_tensor_entry(data: bytes, header: dict[str, Any]) -> KeptTensors | KeptError:
    from safetensors.torch import load

    loaded = load(data)
    entry = _tensor_entry_metadata(data)
    if {key: entry.get(key) for key in header} != header:
        raise ValueError("the entry names another key")
    if "error" in entry:
        if loaded:
            raise ValueError("the entry holds an error and tensors")
        return error_of(entry["error"])
    listed, form = entry["tensors"], entry["form"]
    if type(listed) is not list or not all(_listed_tensor(t) for t in listed):
        raise ValueError("the entry's tensor list is not [name, device, stride] triples")
    names = [name for name, _, _ in listed]
    # The kind's form is one of TENSOR_FORMS (what handed_out makes of it).
    if sorted(names) != sorted(loaded) or not entry_format(header["kind"]).fits(form, names):
        raise ValueError("the entry's tensors are not the ones it lists, or not its kind's answer")
    items = tuple((name, fresh_copy(loaded[name], device, tuple(stride))) for name, device, stride in listed)
    return KeptTensors(form, items)


def _listed_tensor(value: Any) -> bool:
    """Whether ``value`` is one ``[name, device, stride]`` of an entry's tensor list."""
    return (
        type(value) is list
        and len(value) == 3
        and type(value[0]) is str
        and type(value[1]) is str
        and type(value[2]) is list
        and all(type(step) is int for step in value[2])
    )


def write_atomically(path: Path, data: bytes) -> None:
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
