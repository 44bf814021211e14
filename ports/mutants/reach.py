"""Which items can reach a mutant's fault: the kill matrix's shortcut.

A mutant (:class:`~ports.mutants.catalogue.Mutant`) is the fault-free base
class plus one fault, which lives in one of two places: a function its
``swaps()`` replaces for the duration of a call (a module's or a class's), or a
method its class overrides (``rewrite_chunk``, ``workspace_size``,
``plan_layout``...). Those are its *fault sites*. On an item whose run of the
fault-free base never calls any of its sites, the mutant runs exactly the base's
code on exactly the same inputs, so it gives exactly the base's answer: when the
base is at parity on that item, the mutant is too, and running it cannot kill
it. Mutation-testing tools call this coverage-based test selection.

:class:`ReachProbe` runs the base with a recorder on every site of interest
and says which it reached; :meth:`ReachProbe.sites` says where a mutant's fault
lives, or ``None`` when that cannot be told from its class (a data attribute,
a swapped constant or kernel, a swap outside a module or class): such a mutant
runs on every item.

Invariants a reader must keep:

* A recorder calls the function it stands in for with the same arguments and
  returns its result: the base's answer under recording is its answer.
* The base keeps no state between calls that a fault site could have written
  (per_request's only cache, the compiled merge program, calls no site), so
  what one item reaches does not depend on the items before it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import types
from collections.abc import Iterable, Iterator
from typing import Any

from ports.mutants.catalogue import Mutant

# What a mutant class may set besides methods without changing what the base runs.
DESCRIPTIVE_ATTRIBUTES = frozenset({"name", "description", "source", "aimed_at"})
# What Python itself puts in a class's namespace; any other dunder (__getattr__,
# __call__...) is a method like the rest: a site, or unknown.
CLASS_BOOKKEEPING = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__firstlineno__",
        "__static_attributes__",
        "__orig_bases__",
        "__parameters__",
    }
)


def _swap_site(owner: Any, name: str) -> str | None:
    """``attr:MODULE:OWNER.NAME`` of a swapped function (OWNER empty for a
    module's own), or None when the swapped value is not a plain function of a
    module or a class (a constant is read, not called: a recorder cannot see it)."""
    if isinstance(owner, types.ModuleType):
        original = getattr(owner, name, None)
        module, qualified = owner.__name__, name
    elif isinstance(owner, type):
        original = vars(owner).get(name)
        module, qualified = owner.__module__, f"{owner.__qualname__}.{name}"
    else:
        return None
    if not isinstance(original, types.FunctionType) or "<locals>" in qualified:
        return None
    return f"attr:{module}:{qualified}"


def _resolve(site: str) -> tuple[Any, str]:
    """The (owner, attribute) an ``attr:`` site names."""
    _, module, qualified = site.split(":", 2)
    owner: Any = importlib.import_module(module)
    *path, name = qualified.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


class ReachProbe:
    """The fault-free base (``reference``) and the fault sites it reaches."""

    def __init__(self) -> None:
        self.reference = Mutant()

    @staticmethod
    def sites(mutant: Any) -> frozenset[str] | None:
        """Where ``mutant``'s fault lives (``method:NAME`` and ``attr:...``), or
        None when that cannot be told: then every item must run it."""
        if not isinstance(mutant, Mutant) or vars(mutant):
            return None  # not of the catalogue, or state of its own
        sites: set[str] = set()
        # Every class the mutant's lookup order holds and the base's does not
        # (a mixin after Mutant included).
        for cls in (c for c in type(mutant).__mro__ if c not in Mutant.__mro__):
            for name, value in vars(cls).items():
                if name in CLASS_BOOKKEEPING or name in DESCRIPTIVE_ATTRIBUTES:
                    continue
                if not isinstance(value, types.FunctionType):
                    return None  # a property, a class-level constant...: the base may read it
                if name.startswith("__") or not hasattr(Mutant, name):
                    # A special method is looked up on the type (no recorder on the
                    # instance sees it); a method the base lacks, the harness may
                    # look up by name (close, enforces_timeout...).
                    return None
                if not isinstance(inspect.getattr_static(Mutant, name), types.FunctionType):
                    return None  # the base's NAME is a property, a constant...: no call to record
                if name != "swaps":
                    sites.add(f"method:{name}")
        for owner, name, _ in mutant.swaps():
            site = _swap_site(owner, name)
            if site is None:
                return None
            sites.add(site)
        return frozenset(sites)

    @contextlib.contextmanager
    def recording(self, sites: Iterable[str]) -> Iterator[set[str]]:
        """While open, each of ``sites`` the reference calls is added to the set
        yielded; everything is restored on the way out, whatever happens."""
        reached: set[str] = set()
        installed: list[tuple[Any, str, Any, bool]] = []

        def recorder(site: str, original: Any) -> Any:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                reached.add(site)
                return original(*args, **kwargs)

            return recorded

        try:
            for site in sorted(sites):
                kind, _, name = site.partition(":")
                if kind == "method":
                    original = getattr(self.reference, name, None)
                    if not callable(original):
                        # sites() names only the base's plain methods: an uncallable one
                        # would never be recorded, and the mutant skipped everywhere.
                        raise ValueError(f"{site}: the base's {name} is not a method, so no call to it can be recorded")
                    # An instance attribute: what self.NAME finds first.
                    installed.append((self.reference, name, None, False))
                    setattr(self.reference, name, recorder(site, original))
                    continue
                owner, attribute = _resolve(site)
                had = attribute in vars(owner)
                original_value = vars(owner).get(attribute) if isinstance(owner, type) else getattr(owner, attribute)
                installed.append((owner, attribute, original_value, had))
                setattr(owner, attribute, recorder(site, original_value))
            yield reached
        finally:
            for owner, attribute, original_value, had in reversed(installed):
                if owner is self.reference:
                    delattr(owner, attribute)
                elif had:
                    setattr(owner, attribute, original_value)
                else:
                    delattr(owner, attribute)


def fault_probe() -> ReachProbe:
    """The catalogue's probe (a module-level factory: a worker process gets it by name)."""
    return ReachProbe()
