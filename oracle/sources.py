"""The source text of vLLM symbols as the installed release has them.

Run inside any version's environment (the pinned ``.tox/oracle`` or a
``.tox/vllm-X``), so the drift watch can read each release's code without
importing two vLLMs into one process::

    python -m oracle.sources 'vllm.utils.math_utils:cdiv' ...
    echo '["vllm.utils.math_utils:cdiv"]' | python -m oracle.sources

prints one JSON object (:func:`collect`). Symbols are ``module:qual.name`` as
in ``oracle/pin.json``; they are resolved by :func:`oracle.pin.resolve`, so vLLM
is imported only through :func:`oracle.environment.import_vllm_module`.

Invariant: a symbol's source here is exactly the text :func:`oracle.pin.fingerprint`
hashes (same unwrapping of properties and Triton kernels), so its ``fingerprint``
equals the pin's whenever the source is unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import sys
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.json_input import parse_json
from oracle.environment import OracleUnavailable, import_vllm_module
from oracle.pin import VALUE_TYPES, resolve

# Exit codes: 0 the JSON was printed (a symbol that cannot be read is null in
# it, with its reason), 2 bad input (one line on stderr).
EXIT_OK, EXIT_USAGE = 0, 2


def source_object(obj: Any) -> Any:
    """What :func:`oracle.pin.fingerprint` reads the source of: a property's
    getter, a Triton kernel's Python function, else the object itself."""
    if isinstance(obj, property):
        return obj.fget
    if not inspect.isclass(obj) and not inspect.isroutine(obj):
        return getattr(obj, "fn", obj)
    return obj


def sha16(source: str) -> str:
    """The pin's fingerprint of a source text (SHA-256, first 16 hex digits)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def dataclass_fields(obj: Any) -> list[str] | None:
    """The field names of a dataclass, in declaration order; None otherwise."""
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    return None


def parameter_names(obj: Any) -> list[str] | None:
    """The parameter names of a function or method, in order; None otherwise."""
    if not inspect.isroutine(obj):
        return None
    try:
        return list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def installed_release() -> dict[str, str | None]:
    """The installed vLLM's version and commit id, and torch's version."""
    version = import_vllm_module("vllm._version")
    torch = import_vllm_module("torch")
    return {
        "vllm_version": str(version.__version__),
        "vllm_commit": getattr(version, "commit_id", None),
        "torch_version": str(torch.__version__),
    }


def collect(symbols: list[str]) -> dict[str, Any]:
    """``{"release": installed_release(), "sources": {symbol: text or None},
    "fingerprints": {symbol: sha16 or None}, "fields": {symbol: names} (dataclasses
    only), "parameters": {symbol: names} (functions and methods only), "errors":
    {symbol: one-line reason} (those whose source is None)}``."""
    sources: dict[str, str | None] = {}
    fingerprints: dict[str, str | None] = {}
    fields: dict[str, list[str]] = {}
    parameters: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for symbol in symbols:
        try:
            obj = resolve(symbol)
            # A pinned value's "source" is what its fingerprint hashes (oracle.pin.READ_VALUES).
            text = f"value {obj!r}" if isinstance(obj, VALUE_TYPES) else inspect.getsource(source_object(obj))
        except (AttributeError, OSError, TypeError, OracleUnavailable) as exc:
            sources[symbol] = fingerprints[symbol] = None
            errors[symbol] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            continue
        sources[symbol], fingerprints[symbol] = text, sha16(text)
        names = dataclass_fields(obj)
        if names is not None:
            fields[symbol] = names
        params = parameter_names(source_object(obj))
        if params is not None:
            parameters[symbol] = params
    return {
        "release": installed_release(),
        "sources": sources,
        "fingerprints": fingerprints,
        "fields": fields,
        "parameters": parameters,
        "errors": errors,
    }


def parse_symbols(argv: list[str], stdin_text: str | None) -> list[str]:
    """The symbols named on the command line, else the JSON list on stdin."""
    if argv:
        symbols = list(argv)
    else:
        try:
            loaded = parse_json(stdin_text or "", "stdin")
        except CaseError as exc:
            raise ValueError(f"stdin is not a JSON list of symbols ({exc.reason})") from None
        if not isinstance(loaded, list) or not all(isinstance(s, str) for s in loaded):
            raise ValueError("stdin must be a JSON list of strings 'module:qual.name'")
        symbols = loaded
    bad = [s for s in symbols if ":" not in s or not s.partition(":")[2]]
    if bad:
        raise ValueError(f"symbol {bad[0]!r} is not 'module:qual.name'")
    return symbols


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return EXIT_OK
    try:
        symbols = parse_symbols(args, None if args else sys.stdin.read())
        result = collect(symbols)
    except (ValueError, OracleUnavailable) as exc:
        print(f"oracle.sources: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
