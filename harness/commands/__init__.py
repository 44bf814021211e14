"""The ``parity`` commands, one module each; :mod:`harness.cli` builds the parser.

Each command module exposes ``register(subparsers)``, which adds its
subcommand(s) with their options and binds the function that runs them. A
command function takes the parsed arguments and returns the exit code; bad
input raises :class:`harness.engine.UsageError` (or a
:class:`harness.cases.files.CaseError`), which :func:`harness.cli.main` prints as one
line and exit code 2.
"""
