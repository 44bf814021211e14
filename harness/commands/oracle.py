"""``parity oracle``: the pin, the installed vLLM and each fingerprint's status."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.common import EXIT_DIVERGENT, EXIT_PARITY
from harness.engine import UsageError


def register(sub: Any) -> None:
    p_oracle = sub.add_parser("oracle", help="the pin, the installed vLLM and each fingerprint's status")
    p_oracle.add_argument("--record", action="store_true", help="rewrite the pin's fingerprints (maintainers)")
    p_oracle.set_defaults(func=cmd_oracle)


def cmd_oracle(args: argparse.Namespace) -> int:
    from oracle.environment import OracleUnavailable
    from oracle.pin import check_fingerprints, installed_version, load_pin
    from oracle.trace import record_fingerprints

    pin = load_pin()
    print(f"pin: upstream commit {pin['upstream_commit']} ({pin['upstream_pr']}), release {pin['release']}")
    try:
        version, commit = installed_version()
        if args.record:
            record_fingerprints()
        statuses = check_fingerprints()
    except OracleUnavailable as exc:
        raise UsageError(str(exc)) from None
    print(f"installed: vllm {version}, commit id {commit} (pinned release reports {pin['release_commit_id']})")
    for s in statuses:
        print("  " + s.line())
    ok = all(s.status == "ok" for s in statuses) and version == pin["release_version"]
    print("oracle: OK" if ok else "oracle: DRIFTED from the pin")
    return EXIT_PARITY if ok else EXIT_DIVERGENT
