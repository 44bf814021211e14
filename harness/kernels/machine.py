"""What of this machine can change a CPU kernel's bits: the BLAS's code path,
the CPU's model, and how torch and numpy dispatch on it.

torch's x86 wheels link Intel MKL, which picks its code path by the CPU unless
its conditional numerical reproducibility (CNR) mode names one; ``harness``
sets ``MKL_CBWR=COMPATIBLE`` on import (harness/__init__.py), the one mode
Intel documents as giving the same bits on every x86 CPU MKL runs on, Intel's
and AMD's alike. MKL reads it at its first call: a process that ran a matmul
before importing the harness keeps MKL's own choice, and :func:`blas_mode`
says so.

Invariants:

- :func:`blas_mode` reports what MKL itself says it runs (its
  ``mkl_serv_cbwr_get``, which torch's library exports), never the
  environment variable alone; where it cannot ask, it says so
  (``"mkl (mode unknown)"``).
- :func:`shares_kernel_bits` is True only where the kernels' bits were shown
  not to depend on the machine's x86 model or torch's CPU capability: MKL in
  its compatible mode and the interpreter's exp and log defined
  (:func:`harness.kernels.interpreter.math_defined`). Elsewhere the oracle
  cache keys its answers by :func:`cpu_identity` too
  (harness.sides.oracle_cache_keys), so nothing unmeasured is shared.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from pathlib import Path

from harness.model.host import cpu_model

# MKL's CNR branches (mkl_service.h: MKL_CBWR_*), and its STRICT flag.
_BRANCHES = {
    1: "off",
    2: "auto",
    3: "compatible",
    4: "sse2",
    6: "ssse3",
    7: "sse4_1",
    8: "sse4_2",
    9: "avx",
    10: "avx2",
    11: "avx512_mic",
    12: "avx512",
    13: "avx512_mic_e1",
    14: "avx512_e1",
}
_STRICT = 0x10000
_MKL_CBWR_ALL = -1
COMPATIBLE = "mkl compatible"


@functools.cache
def blas_mode() -> str:
    """``"mkl compatible"``, ``"mkl compatible strict"``, ``"mkl auto"`` ...,
    ``"mkl (mode unknown)"``, or ``"no mkl"`` (another BLAS: ARM's, say, whose
    bits are its own). Asking fixes the mode as a first call would (from
    ``MKL_CBWR``), so the answer holds for the rest of the process."""
    import torch

    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return "no mkl"
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return "mkl (mode unknown)"
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    setting = int(get(_MKL_CBWR_ALL))
    branch = setting & ~_STRICT
    strict = " strict" if setting & _STRICT else ""
    return f"mkl {_BRANCHES.get(branch, f'branch {branch}')}{strict}"


def cpu_identity() -> dict[str, str]:
    """The CPU and how torch dispatches on it: what keys an answer where
    :func:`shares_kernel_bits` does not hold."""
    import torch

    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def shares_kernel_bits() -> bool:
    """Whether this process's CPU kernels compute the bits every x86 machine
    does (module docstring): MKL in its compatible mode, the interpreter's exp
    and log defined."""
    from harness.kernels.interpreter import math_defined

    return blas_mode() == COMPATIBLE and math_defined()


def machine_label() -> str:
    """This machine as a cache entry records who wrote it: the architecture,
    the CPU's model, torch's capability, numpy's widest SIMD in use, the BLAS's
    mode. Two processes with one label compute the same kernel bits."""
    import torch
    from numpy._core._multiarray_umath import __cpu_features__ as features

    simd = next((name for name in ("AVX512F", "AVX2", "ASIMD", "NEON") if features.get(name)), "none")
    return (
        f"{platform.machine()} {cpu_model()}, torch {torch.backends.cpu.get_cpu_capability()}, "
        f"numpy {simd}, {blas_mode()}"
    )
