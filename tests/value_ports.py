"""Python ports whose values break the one rule for port values (harness/protocol/port.py):
each is per_request with one value retyped, as a careless port would return it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from harness.model import Case, Layout, WorkspaceConfig
from ports.per_request import PerRequestPort


class _Retyped(PerRequestPort):
    """per_request whose first chunk has ``field`` replaced by ``retype(value)``."""

    field = ""

    def retype(self, value: Any) -> Any:
        return value

    def plan_layout(self, case: Case) -> Layout:
        layout = super().plan_layout(case)
        if not layout.chunks:
            return layout
        first = layout.chunks[0]
        changed = dataclasses.replace(first, **{self.field: self.retype(getattr(first, self.field))})
        return Layout((changed, *layout.chunks[1:]), layout.empty_token_slices)


class FloatFieldPort(_Retyped):
    name = "float-field"
    field = "num_context_tokens"

    def retype(self, value: Any) -> Any:
        return float(value)  # 3.0 == 3 in Python


class BoolIntPort(_Retyped):
    name = "bool-int"
    field = "request_start"

    def retype(self, value: Any) -> Any:
        return bool(value)  # False == 0 in Python


class FloatInSequencePort(_Retyped):
    name = "float-in-sequence"
    field = "seq_lens"

    def retype(self, value: Any) -> Any:
        return (float(value[0]), *value[1:])


class NumpyArrayPort(_Retyped):
    name = "numpy-array"
    field = "token_to_seq"

    def retype(self, value: Any) -> Any:
        return np.asarray(value)


class ListInsteadOfTuplePort(_Retyped):
    name = "list-field"
    field = "starts"

    def retype(self, value: Any) -> Any:
        return list(value)


class IntContinuationPort(_Retyped):
    name = "int-continuation"
    field = "is_continuation"

    def retype(self, value: Any) -> Any:
        return int(value)


class FractionalWorkspacePort(PerRequestPort):
    name = "fractional-workspace"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return super().workspace_size(config) + 0.7  # type: ignore[return-value]


class NumpyWorkspacePort(PerRequestPort):
    name = "numpy-workspace"

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return np.int64(super().workspace_size(config))  # type: ignore[return-value]


class NumpyMergePort(PerRequestPort):
    name = "numpy-merge"

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().merge_states(inputs)
        return out.float().numpy(), lse  # type: ignore[return-value]


class ExitingPort(PerRequestPort):
    """Calls ``sys.exit(0)`` while planning: a run must not end as a success."""

    name = "exiting"

    def plan_layout(self, case: Case) -> Layout:
        raise SystemExit(0)


class UnprintableErrorPort(PerRequestPort):
    """Raises with control characters and a lone surrogate in its message."""

    name = "unprintable-error"

    def plan_layout(self, case: Case) -> Layout:
        raise RuntimeError("bad \x1b[31mred\x1b[0m \udc80 bytes\x00")


class BadLevelsPort(PerRequestPort):
    name = "bad-levels"
    levels = 5


class MetaDeviceMergePort(PerRequestPort):
    """Returns its merge output on another device than the run's."""

    name = "meta-device"

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().merge_states(inputs)
        return out.to("meta"), lse


class CloseExitPort(FloatFieldPort):
    """Diverges (a port-error), then calls ``sys.exit(0)`` when the run closes it."""

    name = "close-exit"

    def close(self) -> None:
        raise SystemExit(0)


class ConstructorExitPort(PerRequestPort):
    name = "constructor-exit"

    def __init__(self) -> None:
        raise SystemExit(0)


class PytestSkipPort(PerRequestPort):
    """Calls ``pytest.skip`` while planning, as a lazy ``importorskip`` would."""

    name = "pytest-skip"

    def plan_layout(self, case: Case) -> Layout:
        import pytest

        pytest.skip("kernel library missing")
