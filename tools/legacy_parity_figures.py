"""Bit-exactness figures of a run's numeric levels (L2 merge, L3 prefill), per dtype and tensor.

Usage: ``python tools/legacy_parity_figures.py FILE`` where FILE is one of

* a ``parity run ... --json FILE`` document: every item's tensor verdicts, so the
  tables go per level, per dtype and per tensor;
* a ``parity run ... --results FILE`` JSON-lines file, or a gate's
  ``results.parquet``: one row per item with its tensors already summed
  (:func:`harness.verdicts.summary.result_row`), so the tables go per level only (dtype
  ``not recorded``, tensor ``all, summed``): those files do not record them.

Written to measure seeds/000's expectation (the legacy equal-share grid gives
"token-exact output") with ``--port equal_share``; any port's run reads the same.

Figures, per group: items compared (the port and the oracle both produced
tensors), items bit-exact, elements and differing elements, the mismatch
fraction of all elements and of the worst item, the raw ULP distance (max) and
histogram (numeric bucket order), and the error in ULPs of the larger value:
its max and its quantiles (linear interpolation) over the items whose tensor
differs in at least one finite pair. A results file keeps each item's largest
such error, not every element's, so the quantiles are over items.

The ULP arithmetic and its printing are :mod:`harness.compare.bits`'; the readers are
:func:`harness.verdicts.results_file.read_rows` and the results table's columns
(:mod:`harness.verdicts.summary`). Bad input: one line naming the file, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cases.fields import CaseError
from harness.compare.ulp_text import (
    INF_BUCKET,
    NAN_BUCKET,
    histogram_text,
    sorted_histogram,
    ulp_of_larger_text,
    ulp_text,
)
from harness.model.levels import levels_where
from harness.sides.items import DIVERGENT, PARITY
from harness.verdicts.results_file import read_rows
from harness.verdicts.summary import with_later_columns

# The dense float levels, the ones 0.27.1 answers as the pin does.
NUMERIC_LEVELS = tuple(levels_where(lambda spec: spec.floats and not spec.sparse))
QUANTILES = (0.5, 0.9, 0.99)
# What a results table (parquet or JSON lines) records per item and this tool reads.
ROW_COLUMNS = ("id", "level", "status", "max_ulp", "max_ulp_of_larger", "mismatches", "elements", "histogram")
# The dtype and tensor a row-form input cannot name: its row sums every tensor of the item.
UNKNOWN_DTYPE, ALL_TENSORS = "not recorded", "all, summed"


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of one compared item, or (row-form input) all of an item's tensors."""

    level: str
    dtype: str
    tensor: str
    item: str
    exact: bool
    mismatches: int
    elements: int
    max_ulp: int
    max_ulp_of_larger: float
    histogram: dict[str, int]

    @property
    def finite_mismatches(self) -> int:
        """Differing pairs with a distance: the ones ``max_ulp_of_larger`` is measured over."""
        return self.mismatches - self.histogram.get(NAN_BUCKET, 0) - self.histogram.get(INF_BUCKET, 0)


@dataclass(frozen=True)
class ItemRecord:
    """One item at a numeric level: ``dtype`` is its inputs' dtype (the LSEs are
    always fp32), ``None`` when no tensors came back to tell it."""

    level: str
    item: str
    status: str
    dtype: str | None


@dataclass
class Figures:
    """Everything the tables print. ``per_tensor`` is True when the input
    named each item's dtype and tensors (a ``--json`` document)."""

    source: str
    per_tensor: bool
    items: list[ItemRecord] = field(default_factory=list)
    tensors: list[TensorRecord] = field(default_factory=list)
    context: str = ""


class FiguresError(Exception):
    """Bad input; ``str(error)`` is the one line printed."""


def _bad(path: Path, reason: str) -> FiguresError:
    return FiguresError(f"{path}: {reason}")


def _field(path: Path, where: str, record: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    """``record[key]`` if it is a ``kind`` (a bool is never a number here), else :class:`FiguresError`."""
    if not isinstance(record, dict) or key not in record:
        raise _bad(path, f"{where}: field '{key}' is missing: not a parity results file")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _bad(path, f"{where}: field '{key}' is {type(value).__name__}: not a parity results file")
    return value


def _histogram(path: Path, where: str, value: Any) -> dict[str, int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _bad(path, f"{where}: field 'histogram' is not JSON") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    ):
        raise _bad(path, f"{where}: field 'histogram' must map bucket labels to counts")
    return dict(value)


def item_dtype(tensors: list[dict[str, Any]]) -> str | None:
    """The item's inputs' dtype: its first value tensor's (an LSE is fp32 whatever the inputs)."""
    values = [t for t in tensors if not str(t.get("name", "")).endswith("lse")]
    chosen = values or tensors
    return str(chosen[0]["dtype"]) if chosen else None


def figures_from_document(path: Path, document: dict[str, Any]) -> Figures:
    """A ``parity run --json`` document: every numeric item's tensor verdicts."""
    cases = _field(path, "document", document, "cases", list)
    if document.get("resumed_items"):
        # Resumed items are in the summary but not in ``cases``: the tables would miss them.
        raise _bad(path, f"holds {document['resumed_items']} resumed items without tensors: read its --results file")
    found = document.get("summary")
    summary: dict[str, Any] = found if isinstance(found, dict) else {}
    figures = Figures(str(path), per_tensor=True, context=f"suite {summary.get('suite')}, port {summary.get('port')}")
    for number, case in enumerate(cases):
        where = f"cases[{number}]"
        kind = _field(path, where, case, "kind", str)
        if kind not in NUMERIC_LEVELS:
            continue
        name = _field(path, where, case, "name", str)
        status = _field(path, where, case, "status", str)
        tensors = case.get("tensors") or []
        if not isinstance(tensors, list):
            raise _bad(path, f"{where}: field 'tensors' is {type(tensors).__name__}, not a parity results file")
        for t_number, tensor in enumerate(tensors):
            t_where = f"{where}.tensors[{t_number}]"
            for key, kind_of in (("name", str), ("dtype", str), ("shape", list)):
                _field(path, t_where, tensor, key, kind_of)
        dtype = item_dtype(tensors)
        figures.items.append(ItemRecord(kind, name, status, dtype))
        for t_number, tensor in enumerate(tensors):
            t_where = f"{where}.tensors[{t_number}]"
            elements = 0 if tensor.get("error") else math.prod(int(n) for n in tensor["shape"])
            figures.tensors.append(
                TensorRecord(
                    level=kind,
                    dtype=dtype or UNKNOWN_DTYPE,
                    tensor=tensor["name"],
                    item=name,
                    exact=bool(_field(path, t_where, tensor, "exact", bool)),
                    mismatches=int(_field(path, t_where, tensor, "mismatches", int)),
                    elements=elements,
                    max_ulp=int(_field(path, t_where, tensor, "max_ulp", int)),
                    max_ulp_of_larger=float(_field(path, t_where, tensor, "max_ulp_of_larger", (int, float))),
                    histogram=_histogram(path, t_where, tensor.get("histogram", {})),
                )
            )
    return figures


def figures_from_table(path: Path, table: pd.DataFrame, context: str) -> Figures:
    """A results table (a gate's parquet, or ``--results`` rows): one row per item, tensors summed."""
    table = with_later_columns(table)
    missing = [c for c in ROW_COLUMNS if c not in table.columns]
    if missing:
        raise _bad(path, f"column '{missing[0]}' is missing: not a parity results table")
    figures = Figures(str(path), per_tensor=False, context=context)
    for number, row in enumerate(table.to_dict("records")):
        level = str(row["level"])
        if level not in NUMERIC_LEVELS:
            continue
        where = f"row {number}"
        status, item = str(row["status"]), str(row["id"])
        compared = status in (PARITY, DIVERGENT)
        figures.items.append(ItemRecord(level, item, status, UNKNOWN_DTYPE if compared else None))
        if not compared:
            continue
        try:
            of_larger = float(row["max_ulp_of_larger"])
            counts = (int(row["mismatches"]), int(row["elements"]), int(row["max_ulp"]))
        except (TypeError, ValueError):
            raise _bad(path, f"{where}: a figure column is not a number") from None
        figures.tensors.append(
            TensorRecord(
                level=level,
                dtype=UNKNOWN_DTYPE,
                tensor=ALL_TENSORS,
                item=item,
                exact=status == PARITY,
                mismatches=counts[0],
                elements=counts[1],
                max_ulp=counts[2],
                max_ulp_of_larger=of_larger,
                histogram=_histogram(path, where, row["histogram"]),
            )
        )
    return figures


def load_figures(path: Path) -> Figures:
    """Read any of the three inputs; :class:`FiguresError` on anything else."""
    if not path.is_file():
        raise _bad(path, "no such file")
    if path.suffix == ".parquet":
        try:
            table = pd.read_parquet(path)
        except Exception as error:  # pyarrow raises several types for a file that is not parquet
            raise _bad(path, f"not a parquet file ({type(error).__name__})") from None
        meta_path = path.with_name("gate.json")
        context = ""
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                context = f"suite {meta.get('suite')}, port {meta.get('port')}"
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                context = ""
        return figures_from_table(path, table, context)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _bad(path, "is not UTF-8 text: not a parity results file") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    if isinstance(document, dict) and "cases" in document:
        return figures_from_document(path, document)
    try:
        header, rows = read_rows(path)
    except CaseError as error:
        raise FiguresError(str(error)) from None
    except TypeError:  # a line holding a JSON scalar, not an object
        raise _bad(path, "a line is not a JSON object: not a parity results file") from None
    if header is None:
        raise _bad(path, "neither a parity run --json document nor a results file (no header line)")
    if not rows:
        raise _bad(path, "a results file without rows")
    if not all(isinstance(row, dict) for row in rows):
        raise _bad(path, "a row is not a JSON object: not a parity results file")
    context = f"suite {header.get('suite')}, port {header.get('port')}"
    return figures_from_table(path, pd.DataFrame(rows), context)


# -- tables ------------------------------------------------------------------------------------------


def level_table(figures: Figures) -> pd.DataFrame:
    """Per level and dtype: items, compared, bit-exact and the verdict. Items that
    produced no tensors (a side raised, or did not run) have no dtype: their own row."""
    frame = pd.DataFrame(
        [(i.level, i.dtype or "(no tensors)", i.item, i.status) for i in figures.items],
        columns=["level", "dtype", "item", "status"],
    )
    rows = []
    for (level, dtype), group in frame.groupby(["level", "dtype"], sort=True):
        statuses = Counter(group["status"])
        compared = statuses[PARITY] + statuses[DIVERGENT]
        not_compared = {s: n for s, n in sorted(statuses.items()) if s not in (PARITY, DIVERGENT)}
        if compared == 0:
            verdict = "not compared"
        elif statuses[PARITY] == compared:
            verdict = "bit-exact"
        else:
            verdict = f"NOT bit-exact ({statuses[DIVERGENT]} of {compared} items differ)"
        rows.append(
            {
                "level": level,
                "dtype": dtype,
                "items": len(group),
                "compared": compared,
                "bit-exact": statuses[PARITY],
                "not compared": ", ".join(f"{s} {n}" for s, n in not_compared.items()) or "0",
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


def _quantile_text(values: pd.Series) -> str:
    if values.empty:
        return "-"
    return " / ".join(ulp_of_larger_text(float(values.quantile(q))) for q in QUANTILES)


def tensor_table(figures: Figures) -> pd.DataFrame:
    """Per level, dtype and tensor: the statistics of the module docstring."""
    rows = []
    frame = pd.DataFrame([vars(t) | {"finite": t.finite_mismatches} for t in figures.tensors])
    if frame.empty:
        return frame
    for (level, dtype, tensor), group in frame.groupby(["level", "dtype", "tensor"], sort=True):
        histogram: Counter[str] = Counter()
        for h in group["histogram"]:
            histogram.update(h)
        elements, mismatches = int(group["elements"].sum()), int(group["mismatches"].sum())
        fractions = group["mismatches"] / group["elements"].where(group["elements"] > 0)
        measured = group.loc[group["finite"] > 0, "max_ulp_of_larger"].dropna()
        rows.append(
            {
                "level": level,
                "dtype": dtype,
                "tensor": tensor,
                "items": len(group),
                "bit-exact": int(group["exact"].sum()),
                "elements": elements,
                "differ": mismatches,
                "fraction": f"{mismatches / elements:.2%}" if elements else "-",
                "worst item": f"{float(fractions.max()):.2%}" if fractions.notna().any() else "-",
                "max ULP": ulp_text(int(group["max_ulp"].max())),
                "ULP histogram": histogram_text(dict(histogram)) or "-",
                "of larger: max": ulp_of_larger_text(float(measured.max())) if not measured.empty else "-",
                "p50 / p90 / p99": _quantile_text(measured),
            }
        )
    return pd.DataFrame(rows)


def level_histograms(figures: Figures) -> dict[str, dict[str, int]]:
    """Each level's ULP histogram over every tensor, in numeric bucket order."""
    out: dict[str, Counter[str]] = {}
    for t in figures.tensors:
        out.setdefault(t.level, Counter()).update(t.histogram)
    return {level: sorted_histogram(dict(counts)) for level, counts in sorted(out.items())}


def markdown(frame: pd.DataFrame) -> str:
    """A pipe table (no extra dependency); an empty frame reads as such."""
    if frame.empty:
        return "(no numeric items)"
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def report(figures: Figures) -> str:
    lines = [f"# Numeric parity figures: {figures.source}" + (f" ({figures.context})" if figures.context else "")]
    if not figures.per_tensor:
        lines.append(
            "\nA results table sums each item's tensors and does not record its dtype: per level only "
            "(per dtype and tensor: read a `parity run --json` document)."
        )
    lines += ["", "## Items per level and dtype", "", markdown(level_table(figures))]
    lines += ["", "## Per tensor", "", markdown(tensor_table(figures))]
    lines += [
        "",
        "`fraction`: differing elements of all compared; `worst item`: the largest per-item fraction. "
        "`of larger`: the error in ULPs of the larger value (harness/compare/bits.py); its max, and "
        "p50 / p90 / p99 over the items that differ in a finite pair (a results file keeps per-item maxima).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="legacy_parity_figures",
        description="Bit-exactness figures (L2 merge, L3 prefill) per level, dtype and tensor of a parity run.",
    )
    parser.add_argument("file", type=Path, help="a `parity run --json` document, a --results file or results.parquet")
    args = parser.parse_args(argv)
    try:
        figures = load_figures(args.file)
    except FiguresError as error:
        print(f"legacy_parity_figures: {error}", file=sys.stderr)
        return 2
    if not figures.items:
        print(f"legacy_parity_figures: {args.file}: holds no merge or prefill items", file=sys.stderr)
        return 2
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
