"""The drift watch's oracle-vs-oracle parity: the pinned oracle against a newer
release's, item by item, at every level (the sparse ones included).

The harness's own runner (:func:`harness.sides.runner.run_item`) compares each
item with the pinned oracle as its oracle and the release as its "port"; this
module turns its result into an :class:`ItemDrift` naming what changed:

- a layout: every chunk field that differs (not only the first);
- a sparse layout: every field, the route's decisions included
  (``workspace_size``, ``layout.<chunk field>``, then
  :attr:`~harness.model.sparse.SparseLayout.ROUTE_FIELDS`), with both routes;
- a top-k mask item: the mask and the remap each compared as bit patterns
  (the runner stops at the first of the two that differs);
- a prefill or sparse prefill: the tensors whose bits differ.

Invariants: an item the pinned oracle refuses is also asked of the release, so a
refusal both share (``both-refuse``) is told apart from one only the pinned
release makes; a sparse L3 batch the pinned oracle routes to sparse MQA is
compared at sparse-layout only (``layout-only``) when the release routes it
there too, and is a divergence of its route when the release does not.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.model.levels import kind_spec
from harness.model.sparse import MaskForm, Route
from harness.sides.items import DIVERGENT, NOT_RUN, ORACLE_ERROR, PARITY, PORT_ERROR, CaseResult, level_of
from harness.sides.runner import plan_items, run_item

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels
    from harness.model import Layout
    from harness.model.sparse import SparseLayout, TopkMaskCase
    from harness.protocol.port import Port

# Item statuses of oracle-vs-oracle parity. The runner's oracle is the pinned
# release and its "port" the newer one, so its errors are renamed for whose they are.
PINNED_ERROR, RELEASE_ERROR, BOTH_REFUSE = "pinned-error", "release-error", "both-refuse"
# Both refuse, for different reasons (one may be a crash): not agreement.
REFUSE_DIFFERENTLY = "refuse-differently"
# A sparse L3 batch both releases route to sparse MQA: no prefill to compare (its
# route is compared at sparse-layout). Agreement.
LAYOUT_ONLY = "layout-only"
ITEM_STATUSES = (PARITY, DIVERGENT, BOTH_REFUSE, REFUSE_DIFFERENTLY, PINNED_ERROR, RELEASE_ERROR, LAYOUT_ONLY)
# A drift verdict that finds nothing to report (else it counts what disagrees).
AGREES = "parity"
AGREEING = (PARITY, BOTH_REFUSE, LAYOUT_ONLY)

_NUMBER = re.compile(r"\d+")
# The exception classes a side marks ``refusal = True`` (oracle.legacy.LegacyRefusal,
# oracle.sparse_prefill.RouteNotCompared): the pinned oracle's refusal reads
# "RouteNotCompared: <reason>", the same refusal served by a release's process
# "OracleRefusal: vllm==X: <reason>" (oracle.serve sends the reason alone).
_REFUSAL_TYPES = re.compile(r"^(LegacyRefusal|RouteNotCompared): ")


def error_class(message: str) -> str:
    """An error message with its numbers folded (``N``), so refusals group by kind;
    the release's name (``vllm==X: ``, which the process's errors carry), the
    process's wrapper and a refusal's class name are dropped."""
    message = re.sub(r"vllm==[\d.]+: ", "", message)
    # The process's wrapper is not part of what the release said.
    message = re.sub(r"^(OracleProcessError|OracleRefusal): ", "", message)
    message = _REFUSAL_TYPES.sub("", message)
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


def _differ(a: Any, b: Any) -> bool:
    return bool(a != b or type(a) is not type(b))


def changed_sparse_fields(pinned: SparseLayout, release: SparseLayout) -> list[str]:
    """Every sparse layout field that differs: ``workspace_size``, the chunks'
    fields as ``layout.<field>``, then each route field (the decisions: the
    flags, the threshold, the fit, the route, the mask shapes)."""
    from harness.model.sparse import SparseLayout

    changed = ["workspace_size"] if _differ(pinned.workspace_size, release.workspace_size) else []
    changed += [f"layout.{name}" for name in changed_layout_fields(pinned.layout, release.layout)]
    changed += [name for name in SparseLayout.ROUTE_FIELDS if _differ(getattr(pinned, name), getattr(release, name))]
    return changed


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def sparse_detail(pinned: SparseLayout, release: SparseLayout, changed: list[str]) -> str:
    """Each changed field with both values (pinned -> release), the chunks' first
    difference as the dense layout names it; one line."""
    from harness.compare.dense import first_layout_divergence

    parts = []
    for name in changed:
        if name.startswith("layout."):
            continue
        parts.append(f"{name} {_short(getattr(pinned, name))} -> {_short(getattr(release, name))}")
    found = first_layout_divergence(pinned.layout, release.layout)
    if found is not None:
        parts.append("layout " + found.message().replace("oracle", "pinned").replace("port", "release"))
    return "; ".join(parts)


@dataclass
class ItemDrift:
    """One item of the suite: its drift status, the fields or tensors that
    changed (empty at parity), a one-line detail and, for a sparse layout, both
    routes (pinned, release)."""

    id: str
    kind: str
    family: str
    status: str
    changed: list[str] = field(default_factory=list)
    detail: str = ""
    pinned_error: str | None = None
    release_error: str | None = None
    routes: tuple[str, str] | None = None

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
            "routes": list(self.routes) if self.routes is not None else None,
        }


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _ask_release(release: Port, kind: str, item: Any, kernels: SharedKernels, device: str) -> str | None:
    """The release's error on an item the pinned oracle refused (None: it
    answered, or its kind has nothing to ask: harness.model.levels.KindSpec.release_asked)."""
    asked = kind_spec(kind)[0].release_asked
    if asked is None:
        return None
    try:
        asked(release, item, kernels, device)
    except Exception as exc:
        return _one_line(exc)
    return None


def _mask_bits(a: Any, b: Any, reserved: bool) -> tuple[list[str], str]:
    """Two masks of different shapes compared where both hold the same thing:
    the key words both have (``ceil(keys/32)`` of the smaller), the key-starts
    word (the last one, of a global mask) and, in the wider, the padding words
    past the keys (which no key reads), each over the batch and rows both have."""
    batch, rows = min(a.shape[0], b.shape[0]), min(a.shape[1], b.shape[1])
    a, b = a[:batch, :rows], b[:batch, :rows]
    spare = int(reserved)
    words = min(a.shape[2], b.shape[2]) - spare
    keys = int((a[:, :, :words] != b[:, :, :words]).sum())
    wide = a if a.shape[2] > b.shape[2] else b
    padding = wide[:, :, words : wide.shape[2] - spare]
    nonzero = int((padding != 0).sum())
    parts = [f"key words {keys}/{batch * rows * words} differ"]
    if reserved:
        parts.append(f"key-starts word {int((a[:, :, -1] != b[:, :, -1]).sum())}/{batch * rows} differ")
    side = "pinned" if wide is a else "release"
    parts.append(f"the {side}'s {padding.shape[2]} padding words per row {nonzero} nonzero")
    starts_differ = reserved and bool((a[:, :, -1] != b[:, :, -1]).any())
    return ["mask"] if keys or nonzero or starts_differ else [], ", ".join(parts)


def mask_drift(pinned: Port, release: Port, case: TopkMaskCase) -> tuple[list[str], str]:
    """Both sides' mask and remap of ``case`` (each on fresh indices), compared
    apart as bit patterns: which of ``mask_shape``, ``mask`` and ``remap``
    changed, and a line with how many words or indices differ and the first of
    each. Masks of different shapes are compared where both hold the same
    words (:func:`_mask_bits`)."""
    from harness.cases.sparse_inputs import materialise_topk
    from harness.compare.sparse import first_mask_divergence, first_remap_divergence

    mask_a = pinned.build_topk_mask(case, materialise_topk(case))  # type: ignore[attr-defined]
    mask_b = release.build_topk_mask(case, materialise_topk(case))  # type: ignore[attr-defined]
    remap_a = pinned.remap_topk(case, materialise_topk(case))  # type: ignore[attr-defined]
    remap_b = release.remap_topk(case, materialise_topk(case))  # type: ignore[attr-defined]
    topk = materialise_topk(case)
    changed: list[str] = []
    parts = []
    if tuple(mask_a.shape) != tuple(mask_b.shape):
        changed.append("mask_shape")
        bits, counted = _mask_bits(mask_a, mask_b, case.form == MaskForm.GLOBAL)
        changed += bits
        parts.append(f"mask shape {tuple(mask_a.shape)} -> {tuple(mask_b.shape)}: {counted}")
    else:
        mask = first_mask_divergence(mask_a, mask_b, topk, case.form == MaskForm.GLOBAL)
        if mask is not None:
            changed.append("mask")
            count = f"{int((mask_a != mask_b).sum())}/{mask_a.numel()} int32 words differ"
            parts.append(f"mask: {count}; first at {mask.field}: pinned {mask.oracle} release {mask.port}")
    remap = first_remap_divergence(remap_a, remap_b, topk, case.range_starts)
    if remap is not None:
        pairs = list(zip(remap_a, remap_b, strict=False))
        same = len(remap_a) == len(remap_b) and all(a.shape == b.shape for a, b in pairs)
        total = sum(a.numel() for a in remap_a)
        count = f"{sum(int((a != b).sum()) for a, b in pairs)}/{total} indices differ" if same else "shape"
        changed.append("remap")
        parts.append(f"remap: {count}; first at {remap.field}: pinned {remap.oracle} release {remap.port}")
    return changed, "; ".join(parts)


def layout_only(drift: ItemDrift, release: Port, item: Any) -> None:
    """A sparse L3 batch the pinned oracle routes to sparse MQA: compared at
    sparse-layout only when the release routes it there too."""
    try:
        route = release.plan_sparse(item).route  # type: ignore[attr-defined]
    except Exception as exc:
        drift.status, drift.release_error = RELEASE_ERROR, _one_line(exc)
        drift.detail = drift.release_error
        return
    drift.routes = (Route.MQA, route)
    if route == Route.MQA:
        drift.status, drift.detail = LAYOUT_ONLY, "both route it mqa: compared at sparse-layout only"
    else:
        drift.status, drift.changed = DIVERGENT, ["route"]
        drift.detail = f"route mqa -> {route}: the pinned release runs no prefill for it, the release does"


def item_drift(
    result: CaseResult, pinned: Port, release: Port, item: Any, kernels: SharedKernels, device: str
) -> ItemDrift:
    """The runner's result (pinned oracle as its oracle, the release as its port) as drift."""
    drift = ItemDrift(result.id, result.kind, result.family, result.status)
    if result.oracle_sparse is not None and result.port_sparse is not None:
        drift.routes = (result.oracle_sparse.route, result.port_sparse.route)
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
    elif result.status in (DIVERGENT, NOT_RUN):
        drift.detail = result.detail().replace("port", "release") if result.status == DIVERGENT else result.error or ""
        # What changed, as the item's level reads it (harness.model.levels.KindSpec.drift).
        fill = kind_spec(result.kind)[0].drift
        if fill is not None:
            fill(drift, result, pinned, release, item)
        elif result.status == DIVERGENT:
            drift.changed = [t.name for t in result.tensors if not t.exact]
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

    def routes(self) -> dict[str, int]:
        """Sparse layouts per route pair, ``pinned -> release``, most first
        (a pair of equal routes: the route kept)."""
        counted = Counter(f"{a} -> {b}" for a, b in (i.routes for i in self.items if i.routes is not None))
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
        """:data:`AGREES` when every item agrees (answers or refusals both share),
        else the counts of what does not."""
        counts = self.counts()
        if not self.items:
            return "no items compared"
        bad = [f"{n} {s}" for s, n in counts.items() if s not in AGREEING and n]
        return AGREES if not bad else ", ".join(bad)

    def to_json(self) -> dict[str, Any]:
        out = {
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
        if any(i.routes is not None for i in self.items):
            out["routes"] = self.routes()
        return out


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
    workspace items belong to the layout level, sparse workspace items to sparse-layout."""
    out = {level: LevelDrift(level) for level in levels}
    for kind, item in plan_items(suite, levels):
        level = level_of(kind)
        started = time.perf_counter()
        result = run_item(pinned, release, kind, item, kernels, device, timeout_s)
        out[level].items.append(item_drift(result, pinned, release, item, kernels, device))
        out[level].seconds += time.perf_counter() - started
        if advance is not None:
            advance(result)
    return out


def torch_note(pinned_torch: str, release_torch: str) -> str:
    """What bit parity at the numeric levels (L2/L3, sparse-mask, sparse-prefill)
    means between these two torch versions."""
    if pinned_torch.split("+")[0] == release_torch.split("+")[0]:
        return (
            f"Both releases run on torch {pinned_torch}: the numeric levels' bits are comparable, and a bit "
            "difference is the releases' own code."
        )
    return (
        f"The torch versions differ (pinned {pinned_torch}, release {release_torch}): the numeric levels' bits "
        "(L2/L3, the sparse masks and remaps, sparse-prefill) are compared across torch versions. The inputs "
        "are materialised once, under the pinned torch, and reach the release's process as bit patterns, but "
        "the release's side runs its own merge (whichever path that release takes on the CPU platform), its "
        "own mask kernels (Triton's interpreter, under its own Triton) and the harness's shared CPU kernels "
        "(gather, attention with LSE, masked attention, kv_b_proj) under its own torch. Bit parity there says "
        "neither vLLM nor torch changed these items' bits; a bit difference alone does not say which of the "
        "two changed them: the symbols each level executes that the release changed (below) say where "
        "vLLM's part can be."
    )
