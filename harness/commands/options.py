"""Option groups several commands share, so every command spells them alike."""

from __future__ import annotations

import argparse

from harness.runner import LEVELS
from harness.suites import suite_names


def port_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", default="per_request", help="per_request, equal_share, or package.module:attr")
    p.add_argument(
        "--allow-oracle-drift",
        action="store_true",
        help="run even if an oracle fingerprint differs from the pin (every output says so)",
    )


def device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where L2 and L3 run: cpu (Triton interpreted) or cuda (Triton compiled, GPU shared kernels)",
    )


def selection_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
    group.add_argument("--cases", nargs="+", metavar="FILE_OR_DIR", help="case files or folders instead of a suite")
    p.add_argument("--size", type=int, help="number of generated layout cases (overrides the suite's count)")
    p.add_argument("--level", choices=(*LEVELS, "all"), default="all", help="parity level(s) to check")
    p.add_argument("--shard", metavar="K/N", help="run only shard K of N (deterministic, interleaved)")
    p.add_argument("--results", metavar="FILE", help="write each item's row as it finishes (JSON lines)")
    p.add_argument("--resume", action="store_true", help="finish the run recorded in --results FILE")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a port call may take (default 300)")


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value
