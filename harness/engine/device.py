"""The device a run compares on: its recipe set before anything imports Triton
or vLLM, torch's threads fixed, and its shared kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.engine.errors import UsageError

if TYPE_CHECKING:
    from harness.cases.suites import Suite
    from harness.kernels import SharedKernels

# Torch's intra-op threads in every process that compares. The shared kernels'
# float results depend on the thread count (a divergent item's ULP figures
# differ between 1 and 2 threads), so it is fixed: the same figures for any
# --jobs and any machine's core count, and N workers never oversubscribe N cores.
NUMERIC_THREADS = 1

# The cyclic garbage collector's thresholds in every process the harness starts
# to compare (the pytest plugin leaves its host session's as they were). A ci run
# builds millions of small lists and tuples (the oracle cache's layouts) that
# live to the end of the run; at Python's default (a young collection every 700
# allocations) the collector walks them again and again: a warm ci layout run
# took 16.7 s at Python's (700, 10, 10) and 14.9 s at (100_000, 50, 100), and
# this one is within 0.4 s of the latter. Only the young generation's threshold
# is raised: the older generations are still collected at Python's ratios, so
# cycles (a traceback holding a tensor) are freed as they would be, after about
# fourteen times the allocations.
GC_THRESHOLDS = (10_000, 10, 10)


def _use_device(device: str) -> None:
    """Set ``device``'s recipe (oracle.environment.use_device); a device this
    machine cannot serve is a one-line UsageError."""
    from oracle.environment import OracleUnavailable, use_device

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device cuda: torch {torch.__version__} sees no CUDA device on this machine")
    try:
        use_device(device)
    except OracleUnavailable as exc:
        raise UsageError(f"--device {device}: {exc}") from None


def prepare_device(device: str) -> None:
    """Set ``device``'s recipe in this process before any port is loaded: a port
    module that imports Triton (the mutants do) fixes Triton's mode at import, and
    the oracle's interpreted kernels call Triton's library helpers, which must be
    built in the same mode."""
    from oracle.environment import prepare_environment

    _use_device(device)
    prepare_environment()


def refuse_other_inputs() -> None:
    """A machine that draws other inputs than the repository's judges no tensor
    (harness.sides.input_digests): one line, before any work. Every process that
    compares tensors selects its device (:func:`select_device`), which checks."""
    from harness.sides.input_digests import InputsDiffer, check_stream

    try:
        check_stream()
    except InputsDiffer as exc:
        raise UsageError(str(exc)) from None


def prepare_tensor_levels() -> None:
    """Before any port loads, in a run that compares tensors: the shared kernels
    record their definitions (they do when first imported:
    harness.kernels.kernels_untouched), and a machine that draws other inputs is
    refused (:func:`refuse_other_inputs`)."""
    import harness.kernels  # noqa: F401

    refuse_other_inputs()


def refuse_uncovered_inputs(suite: Suite, levels: tuple[str, ...], size: int | None = None) -> None:
    """A run of a digested suite (ci, smoke) whose tensor items the committed
    digests do not all cover is refused in one line: none would go unchecked
    (a ``--size`` past the suite's own grows such items: the line says so)."""
    from harness.sides.input_digests import InputsDiffer, check_covered
    from harness.sides.runner import plan_items

    try:
        check_covered(suite.name, plan_items(suite, levels))
    except InputsDiffer as exc:
        if size is not None:
            raise UsageError(
                f"--size {size}: suite {suite.name} grown past its own size holds tensor items no committed input "
                f"digest covers, whose inputs would go unchecked (a --size up to the suite's own is covered): {exc}"
            ) from None
        raise UsageError(str(exc)) from None


def select_host(device: str) -> None:
    """What :func:`select_device` sets that is not torch's: the collector's
    thresholds (:data:`GC_THRESHOLDS`) and ``device``'s recipe, in this
    process's environment too (:func:`prepare_device`): a worker whose oracle
    answers all come from the cache never imports vLLM, and the port's Triton
    kernels must still find ``TRITON_INTERPRET``. Enough for a run whose levels
    compare no tensor (layouts and workspace sizes): it never loads torch, whose
    import is most of such a process's start-up."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    prepare_device(device)


def select_device(device: str) -> SharedKernels:
    """Prepare the oracle's recipe for ``device``, fix torch's threads at
    :data:`NUMERIC_THREADS` and the collector's at :data:`GC_THRESHOLDS`, and
    return that device's shared kernels. Call before the oracle is opened (vLLM
    reads the recipe on import)."""
    import torch

    from harness.kernels import kernels_for
    from harness.kernels.interpreter import streamline_interpreter

    torch.set_num_threads(NUMERIC_THREADS)
    select_host(device)
    # The interpreter's exp and log are defined before any answer is keyed
    # (harness.kernels.machine.shares_kernel_bits), not at the oracle's first import.
    streamline_interpreter()
    refuse_other_inputs()
    return kernels_for(device)
