"""The parity harness: the oracle (vLLM, called) and a port run side by side on
the same cases, and their chunk layouts, output tokens and LSE compared to the bit.

The packages are the layers, each importing only those below it (the
contracts in pyproject.toml, checked by ``lint-imports`` in ``make test``):

========================  =========================================================
``harness.commands``      the command line: one module per ``parity`` command
                          (entry points beside it: ``cli``, ``__main__``,
                          ``pytest_plugin``); ``reports`` renders what they write
``harness.engine``        the front door: a :class:`~harness.engine.RunRequest` in,
                          the oracle opened, the device chosen, the items run
                          (in process or pooled), kills shrunk, ports closed
``harness.night``         the nightly job, its history, and the drift watch
``harness.search``        searching for bugs: mutants, shrinking, explore, coverage
``harness.verdicts``      results judged: summary table, baselines, the gate,
                          results files, reproduce lines, provenance
``harness.sides``         running the two sides: loading ports, the runners of
                          each level, DCP ranks, worker pools, the oracle cache
``oracle`` | ``ports``    the oracle (the only code that touches vLLM) and the
                          ports under test (never touch vLLM)
``harness.compare``       layouts and tensors compared (bits, ULPs, first divergence)
``harness.protocol``      what a port is: the Python protocol and the external
                          process protocol (docs/external-port-protocol.md)
``harness.cases``         cases: the files, the generators, the suites
``harness.kernels``       the shared kernels both sides run (gather, projection,
                          attention, the masked sparse kernel, L3 inputs)
``harness.model``         the data model: cases, layouts, chunks (dense, sparse, DCP)
========================  =========================================================
"""

import os

# Intel MKL (torch's BLAS on x86) picks its code path by the CPU it finds, and
# the path changes a float32 matmul's bits (an AVX-512 Intel host and an AMD one
# would compute other answers). Its conditional numerical reproducibility mode
# COMPATIBLE gives the same bits on every x86 CPU it runs on; MKL reads the mode
# at its first call, so it is set when the harness is imported, before any
# (harness.kernels.machine.blas_mode says which mode a process got; the oracle cache
# keys by it). A mode the user sets is kept.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
