"""What every level shares in ``parity diff``'s text and the drift report: the
defaults a level's hooks fall back on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.protocol.port import Port
from harness.sides.items import DIVERGENT, CaseResult

if TYPE_CHECKING:
    from harness.night.drift_items import ItemDrift


@dataclass(frozen=True)
class ShowContext:
    """What one ``parity diff`` shows beside an item's result: both sides (a
    level may ask them again for a picture) and every kind it compares."""

    oracle: Port
    port: Port
    kinds: tuple[str, ...]


def tensors_changed(result: CaseResult) -> list[str]:
    """The tensors a divergent float item differs in: what drift names as changed."""
    return [t.name for t in result.tensors if not t.exact]


def divergent_tensors(drift: ItemDrift, result: CaseResult, pinned: Port, release: Port, item: object) -> None:
    """A float level's drift row: the divergent tensors are what changed."""
    if result.status == DIVERGENT:
        drift.changed = tensors_changed(result)
