"""How a port is named and loaded: a built-in short name (``per_request``,
``equal_share``), ``mutant:NAME``, ``cmd:COMMAND`` (an external process) or a
user's import path (``package.module:attr``, where ``attr`` is a port object, or
a class or factory that takes no arguments and returns one).
"""

from __future__ import annotations

import importlib
import os
import sys

from harness.model.levels import LEVELS, PLUGINS_VARIABLE
from harness.model.names import did_you_mean
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, Port, PortLoadError, port_levels
from harness.sides.items import printable, reraise_interrupt

BUILTIN_PORTS: dict[str, str] = {
    "per_request": "ports.per_request:PORT",
    "equal_share": "ports.equal_share:PORT",
}


def load_port(spec: str, timeout_s: float = DEFAULT_PORT_TIMEOUT_S) -> Port:
    """Resolve a built-in name, ``mutant:NAME``, ``cmd:COMMAND`` (an external
    process speaking docs/external-port-protocol.md, each request limited to
    ``timeout_s`` seconds) or ``package.module:attr``."""
    if spec.startswith("cmd:"):
        from harness.protocol.errors import ExternalPortError
        from harness.protocol.external import ExternalPort

        try:
            return ExternalPort(spec.removeprefix("cmd:"), timeout_s)
        except (ExternalPortError, ValueError) as exc:
            raise PortLoadError(f"port {spec!r}: {exc}") from None
    if spec.startswith("mutant:"):
        from ports.mutants import MUTANTS

        name = spec.removeprefix("mutant:")
        if name not in MUTANTS:
            raise PortLoadError(f"unknown mutant {name!r}{did_you_mean(name, MUTANTS)} (known: {', '.join(MUTANTS)})")
        return MUTANTS[name]()
    target = BUILTIN_PORTS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_PORTS))
        raise PortLoadError(
            f"unknown port {spec!r}{did_you_mean(spec, BUILTIN_PORTS)}: use one of {known}, mutant:NAME, "
            "cmd:COMMAND or an import path 'package.module:attr' (parity list ports)"
        )
    levels_before = tuple(LEVELS)
    try:
        port = _load_python_port(spec, target)
    except PortLoadError:
        raise
    except BaseException as exc:
        # Importing or building a user's port runs its code: a sys.exit(0) or an
        # error there is a port that cannot be loaded, never a finished run.
        if isinstance(exc, KeyboardInterrupt):
            raise
        text = " ".join(str(exc).split())
        raise PortLoadError(f"port {spec!r}: loading it raised {type(exc).__name__}: {text}"[:300]) from None
    added = [level for level in LEVELS if level not in levels_before]
    if added:
        # Its level would be planned by no run that chose its levels first and known
        # to no process the run starts: plug-ins load from PARITY_PLUGINS, everywhere.
        close_port(port)
        raise PortLoadError(
            f"port {spec!r} registered level {added[0]} as it loaded: name its module in {PLUGINS_VARIABLE} "
            "so every run and every process it starts has the level"
        )
    return port


def _load_python_port(spec: str, target: str) -> Port:
    module_name, _, attr = target.partition(":")
    # As `python -m` does: a port module in the working directory imports from the
    # `parity` console script too, so a printed `parity ...` line runs as printed.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # Where Python looked: a port's package is found from the working directory or PYTHONPATH.
        path = os.environ.get("PYTHONPATH")
        looked = f"PYTHONPATH={path}" if path else "PYTHONPATH is not set"
        raise PortLoadError(
            f"port {spec!r}: cannot import module {module_name!r} ({exc}); looked in the working directory "
            f"{os.getcwd()} and the environment's packages ({looked}): run from the folder that holds "
            f"{module_name.partition('.')[0]!r}, or put that folder on PYTHONPATH"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise PortLoadError(f"port {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Port)):
        obj = obj()
    if not isinstance(obj, Port):
        raise PortLoadError(f"port {spec!r}: {attr!r} lacks name, plan_layout and workspace_size")
    try:
        port_levels(obj)
    except PortLoadError as exc:
        raise PortLoadError(f"port {spec!r}: {exc}") from None
    return obj


def close_port(port: Port) -> None:
    """An external port's processes end with the command that used it. What
    ``close`` raises (``sys.exit`` included) is reported, never the exit code."""
    close = getattr(port, "close", None)
    if callable(close):
        try:
            close()
        except BaseException as exc:
            reraise_interrupt(exc)
            print(f"parity: warning: port {port.name}: close() raised {printable(repr(exc))}", file=sys.stderr)
