"""Which items can reach a mutant's fault: the kill matrix's shortcut.

A mutant (:class:`~ports.mutants.base.Mutant`) is the fault-free base
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
lives, or ``None`` when that cannot be proven: from its class (a data attribute,
a swapped constant or kernel, a swap outside a module or class), or because it
may keep state (below). Such a mutant runs on every item.

The shortcut holds only for a mutant whose code does the same on every call
and keeps nothing from one item to the next: a *warm path* (``swaps()`` clean
on its first call, faulty later), a fault in ``swaps()``'s body (which runs on
every call, reaching items or not), or a fault written on one item and read on
a later one would show on items the reach pass skips. So :meth:`ReachProbe.sites`
proves it first (:class:`StateFinder`, erring on "cannot prove"): the port has
no attributes of its own; the code of its own classes, of the replacements its
``swaps()`` returns and of every function of the mutant's modules they reach
writes no global, no attribute and no enclosing function's variable and names
no builtin that reaches state by name (``setattr``, ``vars``...); every value
that code can reach by name (a global, a closure cell, a default, a function's
attribute) is immutable, a module, a class or such a function; and ``swaps()``,
called :data:`SWAPS_CALLS` times on a fresh instance of the port's class, returns
the same replacements each time (the same targets; functions of the same code
over the same values) and leaves that instance without attributes. A mutant that
fails any of these is *unproven* (:meth:`ReachProbe.examine` says why) and runs
on every item.

Invariants a reader must keep:

* A recorder calls the function it stands in for with the same arguments and
  returns its result: the base's answer under recording is its answer.
* The base keeps no state between calls that a fault site could have written
  (per_request's only cache, the compiled merge program, calls no site), so
  what one item reaches does not depend on the items before it.
* What a mutant's code changes through a call or a subscript (``out[:n] = ...``,
  ``.copy_()``) is its arguments or what the base hands it, never state of its
  own: the proof sees names, not the objects a call reaches.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import dis
import enum
import functools
import importlib
import inspect
import types
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ports.mutants.base import Mutant, swapped

# What a mutant class may set besides methods without changing what the base runs.
DESCRIPTIVE_ATTRIBUTES = frozenset({"name", "description", "source", "aimed_at", "conditions", "shows_at"})
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
        "__slotnames__",  # copyreg's cache, set by the first copy or pickle of an instance
    }
)


# How many times the proof calls ``swaps()``: a warm path shows from the second call.
SWAPS_CALLS = 3
# Opcodes that write state that outlives a call: a global, or an attribute (of a
# module, a class, the port, a function...).
STATE_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR"})
# Builtins that reach or write state by name, which no scan of names can follow.
STATE_BUILTINS = frozenset(
    {"setattr", "delattr", "exec", "eval", "compile", "globals", "vars", "locals", "__import__", "open"}
)
# Values that cannot change: what code may read by name, kept from call to call.
IMMUTABLE_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    range,
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    enum.Enum,
)


# The base's own machinery in the mutants' modules, not read through: it sets
# attributes, and restores every one on the way out.
BASE_MACHINERY = frozenset({id(swapped)})


class StateFinder:
    """Finds state a mutant keeps or code that writes some (the module's
    docstring): :meth:`why` gives the first found, or None. The mutant's own
    functions (those of the modules its own classes live in, and of
    ``ports.mutants``) are read through; any other function (the base's,
    torch's) is taken as stateless, as the base is."""

    def __init__(self, mutant: Any, own_modules: Iterable[str]) -> None:
        # The port itself (and the instance the proof calls swaps() on): its attributes are checked apart.
        self.mutant, self.port = mutant, mutant
        self.own_modules = frozenset(own_modules)
        self.seen: set[int] = set()

    def own(self, function: types.FunctionType) -> bool:
        if id(function) in BASE_MACHINERY or id(inspect.unwrap(function)) in BASE_MACHINERY:
            return False
        module = function.__module__ or ""
        return module in self.own_modules or module == "ports.mutants" or module.startswith("ports.mutants.")

    def why(self, value: Any, where: str) -> str | None:
        """Why ``value``, reachable from the mutant's code (``where``), is state; None: it is not."""
        if isinstance(value, (*IMMUTABLE_TYPES, type, types.ModuleType)) or value is self.mutant or value is self.port:
            return None
        if isinstance(value, tuple | frozenset):
            return next((r for r in (self.why(v, where) for v in value) if r), None)
        if isinstance(value, types.FunctionType):
            return self.why_function(value) if self.own(value) else None
        if isinstance(value, staticmethod | classmethod):
            return self.why(value.__func__, where)
        if isinstance(value, types.MethodType):
            return self.why(value.__func__, where) or self.why(value.__self__, where)
        if isinstance(value, types.BuiltinFunctionType):  # a builtin method too: its object counts
            holder = value.__self__
            return None if holder is None or isinstance(holder, types.ModuleType) else self.why(holder, where)
        if isinstance(value, functools._lru_cache_wrapper):
            # A cache (functools.cache) of a function that keeps no state answers as that function does.
            return self.why(value.__wrapped__, where)
        if isinstance(value, functools.partial):
            return self.why((value.func, *value.args, *value.keywords.values()), where)
        params = getattr(value, "__dataclass_params__", None)  # a dataclass instance's (a class is above)
        if params is not None and params.frozen:
            return self.why(tuple(getattr(value, f.name) for f in dataclasses.fields(value)), where)
        return f"{where} holds a {type(value).__name__}, which can change from one call to the next"

    def why_function(self, function: types.FunctionType) -> str | None:
        """Why one of the mutant's own functions keeps or writes state; each is read once."""
        if id(function) in self.seen:
            return None
        self.seen.add(id(function))
        name = function.__qualname__
        values: list[tuple[str, Any]] = [(f"{name}'s attribute {k}", v) for k, v in vars(function).items()]
        values += [(f"{name}'s default", v) for v in function.__defaults__ or ()]
        values += [(f"{name}'s default {k}", v) for k, v in (function.__kwdefaults__ or {}).items()]
        for variable, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=True):
            with contextlib.suppress(ValueError):  # an empty cell holds nothing yet
                values.append((f"{name}'s enclosing variable {variable}", cell.cell_contents))
        for where, value in values:
            reason = self.why(value, where)
            if reason:
                return reason
        return self.why_code(function.__code__, function.__globals__, name)

    def why_code(self, code: types.CodeType, globals_: dict[str, Any], name: str) -> str | None:
        """Writes and names in ``code`` and the code of the functions it defines."""
        for instruction in dis.get_instructions(code):
            op, arg = instruction.opname, instruction.argval
            if op in STATE_WRITES:
                return f"{name} writes {'a global' if 'GLOBAL' in op else 'an attribute'} ({arg})"
            if op in ("STORE_DEREF", "DELETE_DEREF") and arg in code.co_freevars:
                return f"{name} writes its enclosing function's variable {arg}"
            if op == "LOAD_GLOBAL":
                if arg in globals_:
                    reason = self.why(globals_[arg], f"{name}'s global {arg}")
                elif arg in STATE_BUILTINS:
                    reason = f"{name} calls {arg}, which reaches state by name"
                else:
                    reason = self.why(getattr(builtins, arg, None), f"the builtin {arg}")
                if reason:
                    return reason
        inner = (c for c in code.co_consts if isinstance(c, types.CodeType))
        return next((r for r in (self.why_code(c, globals_, f"{name}.{c.co_name}") for c in inner) if r), None)


def same_replacement(a: Any, b: Any) -> bool:
    """Whether two calls of ``swaps()`` put the same thing in place: the same
    object, equal immutable values, or functions of the same code over the same
    values (each call makes its closures afresh)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, float | complex):
        return repr(a) == repr(b)  # -0.0 is not 0.0, and NaN is NaN
    if isinstance(a, IMMUTABLE_TYPES):
        return bool(a == b)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same_replacement(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_replacement(a[k], b[k]) for k in a)
    if isinstance(a, functools.partial):
        return same_replacement((a.func, a.args, a.keywords), (b.func, b.args, b.keywords))
    if isinstance(a, types.MethodType):
        return a.__self__ is b.__self__ and same_replacement(a.__func__, b.__func__)
    if isinstance(a, types.FunctionType):
        cells = [tuple(_contents(c) for c in f.__closure__ or ()) for f in (a, b)]
        return (
            a.__code__ is b.__code__
            and a.__globals__ is b.__globals__
            and same_replacement(
                (a.__defaults__, a.__kwdefaults__, vars(a)), (b.__defaults__, b.__kwdefaults__, vars(b))
            )
            and same_replacement(cells[0], cells[1])
        )
    return False


_EMPTY = object()


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # not yet assigned
        return _EMPTY


def what_of(owner: Any) -> str:
    """A swapped attribute's owner as the matrix names it."""
    return str(getattr(owner, "__name__", type(owner).__name__))


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

    def sites(self, mutant: Any) -> frozenset[str] | None:
        """Where ``mutant``'s fault lives (``method:NAME`` and ``attr:...``), or
        None when that cannot be proven (:meth:`examine` says why): then every
        item must run it."""
        return self.examine(mutant)[0]

    @staticmethod
    def examine(mutant: Any) -> tuple[frozenset[str] | None, str | None]:
        """(the sites, None), or (None, why they cannot be proven)."""
        if not isinstance(mutant, Mutant):
            return None, "not a mutant of the catalogue (ports.mutants.Mutant)"
        state = getattr(mutant, "__dict__", None)
        if state is None or state:
            return None, f"the port holds attributes of its own ({', '.join(sorted(state or ('__slots__',)))})"
        # Every class the mutant's lookup order holds and the base's does not
        # (a mixin after Mutant included).
        own_classes = [c for c in type(mutant).__mro__ if c not in Mutant.__mro__]
        sites: set[str] = set()
        finder = StateFinder(mutant, {c.__module__ for c in own_classes})
        for cls in own_classes:
            for name, value in vars(cls).items():
                if name in CLASS_BOOKKEEPING or name in DESCRIPTIVE_ATTRIBUTES:
                    continue
                where = f"{cls.__qualname__}.{name}"
                if not isinstance(value, types.FunctionType):
                    return None, f"{where} is a {type(value).__name__}, not a method: the base may read it"
                if name.startswith("__") or not hasattr(Mutant, name):
                    # A special method is looked up on the type (no recorder on the
                    # instance sees it); a method the base lacks, the harness may
                    # look up by name (close, enforces_timeout...).
                    return None, f"{where} is a special method or one the base lacks: no recorder sees every use"
                if not isinstance(inspect.getattr_static(Mutant, name), types.FunctionType):
                    return None, f"{where} overrides what the base holds as a {type(value).__name__}: no call to record"
                reason = finder.why_function(value)
                if reason:
                    return None, f"keeps state: {reason}"
                if name != "swaps":
                    sites.add(f"method:{name}")
        # swaps() is called on a fresh instance (the port has no attributes, so it
        # is the same port): what it keeps in the port stays out of the one searched.
        port = finder.port = type(mutant).__new__(type(mutant))
        try:
            calls = [port.swaps() for _ in range(SWAPS_CALLS)]
        except Exception as exc:
            return None, f"swaps() raised {type(exc).__name__}"
        if vars(port):
            return None, f"swaps() gives the port attributes ({', '.join(sorted(vars(port)))})"
        if not all(isinstance(c, list) for c in calls) or not all(same_replacement(calls[0], c) for c in calls[1:]):
            return None, "swaps() returns other replacements from one call to the next (a warm path)"
        for owner, name, value in calls[0]:
            site = _swap_site(owner, name)
            if site is None:
                return None, f"swaps() replaces {what_of(owner)}.{name}, not a plain function of a module or a class"
            reason = finder.why(value, f"the replacement of {what_of(owner)}.{name}")
            if reason:
                return None, f"keeps state: {reason}"
            sites.add(site)
        if not sites:
            # A mutant whose fault lives nowhere the recorders see (its swaps() replace
            # nothing, no method is overridden) would run on no item: its fault is then
            # in code the pass cannot follow (a swaps() body, a call it makes), so unproven.
            return None, "no fault site: swaps() replaces nothing and no method is overridden"
        return frozenset(sites), None

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
