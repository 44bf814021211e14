"""The pin: which upstream the oracle is, and fingerprints proving it still is.

``pin.json`` beside this file records upstream commit b38e111d3e (vllm PR
#50613), the release that first contains it (vllm==0.28.0), the commit id that
release reports, and a fingerprint (SHA-256 of the source text, first 16 hex
digits) of every oracle symbol the harness calls. A harness run refuses to start
when an installed symbol's fingerprint differs, unless the user overrides it;
then every output is marked as overridden.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.environment import OracleUnavailable, import_vllm_module

PIN_FILE = Path(__file__).with_name("pin.json")

MLA = "vllm.model_executor.layers.attention.mla_attention"
SYMBOLS: tuple[str, ...] = (
    f"{MLA}:plan_mla_context_chunks",
    f"{MLA}:build_mla_chunked_context_metadata",
    f"{MLA}:init_mla_context_partial",
    f"{MLA}:neutralize_empty_context_partials",
    f"{MLA}:accumulate_mla_context_chunk",
    f"{MLA}:MLACommonBaseImpl._compute_prefill_context",
    f"{MLA}:MLACommonBaseImpl._context_parallel_compute_prefill_context",
    f"{MLA}:align_mla_chunked_context_workspace_size",
    f"{MLA}:MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size",
    "vllm.v1.attention.backends.utils:get_dcp_local_seq_lens",
    "vllm.v1.attention.ops.merge_attn_states:merge_attn_states",
    "vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states",
    "vllm.v1.attention.ops.triton_merge_attn_states:merge_attn_states_kernel",
)


def resolve(symbol: str) -> Any:
    module_name, _, qualname = symbol.partition(":")
    obj: Any = import_vllm_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def fingerprint(obj: Any) -> str:
    # Triton wraps kernels (JITFunction / InterpretedFunction); hash the Python source.
    source = inspect.getsource(getattr(obj, "fn", obj))
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


def load_pin() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PIN_FILE.read_text(encoding="utf-8"))
    return data


def installed_version() -> tuple[str, str | None]:
    version = import_vllm_module("vllm._version")
    return version.__version__, getattr(version, "commit_id", None)


def check_fingerprints() -> list[SymbolStatus]:
    expected = load_pin()["fingerprints"]
    statuses = []
    for symbol in SYMBOLS:
        try:
            found: str | None = fingerprint(resolve(symbol))
        except (AttributeError, OSError, TypeError, OracleUnavailable):
            found = None
        pinned = expected.get(symbol, "")
        status = "missing" if found is None else ("ok" if found == pinned else "mismatch")
        statuses.append(SymbolStatus(symbol, pinned, found, status))
    return statuses


def record_fingerprints() -> dict[str, str]:
    """Rewrite the pin's fingerprints from the installed vLLM (maintainers only,
    after checking the installed release is the pinned one)."""
    pin = load_pin()
    pin["fingerprints"] = {symbol: fingerprint(resolve(symbol)) for symbol in SYMBOLS}
    PIN_FILE.write_text(json.dumps(pin, indent=2) + "\n", encoding="utf-8")
    return dict(pin["fingerprints"])
