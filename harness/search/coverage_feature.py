"""What a coverage feature is, and what measuring one asks of the tally: shared
by the dense features (:mod:`harness.search.coverage`) and the sparse ones
(:mod:`harness.search.sparse_coverage`), which import nothing of each other's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Feature:
    """One measured feature. ``element`` says what a set holds: ``int``,
    ``label`` (one of ``labels``) or ``text``; histograms always have ``labels``.
    ``widths``: a max reported against :data:`WIDTHS`."""

    id: str
    kind: str
    description: str
    element: str = "label"
    labels: tuple[str, ...] = ()
    widths: bool = False


class FeatureTally(Protocol):
    """The updates a measurement makes (:class:`harness.search.coverage.Tally`)."""

    def most(self, feature: str, value: int) -> None: ...

    def least(self, feature: str, value: int) -> None: ...

    def count(self, feature: str, n: int = 1) -> None: ...

    def add(self, feature: str, item: int | str) -> None: ...

    def bucket(self, feature: str, label: str, n: int = 1) -> None: ...
