"""The drift watch: what changed upstream between the pin and a newer release.

For each release two things are measured:

* **Source drift.** Every fingerprinted symbol (``oracle/pin.json``, plus any
  the release's own pin ``oracle/pins/vllm-X.json`` adds) is read from both
  installed releases by ``python -m oracle.sources`` in each one's environment,
  and diffed (:func:`symbol_drift`): a unified diff of the source text, the
  dataclass fields and function parameters added or removed, and the symbols
  missing from (or new in) the release.
* **Oracle-vs-oracle parity.** The pinned oracle (in-process) against the
  release's (:class:`oracle.process.OracleProcess`, in its own environment) on
  a suite at every level, the sparse ones included, with the harness's own
  runner (:mod:`harness.night.drift_items`): per item the layout or sparse
  layout fields, mask or remap, or tensors that changed.
* **Where, per level.** A symbol belongs to the levels whose trace enters it:
  the pinned release's (:func:`oracle.trace.trace_in_process`) and the
  release's own (``python -m oracle.release_pin --trace`` in its environment,
  :func:`read_trace`). Each level names the symbols it executes that the
  release changed, lacks or adds (:func:`level_symbol_drift`), and the
  transcribed upstream code its answers stand on (:data:`TRANSCRIBED_LEVELS`).

Invariants: the diff compares exactly the text :func:`oracle.pin.fingerprint`
hashes, so a symbol is "unchanged" exactly when both fingerprints agree. An
item the pinned oracle refuses is also asked of the release, so a refusal both
share is told apart from one only the pinned release makes.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases.json_input import read_json
from harness.model.levels import level_of, level_spec, registered_levels
from harness.night.drift_items import (
    AGREEING,
    AGREES,
    BOTH_REFUSE,
    ITEM_STATUSES,
    LAYOUT_ONLY,
    PINNED_ERROR,
    REFUSE_DIFFERENTLY,
    RELEASE_ERROR,
    ItemDrift,
    LevelDrift,
    changed_layout_fields,
    changed_sparse_fields,
    compare_oracles,
    error_class,
    item_drift,
    torch_note,
)

# The parity part lives in harness.night.drift_items; its names are this module's too.
__all__ = [
    "AGREEING",
    "BOTH_REFUSE",
    "ITEM_STATUSES",
    "LAYOUT_ONLY",
    "PINNED_ERROR",
    "REFUSE_DIFFERENTLY",
    "RELEASE_ERROR",
    "ItemDrift",
    "LevelDrift",
    "changed_layout_fields",
    "changed_sparse_fields",
    "compare_oracles",
    "error_class",
    "item_drift",
    "torch_note",
]

ROOT = Path(__file__).resolve().parents[2]
SOURCES_TIMEOUT_S = 900.0

# Symbol statuses.
UNCHANGED, CHANGED, MISSING, NEW = "unchanged", "changed", "missing", "new"


# Where ``parity drift`` writes by default, and the nightly reads the latest from.
DRIFT_REPORTS = Path(__file__).resolve().parents[2] / "reports" / "drift"


def latest_drift_report(folder: Path = DRIFT_REPORTS) -> tuple[Path, dict[str, Any]] | None:
    """The newest ``<date>.json`` in ``folder`` and its record; None when there is none."""
    files = sorted(folder.glob("20*.json")) if folder.is_dir() else []
    if not files:
        return None
    return files[-1], read_json(files[-1], what="not a drift report")


class DriftError(Exception):
    """Bad input or an environment that cannot serve; the message is one line."""


# -- releases ------------------------------------------------------------------------------


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def pinned_release() -> str:
    from oracle.pin import load_pin

    return str(load_pin()["release_version"])


def releases_with_requirements() -> list[str]:
    """Every release with ``requirements/vllm-X.Y.Z.txt`` here, oldest first (as
    :func:`oracle.process.known_releases`, without importing torch: ``--help`` names them)."""
    found = [p.stem.removeprefix("vllm-") for p in (ROOT / "requirements").glob("vllm-*.txt")]
    return sorted((v for v in found if re.fullmatch(r"\d+\.\d+\.\d+", v)), key=version_key)


def default_releases() -> list[str]:
    """Every release newer than the pin that has ``requirements/vllm-X.txt`` here, oldest first."""
    pin = version_key(pinned_release())
    return [v for v in releases_with_requirements() if version_key(v) > pin]


def parse_against(specs: Iterable[str]) -> list[str]:
    """``vllm==X.Y.Z`` values -> release versions, each with a requirements
    file and none the pin itself; duplicates once, in the order given."""
    from oracle.process import OracleSpecError, known_releases, parse_release, requirements_file

    releases: list[str] = []
    for spec in specs:
        try:
            release = parse_release(spec)
        except OracleSpecError:
            raise DriftError(f"--against {spec!r}: expected vllm==X.Y.Z (for example vllm==0.33.0)") from None
        if release == pinned_release():
            raise DriftError(f"--against {spec}: that is the pinned release; nothing to compare it with")
        if not requirements_file(release).is_file():
            known = ", ".join(f"vllm=={v}" for v in known_releases()) or "none"
            raise DriftError(f"--against {spec}: no requirements/vllm-{release}.txt (releases set up here: {known})")
        if release not in releases:
            releases.append(release)
    return releases


def drift_symbols(release: str, traced: Iterable[str] = ()) -> list[str]:
    """The pin's fingerprinted symbols, then those only the release's own pin
    holds, then any other the release's trace (``traced``) enters."""
    from oracle.pin import load_pin, pin_file_for, pinned_symbols

    symbols = list(pinned_symbols())
    own = pin_file_for(release)
    if own.is_file():
        symbols += [s for s in load_pin(own)["fingerprints"] if s not in symbols]
    symbols += sorted(s for s in set(traced) if s not in symbols)
    return symbols


def directory_bytes(path: Path) -> int:
    """Disk used under ``path`` (allocated blocks, as ``du -s`` counts them; links not followed)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


# -- source drift --------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSnapshot:
    """What ``python -m oracle.sources`` printed in one environment."""

    release: dict[str, Any]
    sources: dict[str, str | None]
    fingerprints: dict[str, str | None]
    fields: dict[str, list[str]]
    parameters: dict[str, list[str]]
    errors: dict[str, str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceSnapshot:
        return cls(
            release=dict(data["release"]),
            sources=dict(data["sources"]),
            fingerprints=dict(data["fingerprints"]),
            fields={k: list(v) for k, v in data.get("fields", {}).items()},
            parameters={k: list(v) for k, v in data.get("parameters", {}).items()},
            errors=dict(data.get("errors", {})),
        )

    @property
    def version(self) -> str:
        return str(self.release["vllm_version"])

    @property
    def torch_version(self) -> str:
        return str(self.release["torch_version"])


def _run_module(python: Path | str, args: list[str], stdin: str, timeout_s: float) -> str:
    """``python -m ARGS`` in the environment of ``python`` (nothing of this
    interpreter's settings reaches it); its stdout, or a one-line DriftError."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    command = f"{python} -m {args[0]}"
    try:
        done = subprocess.run(
            [str(python), "-m", *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriftError(f"{command}: {type(exc).__name__}: {exc}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise DriftError(f"{command} exited {done.returncode}: {tail[0]}")
    return done.stdout


def read_trace(python: Path | str, timeout_s: float = SOURCES_TIMEOUT_S) -> dict[str, list[str]]:
    """``{symbol: levels}``: what the oracle side of the release installed in the
    environment of ``python`` enters at every level (``python -m oracle.release_pin --trace``)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "trace.json"
        _run_module(python, ["oracle.release_pin", "--trace", str(out)], "", timeout_s)
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
            return {str(symbol): [str(level) for level in levels] for symbol, levels in data.items()}
        except (OSError, json.JSONDecodeError, AttributeError, TypeError) as exc:
            raise DriftError(f"{python} -m oracle.release_pin wrote no trace ({type(exc).__name__}: {exc})") from None


def read_sources(python: Path | str, symbols: list[str], timeout_s: float = SOURCES_TIMEOUT_S) -> SourceSnapshot:
    """Run ``python -m oracle.sources`` with ``symbols`` on stdin in the environment of ``python``."""
    stdout = _run_module(python, ["oracle.sources"], json.dumps(symbols), timeout_s)
    try:
        return SourceSnapshot.from_json(json.loads(stdout))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DriftError(f"{python} -m oracle.sources printed no snapshot ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class SymbolDrift:
    """One symbol between the pinned release and another.

    ``diff`` is the unified diff of the source (empty when unchanged, missing
    or new); ``fields_*`` (dataclasses) and ``parameters_*`` (functions) list
    names in the order the side that has them declares them."""

    symbol: str
    status: str
    pinned_fingerprint: str | None
    release_fingerprint: str | None
    diff: str = ""
    fields_added: tuple[str, ...] = ()
    fields_removed: tuple[str, ...] = ()
    parameters_added: tuple[str, ...] = ()
    parameters_removed: tuple[str, ...] = ()
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "status": self.status,
            "pinned_fingerprint": self.pinned_fingerprint,
            "release_fingerprint": self.release_fingerprint,
            "fields_added": list(self.fields_added),
            "fields_removed": list(self.fields_removed),
            "parameters_added": list(self.parameters_added),
            "parameters_removed": list(self.parameters_removed),
            "reason": self.reason,
            "diff": self.diff,
        }


def _added(before: list[str] | None, after: list[str] | None) -> tuple[str, ...]:
    if before is None or after is None:
        return ()
    return tuple(name for name in after if name not in before)


def source_diff(symbol: str, pinned: str, release: str, pinned_version: str, release_version: str) -> str:
    """A unified diff (3 lines of context) of one symbol's source; empty when equal."""
    a = [line if line.endswith("\n") else line + "\n" for line in pinned.splitlines()]
    b = [line if line.endswith("\n") else line + "\n" for line in release.splitlines()]
    return "".join(
        difflib.unified_diff(
            a, b, fromfile=f"vllm=={pinned_version} {symbol}", tofile=f"vllm=={release_version} {symbol}"
        )
    )


def symbol_drift(symbols: list[str], pinned: SourceSnapshot, release: SourceSnapshot) -> list[SymbolDrift]:
    """Each symbol's drift from ``pinned`` to ``release``, in ``symbols`` order."""
    drifts = []
    for symbol in symbols:
        a, b = pinned.sources.get(symbol), release.sources.get(symbol)
        fa, fb = pinned.fingerprints.get(symbol), release.fingerprints.get(symbol)
        if a is None and b is None:
            reason = release.errors.get(symbol) or pinned.errors.get(symbol)
            drifts.append(SymbolDrift(symbol, MISSING, None, None, reason=f"in neither release ({reason})"))
            continue
        if b is None:
            drifts.append(SymbolDrift(symbol, MISSING, fa, None, reason=release.errors.get(symbol)))
            continue
        if a is None:
            drifts.append(SymbolDrift(symbol, NEW, None, fb, reason=pinned.errors.get(symbol)))
            continue
        fields_a, fields_b = pinned.fields.get(symbol), release.fields.get(symbol)
        params_a, params_b = pinned.parameters.get(symbol), release.parameters.get(symbol)
        drifts.append(
            SymbolDrift(
                symbol,
                UNCHANGED if a == b else CHANGED,
                fa,
                fb,
                diff=source_diff(symbol, a, b, pinned.version, release.version) if a != b else "",
                fields_added=_added(fields_a, fields_b),
                fields_removed=_added(fields_b, fields_a),
                parameters_added=_added(params_a, params_b),
                parameters_removed=_added(params_b, params_a),
            )
        )
    return drifts


# -- the report record ---------------------------------------------------------------------


def symbol_counts(drifts: list[SymbolDrift]) -> dict[str, int]:
    counted = Counter(d.status for d in drifts)
    return {status: counted.get(status, 0) for status in (UNCHANGED, CHANGED, MISSING, NEW)}


def parity_verdict(levels: dict[str, LevelDrift]) -> str:
    """``parity`` when every level is, else each level's verdict that is not."""
    if not levels:
        return "no level compared"
    bad = [f"{level}: {drift.verdict()}" for level, drift in levels.items() if drift.verdict() != AGREES]
    return AGREES if not bad else "; ".join(bad)


def level_symbols(entered: dict[str, list[str]]) -> dict[str, list[str]]:
    """``{symbol: levels}`` (:func:`oracle.trace.trace_in_process`, whose
    "workspace" is part of the layout level; the sparse workspace size is
    traced as sparse-layout's) -> ``{level: symbols}``."""
    out: dict[str, list[str]] = {}
    for symbol, levels in sorted(entered.items()):
        for level in sorted({level_of(kind) for kind in levels}):
            out.setdefault(level, []).append(symbol)
    return out


def transcribed_levels() -> dict[str, tuple[str, ...]]:
    """The upstream code the sparse oracle transcribes instead of calling
    (:data:`oracle.pin.TRANSCRIBED`, and where a later release moved it,
    :data:`oracle.release_pin.LATER_TRANSCRIBED`), with the levels whose answers
    are its text: the route (sparse-layout) and the route a prefill runs on
    (sparse-prefill). No trace enters it; the oracle of every release applies
    the pin's transcription, so a change there is not measured by parity."""
    from oracle.pin import TRANSCRIBED
    from oracle.release_pin import LATER_TRANSCRIBED

    levels = tuple(spec.name for spec in registered_levels() if spec.transcribed)
    return {symbol: levels for symbol in (*TRANSCRIBED, *LATER_TRANSCRIBED)}


def level_symbol_drift(
    level: str,
    status: dict[str, str],
    pinned_levels: dict[str, list[str]],
    release_levels: dict[str, list[str]] | None,
) -> dict[str, Any]:
    """What ``level`` executes of vLLM and how the release moved it: the symbols
    the pinned trace and the release's trace (when read) enter at this level,
    those of them the release changed or lacks (``symbols_drifted``) or that are
    new in it (``symbols_new``), and the transcribed code the level's answers
    stand on with its status (``symbols_transcribed``)."""
    pinned = set(pinned_levels.get(level, []))
    release = set(release_levels.get(level, [])) if release_levels is not None else set()
    executed = sorted(pinned | release)
    out: dict[str, Any] = {"symbols_executed": len(executed), "symbols_executed_pinned": len(pinned)}
    if release_levels is not None:
        out["symbols_executed_release"] = len(release)
    out["symbols_drifted"] = [s for s in executed if status.get(s) in (CHANGED, MISSING)]
    out["symbols_new"] = [s for s in executed if status.get(s) == NEW]
    transcribed = {s: status.get(s, "not read") for s, lv in transcribed_levels().items() if level in lv}
    if transcribed:
        out["symbols_transcribed"] = transcribed
    return out


def sparse_note() -> str:
    """How the sparse levels' oracles decide the route, for the report."""
    from oracle.sparse import DSV32_HEADS

    return (
        "At the sparse levels each release's oracle calls that release's own sparse backend (workspace size, "
        "threshold, fit check, global and per-range masks, remap, masked context loop) and decides the route "
        "with the pin's transcription of the builder's `use_dense_mha` flag and of the route's conjunctions "
        "(oracle/sparse.py; per level below, transcribed). A release whose `_use_masked_mha` also asks the "
        "model's head dimensions and whether the batch has context (0.33.0: its threshold table is keyed by "
        f"them) is asked for DeepSeek-V3.2's heads (qk {DSV32_HEADS.qk_head_dim}, v {DSV32_HEADS.v_head_dim}), "
        "the model the pinned table is for, whatever a numeric case's scaled-down tensors are, and whether the "
        "batch has context."
    )


def release_record(
    pinned: SourceSnapshot,
    release: SourceSnapshot,
    drifts: list[SymbolDrift],
    levels: dict[str, LevelDrift],
    extra: dict[str, Any],
    entered: dict[str, list[str]] | None = None,
    release_entered: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """One release's part of the drift report (``extra``: its environment,
    disk, timings, the release's own pin statuses, as measured by the caller).

    With ``entered`` (the symbols each level of the pinned oracle executes) and
    ``release_entered`` (the release's side's, when traced), each level also
    names those of its symbols the release changed, lacks or adds, and the
    transcribed code its answers stand on: where a divergence at that level can
    come from in vLLM's code (:func:`level_symbol_drift`)."""
    status = {d.symbol: d.status for d in drifts}
    executed = level_symbols(entered) if entered is not None else {}
    release_executed = level_symbols(release_entered) if release_entered is not None else None
    parity_levels = {}
    for level, drift in levels.items():
        parity_levels[level] = drift.to_json()
        if entered is not None:
            parity_levels[level] |= level_symbol_drift(level, status, executed, release_executed)
    return {
        "release": f"vllm=={release.version}",
        "vllm_version": release.version,
        "vllm_commit": release.release.get("vllm_commit"),
        "torch_version": release.torch_version,
        **extra,
        "symbols": {"counts": symbol_counts(drifts), "drift": [d.to_json() for d in drifts]},
        "parity": {
            "verdict": parity_verdict(levels),
            "torch_note": torch_note(pinned.torch_version, release.torch_version),
            **({"sparse_note": sparse_note()} if any(level_spec(lv).sparse for lv in levels) else {}),
            "levels": parity_levels,
        },
    }


def drift_record(
    date: str, pinned: SourceSnapshot, suite: str, levels: tuple[str, ...], releases: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole report (reports/drift/<date>.json); :mod:`reports.drift_report` renders it."""
    from oracle.pin import load_pin

    pin = load_pin()
    return {
        "date": date,
        "pin": {
            "release": pin["release"],
            "upstream_commit": pin["upstream_commit"],
            "upstream_pr": pin["upstream_pr"],
            "vllm_version": pinned.version,
            "vllm_commit": pinned.release.get("vllm_commit"),
            "torch_version": pinned.torch_version,
        },
        "suite": suite,
        "levels": list(levels),
        "releases": releases,
    }


def record_agrees(record: dict[str, Any]) -> bool:
    """Every release at parity on every level (source drift alone is not a failure)."""
    return all(r["parity"]["verdict"] == AGREES for r in record["releases"])
