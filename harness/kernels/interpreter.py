"""Triton's interpreter without the work whose result it throws away.

On CPU tensors every Triton kernel, the oracle's (vLLM's merge and top-k mask
kernels) and the ports' alike, runs in Triton's interpreter
(``TRITON_INTERPRET=1``): one Python call per operation per program. Two parts
of that work never reach a value, and on the ci suite they were a third of the
oracle's time (cold ``parity run --suite ci --jobs 1``: 170 s plain, 111.5 s
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

One change is not an optimisation and is made plain or streamlined: the
interpreter's float32 ``tl.exp`` and ``tl.log`` are
:mod:`harness.kernels.interpreted_math`'s, the same bits on every machine,
where numpy's change with the CPU.

Invariants a reader must keep:

- Streamlined, the interpreter computes every value it computed before, bit for
  bit (tests/test_interpreter.py runs the oracle's kernels both ways): nothing
  here changes an operation, an operand or an order; it removes a computation
  whose result is discarded and a repeat of a patch already applied.
- Only the interpreter whose source was read is streamlined: the three Triton
  modules whose code it changes or relies on are fingerprinted whole
  (:data:`READ_SOURCES`); any other Triton, or ``debug`` on, is left as it is
  (slower, never different).
- ``PARITY_PLAIN_TRITON_INTERPRETER=1`` leaves the interpreter unstreamlined
  (its exp and log defined all the same), for whoever wants to see the figures
  or the bits without the streamlining; with ``--no-oracle-cache``, since the
  cache does not tell the two apart (they are the same bits).
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
from pathlib import Path
from typing import Any

from harness.kernels.interpreted_math import define_interpreter_math

# sha256 of each Triton module whose code this module replaces or relies on (the
# interpreter, the language's semantics and its core: the patch, the builtins it
# wraps, the overflow check and device_assert), whole, as read in Triton 3.9.0.
READ_SOURCES = {
    "triton/runtime/interpreter.py": "5af8debc8c2a858e19e303725d4deb778e796e5bc1b27387b7fa758a96a8e731",
    "triton/language/semantic.py": "8d7592ed77ab6dd494a07c9a34621036dd5a16a0f61904ed5f10ee9598cae1c8",
    "triton/language/core.py": "4f698c8b3bc25f6700558bf4be5324164f6a183357a881acd50308570ce190f6",
}

PLAIN_ENV = "PARITY_PLAIN_TRITON_INTERPRETER"

_state: dict[str, Any] = {"done": False, "streamlined": False, "skipped": 0, "math": False}


def source_digests() -> dict[str, str]:
    """The sha256 of each file of :data:`READ_SOURCES` in the installed Triton."""
    from triton.language import core, semantic
    from triton.runtime import interpreter

    modules = {
        "triton/runtime/interpreter.py": interpreter,
        "triton/language/semantic.py": semantic,
        "triton/language/core.py": core,
    }
    return {
        name: hashlib.sha256(Path(inspect.getfile(module)).read_bytes()).hexdigest() for name, module in modules.items()
    }


def math_defined() -> bool:
    """Whether this process's interpreter takes float32 exp and log from
    :mod:`harness.kernels.interpreted_math` (the same bits on every machine)."""
    return bool(_state["math"])


def is_streamlined() -> bool:
    """Whether this process's interpreter runs streamlined."""
    return bool(_state["streamlined"])


def skipped_patches() -> int:
    """How many helper calls in this process found their launch's patch in force
    and skipped repeating it (0 when plain)."""
    return int(_state["skipped"])


def streamline_interpreter() -> bool:
    """Streamline Triton's interpreter in this process (see the module's
    docstring); returns whether it runs streamlined. First, plain or not, its
    float32 exp and log become :mod:`harness.kernels.interpreted_math`'s."""
    if _state["done"]:
        return is_streamlined()
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    _state["done"] = True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    # Not an optimisation: the definition of the values, plain or streamlined.
    _state["math"] = define_interpreter_math(interpreter)
    if os.environ.get(PLAIN_ENV) == "1":
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
        # A new count at the start and at the end: the launch undoes its patch as
        # it ends, so a helper called after it (from host code) patches again.
        launch[0] += 1
        try:
            return launch_kernel(self, *args, **kwargs)
        finally:
            launch[0] += 1

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
