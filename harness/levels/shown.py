"""What every level shares in ``parity diff``'s text and the drift report: the
defaults a level's hooks fall back on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.sides.items import DIVERGENT, CaseResult


@dataclass(frozen=True)
class ShowContext:
    """What one ``parity diff`` shows beside an item's result: both sides (a
    level may ask them again for a picture) and every kind it compares."""

    oracle: Any
    port: Any
    kinds: tuple[str, ...]


def tensors_changed(result: CaseResult) -> list[str]:
    """The tensors a divergent float item differs in: what drift names as changed."""
    return [t.name for t in result.tensors if not t.exact]


def divergent_tensors(drift: Any, result: CaseResult, pinned: Any, release: Any, item: Any) -> None:
    """A float level's drift row: the divergent tensors are what changed."""
    if result.status == DIVERGENT:
        drift.changed = tensors_changed(result)
