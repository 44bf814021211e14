"""``python -m harness ARGV`` run in the test's own process: a usage error
costs no interpreter start (about 1.7 s, most of it importing torch).

What a subprocess would show is what comes back: the exit code (``main``'s
return, or a ``SystemExit``'s code), stdout, and stderr with a line for every
warning Python's default filters would have printed (deprecation, import and
resource warnings are silent there too). An exception escaping ``main`` is not
caught: it fails the test as the traceback on a subprocess's stderr would.
Tests whose subject is the process itself (hash seeds, signals, pids, exit
paths out of a port's own code) start one instead.
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
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    shown = [w for w in caught if not issubclass(w.category, SILENT_BY_DEFAULT)]
    stderr = err.getvalue() + "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in shown
    )
    return subprocess.CompletedProcess(["python", "-m", "harness", *argv], code, out.getvalue(), stderr)
