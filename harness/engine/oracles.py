"""The oracle, opened behind its fingerprint check: the pinned release in this
process, or another release served from its own environment (:mod:`oracle.process`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.engine.errors import UsageError
from harness.protocol.port import Port
from harness.sides.loading import close_port

# One oracle symbol's check: (symbol, status, pinned fingerprint, installed one or None).
FingerprintStatus = tuple[str, str, str, str | None]


def _pinned_oracle(
    pin: dict[str, Any], cache: bool, cache_dir: str | None
) -> tuple[Port, dict[str, Any], str, str | None, list[FingerprintStatus]]:
    """The pinned release in this process: its side, identity, installed
    version and commit, and each symbol's fingerprint status."""
    from harness.sides.oracle_cache_store import default_cache_directory
    from oracle.environment import OracleUnavailable
    from oracle.pin_record import checked_fingerprints

    # With the cache, the check's record of this very installation (the
    # bytes of vLLM's sources among its key) stands in for importing vLLM.
    records = (Path(cache_dir) if cache_dir else default_cache_directory()) if cache else None
    try:
        from oracle.side import OracleSide

        checked = checked_fingerprints(records)
        statuses = [(s.symbol, s.status, s.expected, s.found) for s in checked.statuses]
        side: Port = OracleSide()
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    identity = {k: pin[k] for k in ("upstream_commit", "upstream_pr", "release")}
    return side, identity, checked.version, checked.commit, statuses


def open_oracle(
    allow_drift: bool, oracle: str | None = None, cache: bool = False, cache_dir: str | None = None
) -> tuple[Port, dict[str, Any]]:
    """The oracle side and the provenance every output carries.

    ``cache``: the side answers from the oracle cache (:mod:`harness.sides.oracle_cache`:
    in memory, and on disk for a later run) whatever it has computed before for
    the same oracle; run, gate, nightly, mutants and explore ask for it unless
    ``--no-oracle-cache``; its entries go under ``cache_dir`` (None: the cache's default).

    ``oracle`` is ``--oracle``: the pinned release in-process (None or its
    ``vllm==X``, the default), or ``vllm==X`` for any other release served from its own environment
    (:mod:`oracle.process`). Refuses (UsageError, one line naming the symbol)
    when an oracle symbol's fingerprint differs from that release's pin, or the
    release has no pin, unless ``allow_drift``.
    """
    from oracle.pin import load_pin

    pin = load_pin()
    release = None if oracle is None else release_of(oracle)
    if release is None or release == pin["release_version"]:
        side, identity, version, commit, statuses = _pinned_oracle(pin, cache, cache_dir)
    else:
        side, identity, version, commit, statuses = _oracle_process(release)
    bad = [s for s in statuses if s[1] != "ok"]
    if bad and not allow_drift:
        symbol, status, expected, found = bad[0]
        close_port(side)
        raise UsageError(
            f"oracle fingerprint {status}: {symbol} (pinned {expected}, installed {found or 'absent'}); "
            "pass --allow-oracle-drift to run anyway"
        )
    provenance = {
        **identity,
        "installed_vllm": version,
        "installed_commit_id": commit,
        "fingerprints": {symbol: status for symbol, status, _, _ in statuses},
        "oracle_drift_overridden": bool(bad),
    }
    if cache:
        from harness.sides.oracle_cache import with_oracle_cache

        side = with_oracle_cache(side, provenance, directory=Path(cache_dir) if cache_dir else None)
    return side, provenance


def release_of(oracle: str) -> str:
    """``--oracle``'s release: ``vllm==X.Y.Z`` -> ``X.Y.Z`` (UsageError otherwise)."""
    from oracle.process import OracleSpecError, parse_release

    try:
        return parse_release(oracle)
    except OracleSpecError as exc:
        raise UsageError(str(exc)) from None


def _oracle_process(release: str) -> tuple[Port, dict[str, Any], str, str | None, list[FingerprintStatus]]:
    """Another release's oracle process, its identity and its pin's statuses."""
    from oracle.environment import OracleUnavailable, prepare_environment
    from oracle.process import OracleProcessError, OracleSpecError, open_oracle_process

    try:
        # No vLLM is imported here, which would have set the device's recipe; the
        # port's kernels need it all the same.
        prepare_environment()
        side, hello = open_oracle_process(release)
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    except (OracleSpecError, OracleProcessError) as exc:
        raise UsageError(str(exc)) from None
    commit = hello.get("installed_commit_id")
    pin = hello.get("pin")
    identity = {
        "release": f"vllm=={release}",
        # A release has no upstream commit of its own beyond the one it was built from.
        "upstream_commit": (pin or {}).get("upstream_commit") or commit,
        "upstream_pr": (pin or {}).get("upstream_pr"),
        # Its own environment's versions: not this process's.
        "oracle_environment": hello.get("environment"),
    }
    statuses: list[FingerprintStatus]
    if pin is None:
        statuses = [(f"oracle/pins/vllm-{release}.json", "missing", "a pin", None)]
    else:
        statuses = [(s["symbol"], s["status"], s["expected"], s["found"]) for s in hello.get("fingerprints", [])]
    return side, identity, str(hello.get("installed_vllm")), commit, statuses


def drift_banner(provenance: dict[str, Any]) -> str | None:
    """The warning every output of a run with overridden fingerprints carries."""
    if not provenance.get("oracle_drift_overridden"):
        return None
    drifted = [k for k, v in provenance["fingerprints"].items() if v != "ok"]
    return f"WARNING: oracle fingerprints overridden ({len(drifted)} drifted: {', '.join(drifted)})"
