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
  a suite, with the harness's own runner (:func:`harness.sides.runner.run_item`):
  per item the layout fields or tensors that changed (:func:`compare_oracles`).

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
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cases.json_input import read_json
from harness.sides.items import DIVERGENT, ORACLE_ERROR, PARITY, PORT_ERROR, CaseResult, level_of
from harness.sides.runner import plan_items, run_item

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.model import Layout
    from harness.protocol.port import Port

ROOT = Path(__file__).resolve().parents[2]
SOURCES_TIMEOUT_S = 900.0

# Symbol statuses.
UNCHANGED, CHANGED, MISSING, NEW = "unchanged", "changed", "missing", "new"
# Item statuses of oracle-vs-oracle parity. The runner's oracle is the pinned
# release and its "port" the newer one, so its errors are renamed for whose they are.
PINNED_ERROR, RELEASE_ERROR, BOTH_REFUSE = "pinned-error", "release-error", "both-refuse"
# Both refuse, for different reasons (one may be a crash): not agreement.
REFUSE_DIFFERENTLY = "refuse-differently"
ITEM_STATUSES = (PARITY, DIVERGENT, BOTH_REFUSE, REFUSE_DIFFERENTLY, PINNED_ERROR, RELEASE_ERROR)
AGREEING = (PARITY, BOTH_REFUSE)


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


def drift_symbols(release: str) -> list[str]:
    """The pin's fingerprinted symbols, then those only the release's own pin holds."""
    from oracle.pin import load_pin, pin_file_for, pinned_symbols

    symbols = list(pinned_symbols())
    own = pin_file_for(release)
    if own.is_file():
        symbols += [s for s in load_pin(own)["fingerprints"] if s not in symbols]
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


def read_sources(python: Path | str, symbols: list[str], timeout_s: float = SOURCES_TIMEOUT_S) -> SourceSnapshot:
    """Run ``python -m oracle.sources`` with ``symbols`` on stdin in the environment of ``python``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    try:
        done = subprocess.run(
            [str(python), "-m", "oracle.sources"],
            input=json.dumps(symbols),
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriftError(f"{python} -m oracle.sources: {type(exc).__name__}: {exc}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise DriftError(f"{python} -m oracle.sources exited {done.returncode}: {tail[0]}")
    try:
        return SourceSnapshot.from_json(json.loads(done.stdout))
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


# -- oracle-vs-oracle parity ---------------------------------------------------------------


_NUMBER = re.compile(r"\d+")


def error_class(message: str) -> str:
    """An error message with its numbers folded (``N``), so refusals group by kind;
    the release's name (``vllm==X: ``, which the process's errors carry) is dropped."""
    message = re.sub(r"vllm==[\d.]+: ", "", message)
    # The process's wrapper is not part of what the release said.
    message = re.sub(r"^(OracleProcessError|OracleRefusal): ", "", message)
    return _NUMBER.sub("N", message)[:200]


def changed_layout_fields(pinned: Layout, release: Layout) -> list[str]:
    """Every layout field that differs in any chunk (in Chunk's field order),
    then ``num_chunks`` and ``empty_token_slices``; not only the first."""
    from harness.model import Chunk

    changed = [
        name
        for name in Chunk.field_names()
        if any(getattr(a, name) != getattr(b, name) for a, b in zip(pinned.chunks, release.chunks, strict=False))
    ]
    if pinned.num_chunks != release.num_chunks:
        changed.append("num_chunks")
    if pinned.empty_token_slices != release.empty_token_slices:
        changed.append("empty_token_slices")
    return changed


@dataclass
class ItemDrift:
    """One item of the suite: its drift status, the fields or tensors that
    changed (empty at parity) and a one-line detail."""

    id: str
    kind: str
    family: str
    status: str
    changed: list[str] = field(default_factory=list)
    detail: str = ""
    pinned_error: str | None = None
    release_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "family": self.family,
            "status": self.status,
            "changed": self.changed,
            "detail": self.detail,
            "pinned_error": self.pinned_error,
            "release_error": self.release_error,
        }


def _ask_release(release: Port, kind: str, item: Any, kernels: SharedKernels, device: str) -> str | None:
    """The release's error on an item the pinned oracle refused (None: it answered)."""
    from harness.kernels import kernels_for_case
    from harness.kernels.numeric import materialise_merge, materialise_prefill

    try:
        if kind == "layout":
            release.plan_layout(item)
        elif kind == "workspace":
            release.workspace_size(item)
        elif kind == "merge":
            release.merge_states(materialise_merge(item, device))  # type: ignore[attr-defined]
        else:
            inputs = materialise_prefill(item.context_lens, item.query_lens, item.block_size, item.numeric, device)
            release.prefill(item, inputs, kernels_for_case(kernels, item))  # type: ignore[attr-defined]
    except Exception as exc:
        return " ".join(f"{type(exc).__name__}: {exc}".split())
    return None


def item_drift(result: CaseResult, release: Port, item: Any, kernels: SharedKernels, device: str) -> ItemDrift:
    """The runner's result (pinned oracle as its oracle, the release as its port) as drift."""
    drift = ItemDrift(result.id, result.kind, result.family, result.status)
    if result.status == ORACLE_ERROR:
        drift.pinned_error = result.error
        drift.release_error = _ask_release(release, result.kind, item, kernels, device)
        if drift.release_error is None:
            drift.status = PINNED_ERROR
        elif error_class(drift.release_error) == error_class(result.error or ""):
            drift.status = BOTH_REFUSE
        else:
            drift.status = REFUSE_DIFFERENTLY
        drift.detail = f"pinned: {result.error}" + (
            f"; release: {drift.release_error}" if drift.release_error else "; the release answers"
        )
    elif result.status == PORT_ERROR:
        drift.status, drift.release_error, drift.detail = RELEASE_ERROR, result.error, result.error or ""
    elif result.status == DIVERGENT:
        if result.kind == "layout" and result.oracle_layout is not None and result.port_layout is not None:
            drift.changed = changed_layout_fields(result.oracle_layout, result.port_layout)
        elif result.kind == "workspace":
            drift.changed = ["workspace_size"]
        else:
            drift.changed = [t.name for t in result.tensors if not t.exact]
        drift.detail = result.detail().replace("port", "release")
    elif result.status != PARITY:
        drift.detail = result.error or ""
    return drift


@dataclass
class LevelDrift:
    """One parity level's items and the figures the report prints."""

    level: str
    items: list[ItemDrift] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        counted = Counter(i.status for i in self.items)
        return {status: counted.get(status, 0) for status in ITEM_STATUSES} | {
            s: n for s, n in counted.items() if s not in ITEM_STATUSES
        }

    def changed(self) -> dict[str, int]:
        """How many items each field or tensor changed in, most first."""
        counted = Counter(name for item in self.items for name in item.changed)
        return dict(counted.most_common())

    def error_classes(self) -> dict[str, dict[str, int]]:
        """Per error status, how many items each error class holds."""
        classes: dict[str, Counter[str]] = {}
        for item in self.items:
            if item.status in (PINNED_ERROR, BOTH_REFUSE, REFUSE_DIFFERENTLY):
                classes.setdefault(item.status, Counter())[error_class(item.pinned_error or "")] += 1
            elif item.status == RELEASE_ERROR:
                classes.setdefault(item.status, Counter())[error_class(item.release_error or "")] += 1
        return {status: dict(c.most_common()) for status, c in classes.items()}

    def verdict(self) -> str:
        """``parity`` when every item agrees (answers or refusals both share),
        else the counts of what does not."""
        counts = self.counts()
        if not self.items:
            return "no items compared"
        bad = [f"{n} {s}" for s, n in counts.items() if s not in AGREEING and n]
        return "parity" if not bad else ", ".join(bad)

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "items": len(self.items),
            "seconds": round(self.seconds, 1),
            "verdict": self.verdict(),
            "counts": self.counts(),
            "changed": self.changed(),
            "error_classes": self.error_classes(),
            # Items at parity are the bulk and say nothing more; the rest in full.
            "not_parity": [i.to_json() for i in self.items if i.status != PARITY],
        }


def compare_oracles(
    pinned: Port,
    release: Port,
    suite: Suite,
    levels: tuple[str, ...],
    kernels: SharedKernels,
    device: str = "cpu",
    timeout_s: float = 0.0,
    advance: Callable[[Any], None] | None = None,
) -> dict[str, LevelDrift]:
    """Every item of ``suite`` at ``levels``, pinned oracle against the release's;
    workspace items belong to the layout level."""
    out = {level: LevelDrift(level) for level in levels}
    for kind, item in plan_items(suite, levels):
        level = level_of(kind)
        started = time.perf_counter()
        result = run_item(pinned, release, kind, item, kernels, device, timeout_s)
        out[level].items.append(item_drift(result, release, item, kernels, device))
        out[level].seconds += time.perf_counter() - started
        if advance is not None:
            advance(result)
    return out


def torch_note(pinned_torch: str, release_torch: str) -> str:
    """What L2/L3 bit parity means between these two torch versions."""
    if pinned_torch.split("+")[0] == release_torch.split("+")[0]:
        return (
            f"Both releases run on torch {pinned_torch}: L2/L3 bits are comparable, and a bit difference "
            "is the releases' own code."
        )
    return (
        f"The torch versions differ (pinned {pinned_torch}, release {release_torch}): L2/L3 bits are "
        "compared across torch versions. The inputs are materialised once, under the pinned torch, and "
        "reach the release's process as bit patterns, but the release's side runs its own merge (whichever "
        "path that release takes on the CPU platform) and the harness's shared CPU kernels (gather, "
        "attention with LSE, kv_b_proj) under its own torch. Bit parity there says neither vLLM nor torch "
        "changed these items' bits; a bit difference alone does not say which of the two changed them: "
        "the symbols each level executes that the release changed (below) say where vLLM's part can be."
    )


# -- the report record ---------------------------------------------------------------------


def symbol_counts(drifts: list[SymbolDrift]) -> dict[str, int]:
    counted = Counter(d.status for d in drifts)
    return {status: counted.get(status, 0) for status in (UNCHANGED, CHANGED, MISSING, NEW)}


def parity_verdict(levels: dict[str, LevelDrift]) -> str:
    """``parity`` when every level is, else each level's verdict that is not."""
    if not levels:
        return "no level compared"
    bad = [f"{level}: {drift.verdict()}" for level, drift in levels.items() if drift.verdict() != "parity"]
    return "parity" if not bad else "; ".join(bad)


def level_symbols(entered: dict[str, list[str]]) -> dict[str, list[str]]:
    """``{symbol: levels}`` (:func:`oracle.trace.trace_in_process`, whose
    "workspace" is part of the layout level) -> ``{level: symbols}``."""
    out: dict[str, list[str]] = {}
    for symbol, levels in sorted(entered.items()):
        for level in sorted({"layout" if lv == "workspace" else lv for lv in levels}):
            out.setdefault(level, []).append(symbol)
    return out


def release_record(
    pinned: SourceSnapshot,
    release: SourceSnapshot,
    drifts: list[SymbolDrift],
    levels: dict[str, LevelDrift],
    extra: dict[str, Any],
    entered: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """One release's part of the drift report (``extra``: its environment,
    disk, timings, the release's own pin statuses, as measured by the caller).

    With ``entered`` (the symbols each level of the pinned oracle executes), each
    level also names those of its symbols the release changed or lacks: where a
    divergence at that level can come from in vLLM's code."""
    drifted = {d.symbol for d in drifts if d.status in (CHANGED, MISSING)}
    executed = level_symbols(entered) if entered is not None else {}
    parity_levels = {}
    for level, drift in levels.items():
        parity_levels[level] = drift.to_json()
        if entered is not None:
            symbols = executed.get(level, [])
            parity_levels[level]["symbols_executed"] = len(symbols)
            parity_levels[level]["symbols_drifted"] = [s for s in symbols if s in drifted]
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
    return all(r["parity"]["verdict"] == "parity" for r in record["releases"])
