"""The interface every side of a comparison implements, and how ports are named.

A port is any object with a ``name`` and the two methods of :class:`Port`. The
harness names built-in ports by short name (``per_request``, ``equal_share``)
and a user's port by import path (``package.module:attr``, where ``attr`` is a
port object, or a class or factory that takes no arguments and returns one).
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from harness.model import Case, Layout, WorkspaceConfig


@runtime_checkable
class Port(Protocol):
    """What the harness asks of a side.

    ``plan_layout`` must be a pure function of the case: the same case gives the
    same layout. It may raise for a case it cannot plan; the harness reports that
    case as ``port-error`` and goes on.
    """

    name: str

    def plan_layout(self, case: Case) -> Layout: ...

    def workspace_size(self, config: WorkspaceConfig) -> int: ...


BUILTIN_PORTS: dict[str, str] = {
    "per_request": "ports.per_request:PORT",
    "equal_share": "ports.equal_share:PORT",
}


class PortLoadError(Exception):
    """A port name that cannot be resolved; the message is one line."""


def load_port(spec: str) -> Port:
    """Resolve a built-in name, ``mutant:NAME``, ``cmd:COMMAND`` (an external
    process speaking docs/external-port-protocol.md) or ``package.module:attr``."""
    if spec.startswith("cmd:"):
        from harness.external import ExternalPort, ExternalPortError

        try:
            return ExternalPort(spec.removeprefix("cmd:"))
        except (ExternalPortError, ValueError) as exc:
            raise PortLoadError(f"port {spec!r}: {exc}") from None
    if spec.startswith("mutant:"):
        from ports.mutants import MUTANTS

        name = spec.removeprefix("mutant:")
        if name not in MUTANTS:
            raise PortLoadError(f"unknown mutant {name!r} (known: {', '.join(MUTANTS)})")
        return MUTANTS[name]()
    target = BUILTIN_PORTS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_PORTS))
        raise PortLoadError(f"unknown port {spec!r}: use one of {known} or an import path 'package.module:attr'")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PortLoadError(f"port {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise PortLoadError(f"port {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Port)):
        obj = obj()
    if not isinstance(obj, Port):
        raise PortLoadError(f"port {spec!r}: {attr!r} lacks name, plan_layout and workspace_size")
    return obj
