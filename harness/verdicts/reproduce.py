"""Item ids as every output prints them, and the ``parity diff`` command that
reproduces one item.

What :func:`resolve_item` accepts (``parity diff``'s CASE):

- an id as outputs print it (:func:`printed_id`), carrying what defines the
  item: ``SUITE/NAME[KIND]`` (``ci/skew-0031[prefill]``), with the generated
  sizes when the run set them (``nightly:size=200/skew-0031[layout]``,
  ``nightly:size=0:numeric-size=8/numeric-dcp-0003[prefill]``), or for a
  ``--cases`` run ``FILE.json:NAME[KIND]``; a workspace item's name may drop its
  ``workspace/`` prefix (the plugin's ``smoke/len2048-seqs1-blk16-dcp4x64[workspace]``);
- a results table's bare id ``NAME[KIND]`` (``skew-0031[prefill]``,
  ``workspace/len2048-seqs1-blk16-dcp4x64[workspace]``) or a bare name
  (``smoke-upstream-worst-case``), or the stem of a case
  file under ``cases/`` (``upstream-worst-case``) when no two places define it differently;
- a path to an item file (:func:`harness.cases.files.load_item_file`): a case file, a
  shrunk case, or a layout, prefill, merge or workspace find of ``parity explore``.

``KIND`` (layout, workspace, merge, prefill, and the sparse kinds) selects the
level when ``--level`` does not. A workspace item's name is its whole
configuration, so it resolves without loading any suite. A name is looked up
in the suite the id or ``--suite`` names, else in every suite and the case file
stems: a bare name that names different items in two places (a generated
``skew-0031`` of ci and of nightly) is refused, never resolved to one of them.

:func:`reproduce_command` is the inverse: the command, runnable as printed,
that compares one item of a run again, with the ``--port`` spelling the run was
given (a built-in name, ``mutant:NAME``, ``cmd:COMMAND``, ``package.module:attr``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cases.fields import CaseError
from harness.cases.files import load_case_file, load_item_file, load_run_file, load_run_files
from harness.model import Case, MergeCase, WorkspaceConfig
from harness.model.levels import KINDS, Kind, kinds_of
from harness.model.names import did_you_mean
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S
from harness.verdicts.launch import program_words, shell_join
from oracle.pin import load_pin

ITEM_KINDS = KINDS
# The suite name of a run over ``--cases`` files (harness.engine.select_suite).
CASES_SUITE = "cases"
# Where a bare name is looked up when neither the id nor --suite names a suite: every
# suite, so a name two suites give different items is refused, never resolved to one.
DEFAULT_SUITES = ("smoke", "ci", "nightly", "gpu")

_KIND_SUFFIX = re.compile(r"^(?P<name>.+)\[(?P<kind>[^\[\]]*)\]$")
_WORKSPACE_NAME = re.compile(
    r"^(?:workspace/)?len(?P<len>\d+)-seqs(?P<seqs>\d+)-blk(?P<blk>\d+)-dcp(?P<dcp>\d+)x(?P<il>\d+)$"
)

Item = Case | MergeCase | WorkspaceConfig | SparseCase | SparseWorkspaceConfig | TopkMaskCase


def level_of(kind: str) -> str:
    """The parity level an item kind belongs to (workspace items are layout's,
    sparse-workspace items sparse-layout's)."""
    from harness.sides.items import level_of as runner_level_of

    return runner_level_of(kind)


@dataclass(frozen=True)
class ResolvedItem:
    """What an id names. ``kind`` is the item's own (a case is ``layout``, its
    prefill item included when it has a numeric section); ``wanted`` is the
    ``[KIND]`` the id carried, None when it carried none."""

    kind: str
    item: Item
    source: str
    wanted: str | None = None
    suite: str | None = None


def split_kind(text: str) -> tuple[str, str | None]:
    """``NAME[KIND]`` into ``(NAME, KIND)``; text without a suffix is ``(text, None)``."""
    match = _KIND_SUFFIX.match(text)
    if match is None:
        return text, None
    kind = match["kind"]
    if kind not in ITEM_KINDS:
        raise CaseError(text, None, f"unknown item kind [{kind}] (known: {', '.join(ITEM_KINDS)})")
    return match["name"], kind


def workspace_config_named(name: str) -> WorkspaceConfig | None:
    """The configuration a workspace item's name spells
    (``[workspace/]lenL-seqsS-blkB-dcpDxI``), or None if ``name`` is not one."""
    match = _WORKSPACE_NAME.match(name)
    if match is None:
        return None
    values = [int(match[g]) for g in ("len", "seqs", "blk", "dcp", "il")]
    config = WorkspaceConfig(*values)
    # Only the spelling the harness prints (no leading zeros) names a configuration.
    if config.name != "workspace/" + name.removeprefix("workspace/"):
        return None
    if min(values) < 1:
        raise CaseError(name, None, "every field of a workspace configuration must be >= 1")
    return config


_SPARSE_WORKSPACE_NAME = re.compile(
    r"^sparse-workspace/len(?P<len>\d+)-seqs(?P<seqs>\d+)-blk(?P<blk>\d+)-topk(?P<topk>\d+)-dcp(?P<dcp>\d+)x(?P<il>\d+)$"
)


def sparse_workspace_config_named(name: str) -> SparseWorkspaceConfig | None:
    """The configuration a sparse workspace item's name spells, or None."""
    match = _SPARSE_WORKSPACE_NAME.match(name)
    if match is None:
        return None
    values = [int(match[g]) for g in ("len", "seqs", "blk", "topk", "dcp", "il")]
    config = SparseWorkspaceConfig(*values)
    if config.name != name:
        return None
    from harness.cases.sparse_inputs import sparse_workspace_config_from_json

    # The item file's limits hold for a configuration named by its id too.
    return sparse_workspace_config_from_json(config.to_json(), name)


def _known_suites() -> list[str]:
    from harness.cases.suites import suite_names

    return suite_names()


def resolve_item(
    spec: str,
    suite: str | None = None,
    size: int | None = None,
    case_paths: Sequence[str] | None = None,
    numeric_size: int | None = None,
) -> ResolvedItem:
    """The item ``spec`` names (see the module docstring). ``suite`` is
    ``--suite``, ``size`` its ``--size``, ``numeric_size`` its ``--numeric-size``; ``case_paths`` (``--cases``) replace
    the suites as where names are looked up. Raises :class:`CaseError` (one
    line, exit 2) for anything it cannot name exactly one item of."""
    path = Path(spec)
    if path.is_file():
        return _from_file(path, None)
    name, wanted = split_kind(spec)
    if wanted is not None and Path(name).is_file():
        return _from_file(Path(name), wanted)
    if name.endswith(".json"):
        raise CaseError(name, None, "no such file")
    file_part, sep, case_name = name.rpartition(".json:")
    if sep:
        # FILE.json:NAME, as a --cases run prints its ids.
        if case_paths:
            raise CaseError(spec, None, "names its case file; leave --cases out")
        file = f"{file_part}.json"
        if not Path(file).is_file():
            raise CaseError(file, None, "no such file")
        return resolve_item(f"{case_name}[{wanted}]" if wanted else case_name, None, None, [file])
    id_suite, id_sizes, name = _split_suite(name, spec)
    if id_suite and suite and id_suite != suite:
        raise CaseError(spec, None, f"names suite {id_suite} but --suite is {suite}")
    for option, given, in_id in zip(("--size", "--numeric-size"), (size, numeric_size), id_sizes, strict=True):
        if in_id is not None and given is not None and in_id != given:
            raise CaseError(spec, None, f"names {option.removeprefix('--')} {in_id} but {option} is {given}")
    suite = suite or id_suite
    sizes = (size if size is not None else id_sizes[0], numeric_size if numeric_size is not None else id_sizes[1])
    # A configuration is named by its fields: its name is the item.
    # A kind named only so (no file or suite holds it by another name) says its form when asked for.
    named = (
        (Kind.SPARSE_WORKSPACE, sparse_workspace_config_named, None),
        (Kind.WORKSPACE, workspace_config_named, "workspace/lenL-seqsS-blkB-dcpDxI"),
    )
    for config_kind, parse, form in named:
        config = parse(name) if wanted in (None, config_kind) else None
        if config is not None:
            return ResolvedItem(config_kind, config, "its name", wanted, suite)
        if form is not None and wanted == config_kind:
            raise CaseError(spec, None, f"is not a {config_kind} item name ({form})")
    matches: list[ResolvedItem] = []
    for where, lookup in _lookups(suite, sizes, case_paths):
        found = lookup(name, wanted)
        if found is not None:
            kind, item = found
            found_in = where.removeprefix("suite ") if where.startswith("suite ") else None
            if not any(m.item == item for m in matches):
                matches.append(ResolvedItem(kind, item, where, wanted, found_in))
    if len(matches) > 1:
        # A bare name two places give different items (generated merge cases of smoke and ci
        # share names): diffing the first would silently compare another item than the run did.
        places = " and ".join(m.source for m in matches)
        raise CaseError(spec, None, f"names different items in {places}: say which (SUITE/NAME, --suite or --cases)")
    if matches:
        return matches[0]
    places = (
        f"--cases {' '.join(case_paths)}"
        if case_paths
        else f"suite {suite}"
        if suite
        else f"suite {' or '.join(DEFAULT_SUITES)}"
    )
    near = did_you_mean(name, _names_in(suite, sizes, case_paths))
    raise CaseError(name, None, f"no such case file, and no item or case file stem of that name in {places}{near}")


# A suite's ``--size`` and ``--numeric-size`` (None: the suite's own).
Sizes = tuple[int | None, int | None]


def _names_in(suite: str | None, sizes: Sizes, case_paths: Sequence[str] | None) -> list[str]:
    """Every item name where :func:`_lookups` looked (for a near miss)."""
    if case_paths:
        held = load_run_files([Path(p) for p in case_paths])
        return [item.name for item in held.items()]
    names: list[str] = []
    for name in [suite] if suite else list(DEFAULT_SUITES):
        cases, merge_cases, sparse = _suite_items(name, sizes)
        names += [item.name for item in (*cases, *merge_cases, *sparse)]
    return names


_SIZED_SUITE = re.compile(r"^(?P<suite>[^/:]+)(?::size=(?P<size>\d+))?(?::numeric-size=(?P<numeric>\d+))?$")


def _split_suite(name: str, spec: str) -> tuple[str | None, Sizes, str]:
    """``SUITE/NAME``, ``SUITE:size=N/NAME`` or ``SUITE:size=N:numeric-size=M/NAME``
    into (suite, (size, numeric size), name); a name without a known suite in
    front is (None, (None, None), name)."""
    head, sep, rest = name.partition("/")
    if not sep:
        return None, (None, None), name
    matched = _SIZED_SUITE.match(head)
    if matched is None:
        return None, (None, None), name
    suite, size, numeric = matched["suite"], matched["size"], matched["numeric"]
    sized = size is not None or numeric is not None
    if suite not in _known_suites():
        if sized:
            raise CaseError(spec, None, f"names no suite {suite!r} (known: {', '.join(_known_suites())})")
        return None, (None, None), name
    if not rest:
        raise CaseError(spec, None, f"names suite {suite} but no item in it")
    return suite, (None if size is None else int(size), None if numeric is None else int(numeric)), rest


def printed_id(
    item_id: str,
    suite: str | None,
    size: int | None = None,
    case_paths: Sequence[str] | None = None,
    numeric_size: int | None = None,
) -> str:
    """An item id as outputs print it, carrying what defines the item: its
    suite and the sizes it was generated at (``ci/skew-0031[layout]``,
    ``nightly:size=200/skew-0031[layout]``), or for a ``--cases`` run its case
    file (``cases/x.json:NAME[layout]``). :func:`resolve_item` reads each back
    to the same item. A workspace item's name keeps its ``workspace/`` prefix."""
    if suite == CASES_SUITE or (suite is None and case_paths):
        name, _ = split_kind(item_id)
        holder = case_file_holding(name, case_paths or ())
        return f"{holder[0]}:{item_id}" if holder else item_id
    if suite is None:
        return item_id
    sized = "" if size is None else f":size={size}"
    sized += "" if numeric_size is None else f":numeric-size={numeric_size}"
    return f"{suite}{sized}/{item_id}"


def _from_file(path: Path, wanted: str | None) -> ResolvedItem:
    kind, loaded = load_item_file(path)
    if isinstance(loaded, list):
        if len(loaded) != 1:
            raise CaseError(
                str(path),
                None,
                f"holds {len(loaded)} cases; diff takes one (name it: parity diff NAME --cases {path})",
            )
        return ResolvedItem(kind, loaded[0], str(path), wanted)
    return ResolvedItem(kind, loaded, str(path), wanted)


Lookup = Callable[[str, str | None], tuple[str, Item] | None]


def _lookups(suite: str | None, sizes: Sizes, case_paths: Sequence[str] | None) -> Iterator[tuple[str, Lookup]]:
    """Where a name is looked up, in order; each place is loaded only when reached
    (a bare name is looked up in every default place, to refuse an ambiguous one)."""
    if case_paths:
        held = load_run_files([Path(p) for p in case_paths])
        yield f"--cases {' '.join(case_paths)}", _in_cases(list(held.cases), [], [*held.sparse_cases, *held.mask_cases])
        return
    suites = [suite] if suite else list(DEFAULT_SUITES)
    yield f"suite {suites[0]}", _in_suite(suites[0], sizes)
    yield "the case files under cases/", _by_stem
    for other in suites[1:]:
        yield f"suite {other}", _in_suite(other, sizes)


@functools.lru_cache(maxsize=4)
def _suite_items(name: str, sizes: Sizes) -> tuple[list[Case], list[MergeCase], list[Any]]:
    """A suite's cases, merge cases and sparse items, loaded once per process
    (suites are deterministic; resolving many ids must not regenerate one per id)."""
    from harness.cases.suites import load_suite

    loaded = load_suite(name, size=sizes[0], numeric_size=sizes[1])
    sparse = [*loaded.sparse_cases, *loaded.mask_cases]
    return list(loaded.cases), list(loaded.merge_cases), sparse


def _in_suite(name: str, sizes: Sizes) -> Lookup:
    def lookup(item_name: str, wanted: str | None) -> tuple[str, Item] | None:
        return _in_cases(*_suite_items(name, sizes))(item_name, wanted)

    return lookup


def _in_cases(cases: list[Case], merge_cases: list[MergeCase], sparse: Sequence[Any] = ()) -> Lookup:
    def lookup(item_name: str, wanted: str | None) -> tuple[str, Item] | None:
        # The kind the id asked for decides a tie (a case and a merge case may
        # share a name); else the first item of that name, as its first kind.
        # A mismatch is reported by the caller.
        found = [item for item in (*sparse, *cases, *merge_cases) if item.name == item_name]
        held = [(kind, item) for item in found for kind in kinds_of(item)]
        return next((pair for pair in held if pair[0] == wanted), held[0] if held else None)

    return lookup


def _by_stem(stem: str, wanted: str | None) -> tuple[str, Item] | None:
    """A case file under ``cases/`` whose stem is ``stem`` (a relative path
    without ``.json``, such as ``smoke/upstream-worst-case``, works too)."""
    from harness.cases.suites import CASES_DIR

    if not stem or stem.startswith(("/", ".")):
        return None
    matches = sorted(p for p in CASES_DIR.rglob(f"{Path(stem).name}.json") if p.as_posix().endswith(f"/{stem}.json"))
    if not matches:
        return None
    if len(matches) > 1:
        raise CaseError(stem, None, f"is the stem of {len(matches)} case files ({', '.join(map(str, matches))})")
    cases = load_case_file(matches[0])
    if len(cases) != 1:
        raise CaseError(str(matches[0]), None, f"holds {len(cases)} cases; name one of them")
    return "layout", cases[0]


# -- the command that reproduces an item ---------------------------------------------------


def case_file_holding(name: str, case_paths: Sequence[str]) -> tuple[str, int] | None:
    """The case file among ``case_paths`` (files and folders, as ``--cases``
    takes them) that defines item ``name`` (a case or a sparse item), and how
    many items it holds."""
    return _case_file_index(tuple(case_paths)).get(name)


@functools.lru_cache(maxsize=8)
def _case_file_index(case_paths: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """Each item name of ``case_paths`` to its file (the first that defines it) and
    the file's item count, read once per process: a table prints an id per row."""
    index: dict[str, tuple[str, int]] = {}
    for given in case_paths:
        path = Path(given)
        files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
        for file in files:
            try:
                items = load_run_file(file).items()
            except CaseError:
                continue
            for item in items:
                index.setdefault(item.name, (str(file), len(items)))
    return index


def reproduce_command(
    name: str,
    kind: str,
    suite: str | None,
    port_spec: str,
    device: str = "cpu",
    *,
    size: int | None = None,
    numeric_size: int | None = None,
    case_paths: Sequence[str] | None = None,
    allow_oracle_drift: bool = False,
    timeout_s: float | None = None,
    program: Sequence[str] | None = None,
    oracle: str | None = None,
) -> str:
    """The ``parity diff`` command, quoted for a POSIX shell, that compares
    item ``name`` (a bare name or its id ``NAME[KIND]``) of kind ``kind`` again
    as the run did: ``port_spec`` exactly as ``--port`` was given, ``suite`` the
    run's suite (:data:`CASES_SUITE` for a ``--cases`` run, whose
    ``case_paths`` locate the case's file), its ``--size`` and ``--numeric-size``, ``device`` and
    drift override, its ``--timeout`` when it was not the default (a port
    that needed longer, or was stopped sooner, is diffed with the same limit),
    and its ``--oracle`` (``vllm==X``) when that is not the pin.
    ``program`` defaults to :func:`program_words` for ``port_spec`` (a run that
    is rendered later records it when it runs: its ``launch`` meta)."""
    bare = name.removesuffix(f"[{kind}]")
    argv = [*(program or program_words(port_spec)), "diff"]
    if suite == CASES_SUITE or (suite is None and case_paths):
        holder = case_file_holding(bare, case_paths or ())
        if holder is not None and holder[1] == 1:
            argv.append(holder[0])
        elif holder is not None:
            argv += [bare, "--cases", holder[0]]
        elif case_paths:
            argv += [bare, "--cases", *case_paths]
        else:
            # The run's case files are not known: diff looks the name up in every suite.
            argv.append(bare)
    else:
        argv.append(bare)
        if suite:
            argv += ["--suite", suite]
        if size is not None:
            argv += ["--size", str(size)]
        if numeric_size is not None:
            argv += ["--numeric-size", str(numeric_size)]
    argv += ["--port", port_spec, "--level", level_of(kind)]
    if device != "cpu":
        argv += ["--device", device]
    if timeout_s is not None and timeout_s != DEFAULT_PORT_TIMEOUT_S:
        argv += ["--timeout", f"{timeout_s:g}"]
    if oracle is not None and oracle != load_pin()["release"]:
        argv += ["--oracle", oracle]
    if allow_oracle_drift:
        argv.append("--allow-oracle-drift")
    return shell_join(argv)


def reproduce_from_meta(name: str, kind: str, meta: dict[str, Any]) -> str:
    """:func:`reproduce_command` for an item of a run whose outputs (a gate's
    ``gate.json``, a night's port result) recorded how it ran: its suite,
    ``--port`` spelling, device, size, case files, timeout, oracle, drift
    override, and ``launch`` (:func:`program_words` as the run saw them)."""
    return reproduce_command(
        name,
        kind,
        meta.get("suite"),
        meta.get("port_spec") or meta["port"],
        meta.get("device") or "cpu",
        size=meta.get("size"),
        numeric_size=meta.get("numeric_size"),
        case_paths=meta.get("cases"),
        allow_oracle_drift=bool(meta.get("oracle_drift_overridden")),
        timeout_s=meta.get("timeout"),
        oracle=oracle_of_pin(meta.get("pin")),
        program=meta.get("launch"),
    )


def oracle_of_pin(pin: str | None) -> str | None:
    """The release of a run's ``pin`` identity (``vllm==X @ COMMIT``)."""
    return pin.split(" @ ", 1)[0] if pin else None
