"""What a release other than the pinned one executes as the oracle, and its pin.

``--oracle vllm==X`` and the drift watch (``parity drift``) serve release X
from its own environment (:mod:`oracle.serve`). Its side is
:class:`oracle.side.OracleSide` (every release from 0.28.0 on) or the legacy
side (0.27.1, :mod:`oracle.legacy_pin`); either way its pin,
``oracle/pins/vllm-X.json`` (schema of ``oracle/pin.json``), is derived, not
chosen: every vLLM symbol that side enters on the trace cases of
:mod:`oracle.trace` at every level, the sparse ones included, plus the symbols
no level enters that are pinned all the same (:data:`oracle.pin.ALSO_PINNED`:
the DCP context loop and the upstream code the sparse oracle transcribes) and,
where the release has them, :data:`LATER_TRANSCRIBED`.

Run inside the release's environment (maintainers only)::

    .tox/vllm-X/bin/python -m oracle.release_pin --write-pin   # rewrite oracle/pins/vllm-X.json
    .tox/vllm-X/bin/python -m oracle.release_pin --trace OUT   # {symbol: levels} as JSON into OUT

The second is what the drift watch reads: which levels of this release's side
enter each symbol (a symbol belongs to the levels whose trace enters it). A
release may refuse a trace case the pinned release runs (0.33.0 routes one of
the sparse L3 batches ``masked-mha-overflow``): the trace goes up to that
refusal, as 0.27.1's does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from oracle.pin import (
    ALSO_PINNED,
    MLA,
    OTHER_PINS,
    READ_VALUES,
    installed_version,
    load_pin,
    release_pin_document,
    resolve,
)

# Upstream code a later release moved the sparse route's conjunctions into:
# 0.33.0's ``MLAAttention._use_sparse_mha`` holds what 0.28.0's ``forward_impl``
# held (oracle/sparse.py transcribes 0.28.0's). Pinned where the release has it.
LATER_TRANSCRIBED: tuple[str, ...] = (f"{MLA}:MLAAttention._use_sparse_mha",)


def release_trace() -> dict[str, list[str]]:
    """Every symbol the installed release's side enters at every level, with the
    levels that enter it (``workspace`` is the layout level's workspace size)."""
    from oracle.legacy import LEGACY_VERSION

    version, _ = installed_version()
    if version == LEGACY_VERSION:
        from oracle.legacy_pin import trace_legacy

        return trace_legacy()
    from oracle.sparse_prefill import RouteNotCompared
    from oracle.trace import trace_in_process

    return trace_in_process(refusals=(RouteNotCompared,))


def _resolvable(symbol: str) -> bool:
    try:
        resolve(symbol)
    except AttributeError:
        return False
    return True


def release_pin() -> dict[str, Any]:
    """The pin of the installed release (not the pinned one): version, commit id
    and the fingerprint of every symbol :func:`release_trace` enters, of
    :data:`~oracle.pin.ALSO_PINNED` and of the :data:`LATER_TRANSCRIBED` it has."""
    from oracle.legacy import LEGACY_VERSION

    version, _ = installed_version()
    if version == load_pin()["release_version"]:
        raise ValueError(f"vllm {version} is the pinned release: its pin is oracle/pin.json (parity oracle --record)")
    if version == LEGACY_VERSION:
        from oracle.legacy_pin import legacy_pin

        return legacy_pin()
    later = [s for s in LATER_TRANSCRIBED if _resolvable(s)]
    also = [s for s in ALSO_PINNED if s not in READ_VALUES or _resolvable(s)]
    return release_pin_document([*release_trace(), *also, *later])


USAGE = "usage: python -m oracle.release_pin --write-pin | --trace OUT"


def main(argv: list[str]) -> int:
    from oracle.environment import prepare_cpu_environment

    if argv not in (["--write-pin"],) and not (len(argv) == 2 and argv[0] == "--trace"):
        print(USAGE, file=sys.stderr)
        return 2
    prepare_cpu_environment()
    if argv[0] == "--trace":
        Path(argv[1]).write_text(json.dumps(release_trace(), indent=2) + "\n", encoding="utf-8")
        return 0
    try:
        pin = release_pin()
    except ValueError as exc:
        print(f"python -m oracle.release_pin: {exc}", file=sys.stderr)
        return 2
    path = OTHER_PINS / f"vllm-{pin['release_version']}.json"
    path.write_text(json.dumps(pin, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path} ({len(pin['fingerprints'])} symbols)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
