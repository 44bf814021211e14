"""Which BLAS code path this process's CPU matmuls take.

torch's x86 wheels link Intel MKL, which picks its code path by the CPU unless
its conditional numerical reproducibility (CNR) mode names one; ``harness``
sets ``MKL_CBWR=COMPATIBLE`` on import (harness/__init__.py), the one mode
whose bits are the same on every x86 CPU MKL runs on, Intel's and AMD's alike.
MKL reads it at its first call: a process that ran a matmul before importing
the harness keeps MKL's own choice, and :func:`blas_mode` says so.

Invariant: :func:`blas_mode` reports what MKL itself says it runs (its
``mkl_serv_cbwr_get``, which torch's library exports), never the environment
variable alone; where it cannot ask, it says so (``"mkl (mode unknown)"``),
and the oracle cache keys by the text (harness.sides.oracle_cache_keys), so an
answer is shared only between processes that report the same mode.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

# MKL's CNR branches (mkl_service.h: MKL_CBWR_*), as mkl_cbwr_get(MKL_CBWR_BRANCH) returns them.
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
_MKL_CBWR_BRANCH = 1


@functools.cache
def blas_mode() -> str:
    """``"mkl compatible"``, ``"mkl auto"`` ..., ``"mkl (mode unknown)"``, or
    ``"no mkl"`` (another BLAS: ARM's, say, whose bits are its own). Asking
    fixes the mode as a first call would (from ``MKL_CBWR``), so the answer
    holds for the rest of the process."""
    import torch

    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return "no mkl"
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return "mkl (mode unknown)"
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    branch = int(get(_MKL_CBWR_BRANCH))
    return f"mkl {_BRANCHES.get(branch, f'branch {branch}')}"
