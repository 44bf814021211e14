"""Option groups and value types several commands share, so every command
spells them alike and refuses the same bad values (argparse: exit 2, one line)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from harness.cases.suites import suite_names
from harness.engine import values
from harness.model.names import did_you_mean
from harness.sides.items import LEVELS

_T = TypeVar("_T")

# Every form ``--port`` accepts, as ``parity list ports`` and each command's help name them.
PORT_FORMS = (
    ("per_request", "built in: ports/per_request, the port of b38e111d3e (the default)"),
    ("equal_share", "built in: ports/equal_share, the legacy equal-share grid"),
    ("mutant:NAME", "per_request with one seeded bug (parity list mutants)"),
    ("cmd:COMMAND", "an external process speaking docs/external-port-protocol.md"),
    ("package.module:attr", "a Python port object importable from the working directory"),
)
PORT_HELP = "the port under test: " + "; ".join(f"{form} ({meaning})" for form, meaning in PORT_FORMS)
# --size, as every command that loads a suite takes it (harness/cases/suites.py, SuiteScale).
SIZE_HELP = (
    "the suite's scale: N generated layout cases, and every other part of the suite (its case files, "
    "workspace grids, sparse batches and numeric groups) its share, at least one item each while N > 0; "
    "a suite without generated cases (smoke, gpu) stays whole"
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that names every default: an option whose help does not already say
    its default gets ``(default: X)``, unless it has none (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default is argparse.SUPPRESS:
            return text
        if not action.option_strings:
            return text
        return f"{text} (default: {default})"


class Parser(argparse.ArgumentParser):
    """Every ``parity`` parser: help with defaults, and bad usage as one line
    (exit 2) pointing at the help, like every other bad input."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def port_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", default="per_request", help=PORT_HELP)
    oracle_options(p)


def oracle_options(p: argparse.ArgumentParser) -> None:
    from oracle.pin import load_pin

    pinned = load_pin()["release"]
    p.add_argument(
        "--oracle",
        default=pinned,
        metavar="vllm==X.Y.Z",
        help=f"the upstream release to compare with: the pin ({pinned}, the default) runs in-process; any other "
        "in its own environment .tox/vllm-X.Y.Z, built on first use (for example vllm==0.27.1, the legacy grid)",
    )
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


def dcp_backend_option(p: argparse.ArgumentParser) -> None:
    from harness.sides.dcp_ranks import DCP_BACKEND_CHOICES

    p.add_argument(
        "--dcp-backend",
        choices=DCP_BACKEND_CHOICES,
        default="one-process",
        help="how a DCP case's L3 plays its ranks: one-process (every rank in this process, the default), "
        "gloo (one process per rank over torch.distributed on the CPU) or nccl (one per rank and GPU, --device cuda)",
    )


def selection_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--suite", default="ci", help=f"one of {', '.join(suite_names())} (default ci)")
    group.add_argument(
        "--cases",
        nargs="+",
        metavar="FILE_OR_DIR",
        help="case files, sparse item files or folders of them instead of a suite (each file read by its kind)",
    )
    p.add_argument("--size", type=non_negative_int, help=SIZE_HELP)
    p.add_argument(
        "--level", type=level_choice, choices=(*LEVELS, "all"), default="all", help="parity level(s) to check"
    )
    p.add_argument("--shard", metavar="K/N", help="run only shard K of N (deterministic, interleaved)")
    p.add_argument("--results", metavar="FILE", help="write each item's row as it finishes (JSON lines)")
    p.add_argument("--resume", action="store_true", help="finish the run recorded in --results FILE")
    p.add_argument("--timeout", type=positive_seconds, default=300.0, help="seconds a port call may take (default 300)")
    p.add_argument(
        "--time-limit",
        type=positive_seconds,
        metavar="SECONDS",
        help="seconds the whole run may take; then it stops, writing everything measured (the rest not run)",
    )


def jobs_options(p: argparse.ArgumentParser) -> None:
    """``--jobs`` (worker processes, :mod:`harness.sides.pool`) and ``--no-oracle-cache``."""
    from harness.sides.job_sizing import POOL_PAYS_OFF_S

    p.add_argument(
        "--jobs",
        type=jobs_count,
        metavar="N|auto",
        help="worker processes to spread the work over, >= 1, or auto: every core the machine's memory can feed "
        "(never more: a larger N is cut, and says so); results, files and reports are the same for any N "
        f"(default: auto when the work is estimated at {POOL_PAYS_OFF_S:g} s or more, else 1: in this process)",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where the workers run: local (this machine's processes, --jobs of them) or ray (actors on a Ray "
        "cluster, one per CPU of it unless --jobs says; the same results; needs the ray extra)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --executor ray: the cluster to run on (host:port, or local for one started in this process; "
        "default: RAY_ADDRESS, else local)",
    )
    oracle_cache_option(p)


def oracle_cache_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-oracle-cache",
        action="store_true",
        dest="no_oracle_cache",
        help="compute every oracle result afresh (no cache in memory or on disk)",
    )


def _for_argparse(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """``parse`` (:mod:`harness.engine.values`) as an argparse ``type=``: its
    ValueError becomes the one line argparse prints after the option's name."""

    def checked(text: str) -> _T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = parse.__name__
    return checked


non_negative_seconds = _for_argparse(values.non_negative_seconds)
positive_seconds = _for_argparse(values.positive_seconds)
jobs_count = _for_argparse(values.jobs_count)
positive_int = _for_argparse(values.positive_int)
non_negative_int = _for_argparse(values.non_negative_int)


def choice_of(known: Callable[[], Sequence[str]]) -> Callable[[str], str]:
    """An argparse ``type`` for a name among ``known()`` (read when parsing: a
    plug-in level is known by then): a misspelt one is refused naming the
    closest known name, where argparse's ``choices`` would only list them."""

    def checked(text: str) -> str:
        names = list(known())
        if text not in names:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r}{did_you_mean(text, names)} (choose from {', '.join(map(repr, names))})"
            )
        return text

    checked.__name__ = "choice"
    return checked


def level_choice(text: str) -> str:
    """``--level``: a registered level or ``all``."""
    return choice_of(lambda: (*LEVELS, "all"))(text)
