"""A vLLM module edited in a copy: what a start sees when one pinned symbol's
source differs from the pin's, without touching the installed environment.

:func:`edited_module` copies the installed source file of the module holding a
symbol (``module:Qual.name``) into a folder, adds one statement at the top of
that symbol's body, imports the copy under the module's own name and puts it in
``sys.modules`` while the block runs: every import of the module in that time
(the fingerprint check's, the oracle's) gets the edited copy, whose functions'
source is read from the copied file. Only for a module whose import has no
side effect beyond its own namespace (the sparse backend's does not register
custom ops, as ``mla_attention``'s does). Plain Python, no pytest: the 0.27.1
environment, which has no pytest, imports it too (tests/test_legacy_oracle.py).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from oracle.environment import import_vllm_module, module_source_file, stood_in_modules

EDIT = "pass  # edited in a copy of the environment"


def _definition(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function or method ``qualname`` names in ``tree``."""
    definitions = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    body: list[ast.stmt] = tree.body
    found: ast.stmt | None = None
    for name in qualname.split("."):
        found = next((n for n in body if isinstance(n, definitions) and n.name == name), None)
        if found is None:
            raise LookupError(f"no definition of {qualname}")
        body = found.body
    if not isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
        raise LookupError(f"{qualname} is not a function")
    return found


@contextlib.contextmanager
def edited_module(symbol: str, folder: Path) -> Iterator[Path]:
    """While the block runs, ``symbol``'s module is a copy (written under
    ``folder``, its path yielded) whose ``symbol`` has one statement more."""
    module_name, _, qualname = symbol.partition(":")
    import_vllm_module(module_name)  # imported as installed first: its imports are then in place
    text = module_source_file(module_name).read_text(encoding="utf-8")
    first = _definition(ast.parse(text), qualname).body[0]
    lines = text.splitlines(keepends=True)
    lines.insert(first.lineno - 1, " " * first.col_offset + EDIT + "\n")
    copy = folder.joinpath(*module_name.split(".")).with_suffix(".py")
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("".join(lines), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(module_name, copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with stood_in_modules({module_name: module}):
        spec.loader.exec_module(module)
        yield copy
