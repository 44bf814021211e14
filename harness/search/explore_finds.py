"""The finds of ``parity explore``: finishing a find with the harness's own
shrinker (:func:`polish`), describing it in one line, writing it as a file the
CLI replays (:func:`write_find`), and reading one back (:func:`load_find`).

Every find is written under ``out_dir/finds/`` as an item file
(:func:`harness.cases.files.load_item_file`) that ``parity diff FILE`` reads: a layout
or prefill find as a case file, a workspace or merge find in its own form (its
printed command is ``parity explore --replay``, which compares it as diff does).

Invariants:

* Minimal finds. Hypothesis shrinks the choices an input was drawn from; a layout
  find (without a numeric section) is then finished by
  :func:`harness.search.shrink.shrink`, and kept only if the failure keeps its
  signature (:func:`harness.search.shrink.signature`); otherwise hypothesis's
  input stands.
* Names by content. A find's file is named from a digest of its item
  (:func:`find_name`), so the same input found again is written to the same file.
* Replayable. Each find carries the command that reproduces it, and
  :func:`load_find` reads every form :func:`write_find` writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.files import load_item_file
from harness.model import Case, MergeCase, WorkspaceConfig
from harness.model.levels import kind_spec, kinds_of
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port
from harness.search.explore_results import Find
from harness.search.explore_strategies import MERGE_NAMING, Property
from harness.search.shrink import signature
from harness.sides.items import CaseResult, printable
from harness.verdicts.launch import program_words, shell_join

FINDS_DIR = "finds"


def run_length_text(values: tuple[int, ...], limit: int = 6) -> str:
    """``[9, 0x3, 18x512]``: runs of equal values, the first ``limit`` of them."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    parts = [f"{v}x{n}" if n > 1 else str(v) for v, n in runs[:limit]]
    return "[" + ", ".join(parts) + (f", ... {len(runs) - limit} more runs" if len(runs) > limit else "") + "]"


def describe_item(item: Any) -> str:
    """One short line, however large the item."""
    if isinstance(item, Case):
        text = (
            f"{item.num_requests} request(s), {sum(item.context_lens)} context rows: "
            f"context_lens={run_length_text(item.context_lens)} query_lens={run_length_text(item.query_lens)} "
            f"W={item.workspace_size} block={item.block_size}"
            + (f" dcp={item.dcp_world_size}x{item.cp_kv_cache_interleave_size}" if item.dcp_world_size > 1 else "")
            + ("" if item.align_to_block else " align=off")
        )
        return text + (f" numeric={json.dumps(item.numeric.to_json())}" if item.numeric else "")
    if isinstance(item, WorkspaceConfig):
        return item.name
    if isinstance(item, MergeCase):
        return json.dumps({k: v for k, v in item.to_json().items() if k not in MERGE_NAMING})
    return str(item)


POLISH_EVALUATIONS = 200


def polish(
    oracle: Port, port: Port, item: Any, result: CaseResult, timeout_s: float = DEFAULT_PORT_TIMEOUT_S
) -> tuple[Any, CaseResult, int]:
    """Finish a layout find with the harness's own shrinker; the steps it took.

    Hypothesis shrinks the choices an input was drawn from. Some reductions are
    out of its reach here: one request of a run of identical ones (the run's
    count is one choice, and a count drawn near a width boundary stays near it),
    or a length drawn relative to a boundary. :func:`harness.search.shrink.shrink`
    (drop requests, shorten contexts, queries and the workspace) takes those
    steps, keeping the failure's signature, on the already small case.
    """
    from harness.search.shrink import shrink
    from harness.sides.runner import compare_case

    if not isinstance(item, Case) or item.numeric is not None:
        return item, result, 0
    try:
        outcome = shrink(item, lambda case: compare_case(oracle, port, case, timeout_s), budget=POLISH_EVALUATIONS)
    except ValueError:  # it no longer fails (a flaky port): keep hypothesis's input
        return item, result, 0
    if signature(outcome.result) != signature(result):
        return item, result, 0
    return outcome.case, outcome.result, outcome.steps


def find_name(prop: str, item_json: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(item_json, sort_keys=True).encode()).hexdigest()[:10]
    return f"explore-{prop}-{digest}"


def write_find(
    item: Any,
    result: CaseResult,
    prop: Property,
    out_dir: Path,
    port_spec: str,
    replayed: bool,
    flaky: bool,
    cut_short: bool,
) -> Find:
    """Write ``item`` under ``out_dir/finds`` as a file the CLI replays."""
    finds = out_dir / FINDS_DIR
    finds.mkdir(parents=True, exist_ok=True)
    body = item.to_json() if hasattr(item, "to_json") else dataclasses.asdict(item)
    name = find_name(prop.name, {k: v for k, v in body.items() if k != "name"})
    path = finds / f"{name}.json"
    if isinstance(item, Case):
        item = dataclasses.replace(item, name=name)
        data = item.to_json()
        level = prop.level
        command = [*program_words(port_spec), "diff", str(path), "--port", port_spec, "--level", level]
    else:
        data = {**body, "name": name}
        if isinstance(item, WorkspaceConfig):
            data = {"kind": "workspace", **dataclasses.asdict(item)}
        command = [*program_words(port_spec), "explore", "--replay", str(path), "--port", port_spec]
    data["description"] = printable(f"found by parity explore ({prop.name}) for {port_spec}: {result.detail()}")
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return Find(
        property=prop.name,
        status=result.status,
        detail=printable(result.detail()),
        item=data,
        size=describe_item(item),
        file=str(path),
        command=shell_join(command),
        replayed=replayed,
        flaky=flaky,
        shrink_cut_short=cut_short,
    )


def load_find(path: Path) -> tuple[str, Any]:
    """A find file: ``(kind, item)``, kind layout (a case file of one case),
    workspace or merge (:func:`harness.cases.files.load_item_file`)."""
    kind, loaded = load_item_file(path)
    if isinstance(loaded, list):
        if len(loaded) != 1:
            raise CaseError(str(path), None, f"holds {len(loaded)} cases; a find holds one")
        return kind, loaded[0]
    return kind, loaded


def replay_kinds(kind: str, item: Any) -> list[str]:
    """The runner kinds a find's item is compared at: its own, and every other
    explored kind it holds (a case with a numeric section at L3 too)."""
    return [kind] + [k for k in kinds_of(item) if k != kind and kind_spec(k)[0].strategy is not None]
