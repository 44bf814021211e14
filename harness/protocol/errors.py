"""How an external port fails one request; both sides of the wire raise it: the
client (:mod:`harness.protocol.external`) and its sparse half
(:mod:`harness.protocol.external_sparse`)."""

from __future__ import annotations

from typing import Any


class ExternalPortError(Exception):
    """The port failed one request; the message is one line (plus stderr's tail).
    ``reply`` is the port's own ``ok: false`` reply, when it sent one."""

    def __init__(self, message: str, reply: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reply = reply or {}
