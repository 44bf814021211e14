"""Time limits on a port's calls, and what a timeout looks like in a result.

A port call past its limit is a ``port-error`` whose text says so: an
in-process port's :class:`PortTimeout` (raised by SIGALRM, :func:`time_limit`),
or an external port's own deadline (docs/external-port-protocol.md: the
process is killed). :func:`is_timeout` recognises both, for the verdicts that
must not count a timeout as what it is not (a mutant killed by a hang was not
caught by a comparison).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

# How a timed-out call's error reads: the in-process limit's, and the external port's
# (harness/protocol/external.py: it did not read its request, or did not answer, in time).
TIMEOUT_MARKERS = ("PortTimeout: ", "port did not answer within ", "port did not read its request within ")


def is_timeout(error: str | None) -> bool:
    """Whether an item's error is a port call that ran past its time limit."""
    return bool(error) and any(marker in str(error) for marker in TIMEOUT_MARKERS)


class PortTimeout(Exception):
    """A port call ran past the per-item time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`PortTimeout` in the calling (main) thread after ``seconds``.

    SIGALRM interrupts Python code, including ``time.sleep``; a port hung inside
    a C call that never returns to the interpreter is out of its reach (an
    external port process, killed by the protocol's own timeout, is not).
    """
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise PortTimeout(f"port call exceeded the {seconds:g} s time limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def limit_for(port: Any, timeout_s: float) -> float:
    """The harness's limit for one call (0: none). A port that enforces the limit
    itself on every request it makes (an external process: writing each request
    and reading its reply have a deadline, starting it has its own) gets none:
    one call may restart the process and send several requests, and an L3 call
    includes the harness's own kernel work for it, none of which is the port's time."""
    return 0.0 if getattr(port, "enforces_timeout", False) else timeout_s
