"""``python -m harness ARGV`` run in the test's own process: a usage error
costs no interpreter start (about 1.7 s, most of it importing torch).

What comes back: the exit code (``main``'s return, which must be an int, or a
``SystemExit``'s code), what the command wrote through ``sys.stdout`` and
``sys.stderr``, and a stderr line for each warning it raised that Python's
default filters would print (every repeat counted: stricter than a process).
An exception escaping ``main`` is not caught: it fails the test as the
traceback on a subprocess's stderr would. Not seen here: writes straight to
file descriptor 2, child processes' output, and what the interpreter does on
its way out. So only commands refused before any work use it (the case file,
the port's name and levels, an empty selection: no pool, no oracle, no child);
the tests whose subject is the process (hash seeds, signals, pids, exit paths
out of a port's own code) start one.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import warnings

from harness.cli import main

# Categories Python's default warning filters print nothing for.
SILENT_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def parity_in_process(*argv: str) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    with (
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        warnings.simplefilter("always")
        try:
            code = main(list(argv))
            assert type(code) is int, f"main returned {code!r}, not an exit code"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    shown = [w for w in caught if not issubclass(w.category, SILENT_BY_DEFAULT)]
    stderr = err.getvalue() + "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in shown
    )
    return subprocess.CompletedProcess(["python", "-m", "harness", *argv], code, out.getvalue(), stderr)
