"""The inputs' digests committed in the repository (``cases/input_digests.json``),
and the checks that this machine draws the same inputs.

Every generated tensor and index is a function of its case alone
(:mod:`harness.kernels.draws`). The file holds what that function gives: a
digest of the stream itself (``stream``: a fixed battery of draws, each
transform and each dtype's rounding, and tiny cases of every tensor kind
materialised whole), and per item of the ci and smoke suites at every tensor
level, the digest of its materialised inputs, keyed by the item's own content
(its kind and every field), so the same item met in another suite is checked too.

- :func:`check_stream` runs when a process that compares tensors selects its
  device (``harness.engine.device.select_device``; the engine and the pytest
  plugin also before loading the port): a machine, library or edit that draws
  other inputs is refused in one line (:class:`InputsDiffer`), before any work.
- :func:`check_covered` refuses a run of a digested suite whose tensor items
  the file does not all hold (the file predates the suite).
- :func:`inputs_mismatch` checks each item's inputs when they are first built:
  an item whose inputs differ from the committed ones is not run, and says why.

A digest reads values only: dtypes, shapes, strides, storage offsets and every
byte of storage, never the device (a GPU run draws on the host and moves the
same bits). ``python tools/input_digests.py --write`` rewrites the file after a
deliberate change of the stream or of a suite; ``--check`` compares.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.model.levels import TENSOR_KINDS as TENSOR_KINDS
from harness.model.levels import kind_spec
from harness.sides.items import NOT_RUN, CaseResult

DIGESTS_FILE = Path(__file__).resolve().parents[2] / "cases" / "input_digests.json"
DIGESTS_FORMAT = 1
# The suites whose items the file holds, and the item kinds that have tensor inputs.
DIGESTED_SUITES = ("smoke", "ci")


class InputsDiffer(Exception):
    """This machine draws inputs other than the repository's (one line)."""


def _without_devices(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_devices(item) for key, item in value.items() if key != "device"}
    if isinstance(value, list):
        return [_without_devices(item) for item in value]
    return value


def digest_of(value: Any) -> str:
    """16 hex digits of SHA-256 over the canonical form of ``value`` (the oracle
    cache's: every storage byte of every tensor), its devices left out."""
    from harness.sides.oracle_cache_keys import canonical

    text = json.dumps(_without_devices(canonical(value)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def item_key(kind: str, item: Any) -> str:
    """An item's key in the file: its kind and every field of its case."""
    text = json.dumps({"kind": kind, "item": item.to_json()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def item_inputs(kind: str, item: Any) -> Any:
    """What the harness materialises for one side of an item of a tensor level, on the host."""
    materialise = kind_spec(kind)[0].inputs
    if materialise is None:
        raise ValueError(f"{kind} items have no tensor inputs")
    return materialise(item, "cpu")


def stream_probe() -> str:
    """The digest of a fixed battery: each transform of one stream, read in
    pieces, each dtype's rounding of its normals, and the inputs of tiny merge,
    prefill, DCP prefill and top-k cases."""
    from harness.cases.sparse_inputs import materialise_topk
    from harness.kernels.draws import Draws
    from harness.kernels.numeric import DTYPES, materialise_merge, materialise_prefill, randn
    from harness.model import MergeCase, NumericSpec
    from harness.model.sparse import TopkMaskCase

    draws = Draws(2026, "stream-probe")
    battery: list[Any] = [
        [int(word) for word in draws.words(5)],
        draws.uniform((7,)).tolist(),
        draws.integers(-5, 1 << 20, (7,)).tolist(),
        draws.normal((7,)).tolist(),
        draws.permutation(9).tolist(),
        draws.argsort_rows(2, 6).tolist(),
        [randn((3, 5), 7, "probe", dtype, 0.5) for dtype in DTYPES.values()],
    ]
    spec = NumericSpec(num_heads=2, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4, kv_lora_rank=8, seed=11)
    battery.append(materialise_prefill((5, 0, 9), (2, 1, 3), 4, spec))
    battery.append(materialise_prefill((5, 0, 9), (2, 1, 3), 4, spec, dcp_world_size=2, interleave=2))
    for dtype, lse_view, value_view in (
        ("bf16", "column-slice", "head-dim-slice"),
        ("fp16", "transposed", "contiguous"),
    ):
        merge = MergeCase(
            name="probe", num_tokens=6, num_heads=2, head_size=8, dtype=dtype, pattern="mixed", seed=13,
            prefill_tokens_with_context=4, lse_view=lse_view, value_view=value_view,
        )  # fmt: skip
        battery.append(materialise_merge(merge))
    topk = TopkMaskCase(
        name="probe", query_lens=(3, 2), seq_lens=(40, 70), index_topk=8, form="batched", pattern="mixed",
        seed=17, range_starts=(0, 5), range_lens=(40, 60),
    )  # fmt: skip
    battery.append(materialise_topk(topk))
    return digest_of(battery)


@functools.cache
def committed() -> dict[str, Any]:
    """The file, read once; an unreadable one is :class:`InputsDiffer` naming it."""
    try:
        data = json.loads(DIGESTS_FILE.read_text())
    except (OSError, ValueError) as exc:
        raise InputsDiffer(f"{DIGESTS_FILE}: cannot be read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != DIGESTS_FORMAT or not isinstance(data.get("items"), dict):
        raise InputsDiffer(f"{DIGESTS_FILE}: format: not a format-{DIGESTS_FORMAT} table of input digests")
    return data


@functools.cache
def check_stream() -> None:
    """Refuse (:class:`InputsDiffer`, one line) when this process draws another
    stream than the file's. Run once per process, before any item is judged."""
    expected, found = committed().get("stream"), stream_probe()
    if found != expected:
        raise InputsDiffer(
            f"{DIGESTS_FILE}: stream: this machine draws inputs whose digest is {found}, the repository's "
            f"is {expected}: its inputs would differ from every other machine's, so it judges no tensor "
            "(after a deliberate change of the stream: python tools/input_digests.py --write)"
        )


def check_covered(suite_name: str, items: Sequence[tuple[str, Any]]) -> None:
    """Refuse (:class:`InputsDiffer`) a run of a digested suite whose tensor
    items the file does not all hold: the file predates the suite, and an item
    without a digest would be judged unchecked."""
    if suite_name not in DIGESTED_SUITES:
        return
    known = committed()["items"]
    missing = [item.name for kind, item in items if kind in TENSOR_KINDS and item_key(kind, item) not in known]
    if missing:
        raise InputsDiffer(
            f"{DIGESTS_FILE}: items: no digest for {len(missing)} tensor items of suite {suite_name} "
            f"(e.g. {missing[0]}): the file predates the suite (python tools/input_digests.py --write)"
        )


def other_inputs(result: CaseResult, item: Any, inputs: Any) -> bool:
    """Whether ``inputs``, built for ``result``'s item, are not the repository's:
    the item is then not run (nothing compared on them can pass), saying why."""
    reason = inputs_mismatch(result.kind, item, inputs)
    if reason is not None:
        result.status, result.error = NOT_RUN, reason
    return reason is not None


def inputs_mismatch(kind: str, item: Any, inputs: Any) -> str | None:
    """Why ``inputs`` (materialised for ``item``) are not the repository's, or
    None: they match, or the file holds no digest for this item."""
    expected = committed()["items"].get(item_key(kind, item))
    if expected is None:
        return None
    found = digest_of(inputs)
    if found == expected:
        return None
    return (
        f"its inputs on this machine have digest {found}, {DIGESTS_FILE.name} says {expected}: "
        "they are not the inputs every other machine judges"
    )
