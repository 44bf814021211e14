"""A toy case field, declared from this one module with no harness file
edited: ``toy_priority`` (0 to 7, default 0) on every layout case. Its port,
:data:`PORT`, is per_request except that a case whose priority is 3 or more
gets one chunk too few (its last chunk dropped): a bug only the new field can
reach (tests/test_toy_field.py)."""

from __future__ import annotations

import dataclasses

from harness.model import Case, Layout, WorkspaceConfig
from harness.model.case_fields import FieldKind, FieldRule, register_field
from ports.per_request import PORT as PER_REQUEST

NAME = "toy_priority"
RULE = FieldRule(FieldKind.INT, "a toy: the batch's priority", minimum=0, maximum=7, floor=lambda case: 0)
DECLARED = register_field(Case, NAME, RULE, 0)


class PriorityPort:
    name = "toy-priority"

    def plan_layout(self, case: Case) -> Layout:
        layout: Layout = PER_REQUEST.plan_layout(case)
        if case.extra(NAME) >= 3 and len(layout.chunks) > 1:
            return dataclasses.replace(layout, chunks=layout.chunks[:-1])
        return layout

    def workspace_size(self, config: WorkspaceConfig) -> int:
        size: int = PER_REQUEST.workspace_size(config)
        return size


PORT = PriorityPort()
