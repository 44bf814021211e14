"""Ports that misbehave on purpose, loaded by import path in the fault tests."""

from __future__ import annotations

import time
from typing import Any

import torch

from harness.model import Case, Layout
from ports.per_request import PerRequestPort


class RaisingPort(PerRequestPort):
    name = "raising"

    def plan_layout(self, case: Case) -> Layout:
        if sum(case.context_lens) % 2:
            raise RuntimeError("planner blew up\non two lines")
        return super().plan_layout(case)


class NotALayoutPort(PerRequestPort):
    name = "not-a-layout"

    def plan_layout(self, case: Case) -> Layout:
        return {"chunks": []}  # type: ignore[return-value]


class HangingPort(PerRequestPort):
    name = "hanging"

    def plan_layout(self, case: Case) -> Layout:
        if case.name.endswith("giant-middle"):
            time.sleep(3600)
        return super().plan_layout(case)


class NanPort(PerRequestPort):
    name = "nan"

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().merge_states(inputs)
        out[0, 0, 0] = float("nan")
        return out, lse


class WrongShapePort(PerRequestPort):
    name = "wrong-shape"

    def merge_states(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().merge_states(inputs)
        return out[:, :, :-1], lse


class WrongDtypePort(PerRequestPort):
    name = "wrong-dtype"

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        result = super().prefill(case, inputs, kernels)
        result["output"] = result["output"].double()
        return result


class MissingTensorPort(PerRequestPort):
    name = "missing-tensor"

    def prefill(self, case: Case, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        result = super().prefill(case, inputs, kernels)
        result.pop("lse")
        return result


class NoNumericPort:
    """A layout-only port: it has no merge_states or prefill."""

    name = "layout-only"

    def __init__(self) -> None:
        self._inner = PerRequestPort()

    def plan_layout(self, case: Case) -> Layout:
        return self._inner.plan_layout(case)

    def workspace_size(self, config: Any) -> int:
        return self._inner.workspace_size(config)


class SlowPort(PerRequestPort):
    """Exact, but a fifth of a second per layout: a run long enough to interrupt."""

    name = "slow"

    def plan_layout(self, case: Case) -> Layout:
        time.sleep(0.2)
        return super().plan_layout(case)


class InterruptingPort(PerRequestPort):
    """Exact, until the user's Ctrl-C arrives during its fifth layout."""

    name = "interrupting"

    def __init__(self) -> None:
        self.calls = 0

    def plan_layout(self, case: Case) -> Layout:
        self.calls += 1
        if self.calls == 5:
            raise KeyboardInterrupt
        return super().plan_layout(case)
