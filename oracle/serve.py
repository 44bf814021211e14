"""One vLLM release as the harness's oracle, served from inside its own environment.

``python -m oracle.serve`` runs in the tox environment of a release
(``.tox/vllm-X``, tox.ini) and answers the harness over the external-port
protocol (docs/external-port-protocol.md: one JSON object per line on stdin and
stdout), so any release can be the oracle without sharing a process, or a
torch, with the harness. :class:`oracle.process.OracleProcess` is the other end.

Ops: ``hello`` (the release, its pin's fingerprint statuses, the levels and
the ops), and every level's served ops, each answered by its level's module
(:attr:`harness.model.levels.LevelSpec.served`: ``layout``,
``workspace_size``, ``merge``, ``oracle_prefill`` and the sparse path's, and
a plug-in level's). The tensor ops read their inputs from a safetensors file
the harness wrote and write their outputs to another, as a port's do, with
one difference: every input tensor travels as its whole storage plus its view
(:mod:`harness.protocol.served`). L3 runs the release's own context loop and
final merge on the harness's shared CPU kernels, inside this process. Under
decode context parallelism only the harness's own rank's cache travels; the
process rebuilds every rank's by the harness's deterministic code and checks
the sent one against it bit for bit (:func:`harness.levels.prefill.rank_caches`).

An exception the release's side marks as a refusal (``refusal = True``:
:class:`oracle.legacy.LegacyRefusal`, a batch that release cannot plan or run)
is replied ``ok: false, refusal: true`` with its message; any other exception
``ok: false`` with its type and first line. Both make the item
``oracle-error``; only the first is a class a baseline may expect. Nothing but protocol replies
reaches stdout: the process's own stdout is sent to stderr before vLLM loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, Any

PROTOCOL_VERSION = 1
# The release whose oracle is not the pinned one's code: its own side module.
LEGACY_RELEASE = "0.27.1"


def side_for(release_version: str) -> Any:
    """The side that calls ``release_version``'s code (the Port interface)."""
    if release_version == LEGACY_RELEASE:
        from oracle.legacy import LegacyOracleSide

        return LegacyOracleSide()
    from oracle.side import OracleSide

    return OracleSide()


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def hello() -> dict[str, Any]:
    """The installed release, its pin's statuses (``pin`` null when the release
    has none) and what this server answers."""
    from harness.model.levels import LEVELS, served_ops
    from oracle.pin import check_fingerprints, installed_version, load_pin, pin_file_for

    version, commit = installed_version()
    path = pin_file_for(version)
    pin: dict[str, Any] | None = None
    statuses: list[dict[str, Any]] = []
    if path.is_file():
        loaded = load_pin(path)
        pin = {k: loaded.get(k) for k in ("release", "upstream_commit", "upstream_pr")}
        statuses = [
            {"symbol": s.symbol, "expected": s.expected, "found": s.found, "status": s.status}
            for s in check_fingerprints(path)
        ]
    return {
        "protocol": PROTOCOL_VERSION,
        "name": f"oracle vllm=={version}",
        "levels": list(LEVELS),
        "ops": served_ops(),
        "installed_vllm": version,
        "installed_commit_id": commit,
        "pin": pin,
        "fingerprints": statuses,
        # What else decides this process's answers (the harness's oracle cache keys on it).
        "environment": numeric_environment(),
    }


def numeric_environment() -> dict[str, str | None]:
    """The Python, torch, Triton and numpy versions of this environment."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "triton", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


class Server:
    def __init__(self) -> None:
        from oracle.pin import installed_version

        self.version, _ = installed_version()
        self.side = side_for(self.version)

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply's fields to one request: ``hello``, or the op of the level
        that serves it (an unknown op is an error reply naming it)."""
        from harness.model.levels import served_op

        op = request.get("op")
        if op == "hello":
            return hello()
        return served_op(str(op))(self.side, request)


def serve(requests: IO[str], replies: IO[str]) -> int:
    server: Server | None = None
    for line in requests:
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            replies.write(json.dumps({"id": None, "ok": False, "error": "request is not JSON"}) + "\n")
            replies.flush()
            continue
        if request.get("op") == "bye":
            return 0
        try:
            if server is None:
                server = Server()
            reply = {"ok": True, **server.answer(request)}
        except Exception as exc:
            # A refusal (an exception the side marks ``refusal``) is a class of
            # batches the release cannot plan or run, stated in its own words; any
            # other exception is the oracle failing, never a class a baseline names.
            if getattr(exc, "refusal", False):
                reply = {"ok": False, "error": str(exc).splitlines()[0], "refusal": True}
            else:
                reply = {"ok": False, "error": one_line(exc)}
        replies.write(json.dumps({"id": request.get("id"), **reply}) + "\n")
        replies.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--hello", action="store_true", help="print the hello reply (release, pin statuses) and exit")
    args = parser.parse_args(argv)
    import torch

    # One intra-op thread, as in every process of the harness that compares
    # (harness.engine.device.NUMERIC_THREADS): an fp32 matmul's bits depend on it.
    torch.set_num_threads(1)
    # Only protocol replies go to the real stdout; anything vLLM or torch print
    # goes to stderr, where the harness keeps its tail for error messages.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if args.hello:
        replies.write(json.dumps(hello(), indent=2) + "\n")
        replies.flush()
        return 0
    return serve(sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main())
