"""``parity``: the command line (also ``python -m harness``).

This module builds the parser from the command modules in
:mod:`harness.commands` (one per command) and maps their outcome to the exit
code: 0 every item at parity, 1 some item diverges or errors (for
``coverage``: some target is missed), 2 bad input or usage (one line on stderr
naming the file, field and reason), 130 interrupted (Ctrl-C; what finished is
summarised and written first).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, TextIO

# Only the standard library at import time: the console script imports this module
# before main() runs, and torch takes seconds to import, so a Ctrl-C then must
# still land in main()'s handler, not in a traceback.
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130
COMMANDS = ("run", "gate", "diff", "nightly", "mutants", "shrink", "coverage", "explore", "list", "oracle", "drift")


def version_line() -> str:
    """The version of the checkout that runs (its pyproject.toml: an installed
    distribution may be another checkout's, or none), its commit, and the pin."""
    import tomllib

    from harness.verdicts.launch import harness_root
    from harness.verdicts.provenance import repository_state
    from oracle.pin import load_pin

    with (harness_root() / "pyproject.toml").open("rb") as project:
        harness_version = tomllib.load(project)["project"]["version"]
    commit = repository_state().get("commit")
    at = f" at {str(commit)[:10]}" if commit else ""
    pin = load_pin()
    return f"parity {harness_version}{at} (oracle pin: {pin['release']} @ {pin['upstream_commit']})"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the harness version and the oracle pin, and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from harness.commands.options import Parser

    parser = Parser(prog="parity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        module = "listing" if command == "list" else command
        importlib.import_module(f"harness.commands.{module}").register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: what finished is summarised and written."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


class _PipeSafe:
    """``sys.stdout`` for a reader that may go away (``parity run | head``):
    once the pipe is closed, output goes nowhere and the command carries on, so
    its reports are written and its exit code is the verdict's."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def _closed(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._inner.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except BrokenPipeError:
            self._closed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(argv: list[str] | None = None) -> int:
    """Run one ``parity`` command; its exit code (see the module docstring)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Before a command took over (importing torch, say): nothing to write yet.
        print("\nparity: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    import signal
    import threading

    from harness.cases.fields import CaseError
    from harness.engine import UsageError
    from harness.model.levels import LevelRegistryError, load_plugins
    from harness.protocol.port import PortLoadError

    # Triton's interpreter evaluates -inf - -inf in numpy before the kernel selects
    # the -inf it wants; the warning is noise in every numeric run.
    warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
    try:
        # The plug-in levels and case fields first: the options' choices name them.
        load_plugins()
    except LevelRegistryError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    stdout = sys.stdout
    if not isinstance(stdout, _PipeSafe) and hasattr(stdout, "fileno"):
        try:
            stdout.fileno()
            sys.stdout = _PipeSafe(stdout)
        except (OSError, ValueError):
            pass  # not a real file (a test's capture): nothing to guard
    previous_term = None
    if threading.current_thread() is threading.main_thread():
        previous_term = signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args)
        return code
    except (CaseError, PortLoadError, UsageError, LevelRegistryError) as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nparity: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        sys.stdout = stdout
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _PipeSafe(stdout).flush()


if __name__ == "__main__":
    sys.exit(main())
