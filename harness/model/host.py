"""The host a run ran on, as the data it records says it: the CPU's model.
Without torch (a run of the host levels never loads it): the verdicts' provenance
and the kernels' machine identity (harness.kernels.machine) both read it here."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name, as the operating system gives it (Linux's
    /proc/cpuinfo), else the platform's description of the processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
