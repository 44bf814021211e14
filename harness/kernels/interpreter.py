"""Triton's interpreter without the work whose result it throws away.

On CPU tensors every Triton kernel, the oracle's (vLLM's merge and top-k mask
kernels) and the ports' alike, runs in Triton's interpreter
(``TRITON_INTERPRET=1``): one Python call per operation per program. Two parts
of that work never reach a value, and on the ci suite they were a third of the
oracle's time (cold ``parity run --suite ci --jobs 1``: 170 s plain, 114 s
streamlined, docs/figures.md):

- **The integer-overflow check.** Every integer ``+``, ``-`` and ``*`` a program
  makes (its index arithmetic) is computed a second time in int64, compared
  with the type's bounds, and the outcome handed to ``device_assert``, which
  drops it unless the interpreter's ``debug`` option is on. It is off (as in a
  compiled kernel, whose check is compiled out without ``debug``), so the check
  is switched off (``sanitize_overflow``) only while ``debug`` is off.
- **The language patch on every helper call.** A kernel's launch patches
  ``triton.language`` for the interpreter (and undoes it at the end); each call
  of a ``@triton.jit`` helper from inside the kernel patches it again, walking
  every member of the language's modules with ``inspect.getmembers``, to the
  same effect: the patch a launch has made is already in force. Streamlined, a
  helper's call patches once per launch (per set of language modules its
  globals see) and then runs as before.

Invariants a reader must keep:

- Streamlined, the interpreter computes every value it computed before, bit for
  bit (tests/test_interpreter.py runs the oracle's kernels both ways): nothing
  here changes an operation, an operand or an order; it removes a computation
  whose result is discarded and a repeat of a patch already applied.
- Only the interpreter whose source was read is streamlined: the functions
  changed or relied on are fingerprinted (:data:`READ_SOURCES`); any other
  Triton, or ``debug`` on, is left as it is (slower, never different).
- ``PARITY_PLAIN_TRITON_INTERPRETER=1`` leaves the interpreter as Triton ships
  it, for whoever wants to see the figures or the bits without this module.
- Calling :func:`streamline_interpreter` is idempotent, imports Triton only
  when the interpreter is the mode (``TRITON_INTERPRET=1``), and is done where
  Triton kernels are about to be built or imported: the oracle's vLLM import
  and the ports' kernel builders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
from typing import Any

# sha256 of the source of each interpreter function this module replaces or
# whose behaviour it relies on, as read in Triton 3.9.0.
READ_SOURCES = {
    "InterpretedFunction.__call__": "f2446df46264004916b677478c2eef6ef349bd2c04a99da9eade596b78cd54d8",
    "GridExecutor.__call__": "e52d3746b0f33a88dd4e678c0dc5a9fb518efc986cebccc61e16185fd8860d46",
    "TritonSemantic.device_assert": "361fee05925913d289320495bb4d8032d420cd732379bc642da22d5dff319dd5",
    "TritonSemantic.binary_op_sanitize_overflow_impl": (
        "bdd7f3e24aa645ab7d9560d3c8df63c971f33d54937cb3ed5851e3c7d2eb9467"
    ),
    "_patch_lang": "e5beeba74ada48294c1d0dbee3e55a5ac185992e2197b7ee706f3f061d880989",
}

PLAIN_ENV = "PARITY_PLAIN_TRITON_INTERPRETER"

_state: dict[str, Any] = {"done": False, "streamlined": False, "skipped": 0}


def _read_functions() -> dict[str, Any]:
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    return {
        "InterpretedFunction.__call__": interpreter.InterpretedFunction.__call__,
        "GridExecutor.__call__": interpreter.GridExecutor.__call__,
        "TritonSemantic.device_assert": TritonSemantic.device_assert,
        "TritonSemantic.binary_op_sanitize_overflow_impl": TritonSemantic.binary_op_sanitize_overflow_impl,
        "_patch_lang": interpreter._patch_lang,
    }


def source_digests() -> dict[str, str]:
    """The sha256 of each function of :data:`READ_SOURCES` in the installed Triton."""
    return {
        name: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
        for name, function in _read_functions().items()
    }


def is_streamlined() -> bool:
    """Whether this process's interpreter runs streamlined."""
    return bool(_state["streamlined"])


def skipped_patches() -> int:
    """How many helper calls in this process found their launch's patch in force
    and skipped repeating it (0 when plain)."""
    return int(_state["skipped"])


def streamline_interpreter() -> bool:
    """Streamline Triton's interpreter in this process (see the module's
    docstring); returns whether it runs streamlined."""
    if _state["done"]:
        return is_streamlined()
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get(PLAIN_ENV) == "1":
        return False
    _state["done"] = True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    try:
        read = source_digests() == READ_SOURCES
    except (OSError, TypeError, AttributeError):
        read = False
    if not read or interpreter.interpreter_builder.options.debug:
        return False
    _skip_discarded_overflow_checks(interpreter)
    _patch_helpers_once_per_launch(interpreter)
    _state["streamlined"] = True
    return True


def _skip_discarded_overflow_checks(interpreter: Any) -> None:
    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _patch_helpers_once_per_launch(interpreter: Any) -> None:
    launch = [0]
    patched: dict[frozenset[int], int] = {}
    launch_kernel = interpreter.GridExecutor.__call__
    languages = (interpreter.tl, interpreter.tl.core)

    def counted_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        launch[0] += 1
        return launch_kernel(self, *args, **kwargs)

    def call_helper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # As Triton's InterpretedFunction.__call__, with _patch_lang made once per
        # launch for the language modules this helper's globals see.
        seen = frozenset(id(v) for v in self.fn.__globals__.values() if inspect.ismodule(v) and v in languages)
        if not seen or patched.get(seen) != launch[0]:
            interpreter._patch_lang(self.fn)
            patched[seen] = launch[0]
        else:
            _state["skipped"] += 1
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = counted_launch
    interpreter.InterpretedFunction.__call__ = call_helper
