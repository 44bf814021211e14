"""The pin: which upstream the oracle is, and fingerprints proving it still is.

``pin.json`` beside this file records upstream commit b38e111d3e (vllm PR
#50613), the release that first contains it (vllm==0.28.0), the version and
commit id that release reports, and a fingerprint (SHA-256 of the source text,
first 16 hex digits) of every vLLM symbol an oracle run executes.

The fingerprint set is derived, not chosen: :func:`record_fingerprints` traces
an oracle run at every level, the sparse path's included (:mod:`oracle.trace`),
and pins every vLLM function it entered, plus :data:`ALSO_PINNED` (the DCP
context loop, and the upstream code the sparse oracle transcribes). A test
traces again and fails on any entered symbol the pin lacks.

:func:`check_fingerprints` is what every oracle start runs: its first status is
the installed release (version and commit id against the pin), then one per
pinned symbol. A harness run refuses to start when any is not "ok", unless the
user overrides it; then every output is marked as overridden.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.environment import OracleUnavailable, import_vllm_module

PIN_FILE = Path(__file__).with_name("pin.json")
# The pins of the other releases the harness can call (``--oracle vllm==X``),
# one file each, same schema; their upstream_commit and upstream_pr may be null.
OTHER_PINS = Path(__file__).with_name("pins")

MLA = "vllm.model_executor.layers.attention.mla_attention"
SPARSE = "vllm.model_executor.layers.attention.sparse_mla_attention"

# The status line of the installed release in check_fingerprints().
RELEASE = "vllm._version"

# Upstream code the sparse oracle transcribes instead of calling it, each piece
# beside its source in oracle/sparse.py: the builder's use_dense_mha flag and the
# route's conjunctions (SPEC section 1d). No level enters them (each needs a whole
# engine), yet the oracle's routes are their text: a change to either is drift.
# Pinned for every release whose sparse path the harness runs (0.27.1's too).
TRANSCRIBED: tuple[str, ...] = (
    f"{MLA}:MLAAttention.forward_impl",
    f"{SPARSE}:SparseMLACommonMetadataBuilder.build",
)

# Upstream values (not code) the oracle's answers are read from: the masked-MHA
# threshold table and its buckets (_use_masked_mha reads them at every call) and
# the mask workspace's size. A function's fingerprint is its source, not the
# values it reads: an installed table off by one entry must refuse the start
# too. Pinned where the release has them (0.33.0 moved the table).
READ_VALUES: tuple[str, ...] = (
    f"{MLA}:_DSV32_MASKED_MHA_THRESHOLDS",
    f"{MLA}:_DSV32_SEQ_LEN_BUCKETS",
    f"{SPARSE}:GLOBAL_TOPK_MASK_MAX_BYTES",
)

# Pinned although no traced level enters them: SPEC section 2 names the DCP twin
# of the context loop as an oracle symbol, and forward_mha selects it whenever
# dcp_world_size > 1, but L3 runs without DCP here; :data:`TRANSCRIBED`; and
# :data:`READ_VALUES`.
ALSO_PINNED: tuple[str, ...] = (
    f"{MLA}:MLACommonBaseImpl._context_parallel_compute_prefill_context",
    *TRANSCRIBED,
    *READ_VALUES,
)

# The plain values :func:`fingerprint` hashes by their ``repr`` (no source to read).
VALUE_TYPES = (dict, list, tuple, frozenset, int, float, str, bytes)


def resolve(symbol: str) -> Any:
    """The object ``module:qual.name`` names in the installed vLLM."""
    module_name, _, qualname = symbol.partition(":")
    obj: Any = import_vllm_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def fingerprint(obj: Any) -> str:
    """SHA-256 (16 hex digits) of the source of a function, method, property
    (its getter), class (a dataclass: its fields generate its methods) or
    Triton kernel (its Python function: the interpreter runs it, the compiler
    compiles it), or of a plain value's ``repr`` (:data:`READ_VALUES`)."""
    if isinstance(obj, VALUE_TYPES):
        return hashlib.sha256(f"value {obj!r}".encode()).hexdigest()[:16]
    if isinstance(obj, property):
        obj = obj.fget
    elif not inspect.isclass(obj) and not inspect.isroutine(obj):
        # Triton wraps kernels (JITFunction / InterpretedFunction); hash the Python source.
        obj = getattr(obj, "fn", obj)
    source = inspect.getsource(obj)
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class SymbolStatus:
    symbol: str
    expected: str
    found: str | None
    status: str  # "ok", "mismatch" or "missing"

    def line(self) -> str:
        found = self.found or "-"
        return f"{self.status:8} {self.symbol}  pinned {self.expected}  installed {found}"


def load_pin(path: Path | None = None) -> dict[str, Any]:
    """The pin at ``path`` (default: the pinned release's, :data:`PIN_FILE`)."""
    from harness.cases.json_input import read_json

    data = read_json(path or PIN_FILE)
    if not isinstance(data, dict):
        from harness.cases.fields import CaseError

        raise CaseError(str(path or PIN_FILE), None, "a pin must be a JSON object")
    return data


def pin_file_for(release_version: str) -> Path:
    """The pin of ``release_version``: ``pin.json`` for the pinned release,
    ``pins/vllm-<version>.json`` for any other (which may not exist yet)."""
    if release_version == load_pin()["release_version"]:
        return PIN_FILE
    return OTHER_PINS / f"vllm-{release_version}.json"


def pinned_symbols() -> tuple[str, ...]:
    """The fingerprinted symbols, in the pin's order."""
    return tuple(load_pin()["fingerprints"])


# What check_fingerprints() reports on, in its order: the release, then every
# pinned symbol. A snapshot for callers that count the statuses; the pin file
# is the source.
SYMBOLS: tuple[str, ...] = (RELEASE, *pinned_symbols())


def installed_version() -> tuple[str, str | None]:
    version = import_vllm_module(RELEASE)
    return version.__version__, getattr(version, "commit_id", None)


def release_pin_document(symbols: Iterable[str]) -> dict[str, Any]:
    """The pin (schema of ``oracle/pin.json``) of the installed release over
    ``symbols``: its version, its commit id and every symbol's fingerprint; no
    upstream commit or PR, which only the pinned release names."""
    version, commit = installed_version()
    return {
        "upstream_commit": None,
        "upstream_pr": None,
        "release": f"vllm=={version}",
        "release_version": version,
        "release_commit_id": commit,
        "fingerprints": {symbol: fingerprint(resolve(symbol)) for symbol in sorted(set(symbols))},
    }


def check_release(path: Path | None = None) -> SymbolStatus:
    """The installed vLLM's version and commit id against the pin's release."""
    pin = load_pin(path)
    expected = f"{pin['release_version']} {pin['release_commit_id']}"
    version, commit = installed_version()
    found = f"{version} {commit}"
    return SymbolStatus(RELEASE, expected, found, "ok" if found == expected else "mismatch")


def check_fingerprints(path: Path | None = None) -> list[SymbolStatus]:
    """The installed release's status, then every symbol's the pin at ``path`` holds."""
    statuses = [check_release(path)]
    for symbol, pinned in load_pin(path)["fingerprints"].items():
        try:
            found: str | None = fingerprint(resolve(symbol))
        except (AttributeError, OSError, TypeError, OracleUnavailable):
            found = None
        status = "missing" if found is None else ("ok" if found == pinned else "mismatch")
        statuses.append(SymbolStatus(symbol, pinned, found, status))
    return statuses
