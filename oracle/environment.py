"""The one place that prepares the process for importing the pinned vLLM.

SPEC section 2: on a CPU the oracle needs ``VLLM_TARGET_DEVICE=cpu`` (the CPU
platform, so no pinned memory), ``CUDA_VISIBLE_DEVICES=""`` and
``TRITON_INTERPRET=1`` (Triton's interpreter runs the merge kernel on CPU
tensors), all set before ``vllm`` is first imported. Every module of the oracle
imports vLLM through :func:`import_vllm_module`, never directly.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

CPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    "TRITON_INTERPRET": "1",
    # The oracle's own logging would interleave with the harness's output.
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_CONFIGURE_LOGGING": "0",
}


# On a GPU machine the oracle keeps CUDA visible and Triton compiled. vLLM's
# compiled extension is absent there, so its CUDA platform cannot load, and on a
# CUDA platform merge_attn_states would dispatch to the compiled op: selecting
# the CPU platform keeps vLLM importable and sends the merge down its Triton
# branch, which Triton compiles for the GPU tensors it is given.
GPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    "TRITON_INTERPRET": "0",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_CONFIGURE_LOGGING": "0",
}
_device = "cpu"


def use_device(device: str) -> None:
    """Select the recipe ("cpu" or "cuda") before vLLM is imported."""
    global _device
    if "vllm" in sys.modules and device != _device:
        raise OracleUnavailable(f"vllm is already imported for {_device}; cannot switch to {device}")
    _device = device


def selected_device() -> str:
    """The recipe :func:`use_device` selected ("cpu" unless told)."""
    return _device


class OracleUnavailable(Exception):
    """The pinned vLLM cannot be imported; the message is one line."""


def prepare_cpu_environment() -> None:
    """Set the CPU recipe, refusing if vLLM was already imported without it."""
    if "vllm" in sys.modules:
        wrong = {
            k: os.environ.get(k)
            for k, v in CPU_ENVIRONMENT.items()
            if k != "VLLM_LOGGING_LEVEL" and os.environ.get(k) != v
        }
        if wrong:
            raise OracleUnavailable(f"vllm was imported before the oracle's CPU environment was set ({wrong})")
        return
    os.environ.update(CPU_ENVIRONMENT)


def prepare_environment() -> None:
    """The selected device's recipe, in this process, without importing vLLM:
    what a run needs when its oracle lives in another process (the port's
    Triton kernels read ``TRITON_INTERPRET`` here all the same)."""
    if _device == "cpu":
        prepare_cpu_environment()
    else:
        os.environ.update(GPU_ENVIRONMENT)


def module_source_file(name: str) -> Path:
    """The source file importing the vLLM module ``name`` would run, found without
    importing anything (vLLM's packages do not rewrite their ``__path__``)."""
    spec = importlib.util.find_spec(name.partition(".")[0])
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if len(locations) == 1:
        base = Path(locations[0]).joinpath(*name.split(".")[1:])
        # A package before a module of the same name, as Python's finder looks.
        for candidate in (base / "__init__.py", base.parent / f"{base.name}.py"):
            if candidate.is_file():
                return candidate
    raise OracleUnavailable(f"cannot find the source of {name} in the installed vLLM")


@contextlib.contextmanager
def stood_in_modules(stand_ins: Mapping[str, ModuleType]) -> Iterator[None]:
    """``sys.modules`` holds ``stand_ins`` (name: module) while the block runs,
    and afterwards what it held for those names before (absent stays absent).
    Only those names: ``mock.patch.dict(sys.modules)`` copies and restores the
    whole table (thousands of modules) on every call, which cost the sparse
    oracle seconds a suite, and it would drop every module the block imported."""
    absent = object()
    saved = {name: sys.modules.get(name, absent) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is absent:
                sys.modules.pop(name, None)
            else:
                # A None entry (an import blocked on purpose) comes back as None.
                sys.modules[name] = module  # type: ignore[assignment]


def import_vllm_module(name: str) -> ModuleType:
    if _device == "cpu":
        prepare_cpu_environment()
    else:
        os.environ.update(GPU_ENVIRONMENT)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("vllm").setLevel(logging.ERROR)
            module = importlib.import_module(name)
    except Exception as exc:
        raise OracleUnavailable(f"cannot import {name} from the pinned vLLM: {type(exc).__name__}: {exc}") from exc
    # vLLM's Triton kernels run in the interpreter on CPU: without its discarded work.
    from harness.kernels.interpreter import streamline_interpreter

    streamline_interpreter()
    return module
