"""The oracle cache's sparse answers (issue 44, item 5): kept on disk under the
dense answers' keys and invalidation, read back as strictly, bit for bit.

A second run of the sparse levels asks the pinned oracle nothing; another pin,
another harness source, another sparse backend source, another release or
fingerprint status is another key, and kernels patched at run time keep the
sparse prefill out of the cache; a damaged or mistyped entry of any sparse kind
is a miss and is rewritten, never a wrong answer. The sparse levels' rows
through the cache, and the pinned oracle's sparse answers round-tripped:
tests/test_oracle_cache.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cases.sparse_inputs import materialise_topk
from harness.cases.suites import Suite, load_suite
from harness.compare.sparse import check_sparse_layout
from harness.kernels import kernels_for, with_keyless_rows
from harness.kernels.sparse_prefill import materialise_sparse_prefill
from harness.model import Case, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase
from harness.protocol.port import Port
from harness.sides.oracle_cache import CachedOracle, with_oracle_cache
from harness.sides.oracle_cache_keys import CACHE_FORMAT
from harness.sides.oracle_cache_store import LAST_USED, sealed, unsealed
from harness.sides.runner import run_items

SPARSE_KINDS = ("sparse-layout", "sparse-workspace", "sparse-mask", "sparse-remap", "sparse-prefill")
SOURCES = "a" * 64
# The pinned oracle's provenance as a run opens it, every symbol at its pin.
PROVENANCE: dict[str, Any] = {
    "release": "vllm==0.28.0",
    "upstream_commit": "b38e111d3e",
    "upstream_pr": 50613,
    "installed_vllm": "0.28.0",
    "installed_commit_id": "g2cf0a6915",
    "fingerprints": {"plan_mla_context_chunks": "ok", "merge_attn_states": "ok"},
    "oracle_drift_overridden": False,
}


@cache
def smoke() -> Suite:
    return load_suite("smoke")


def l3_case(index: int = 0) -> SparseCase:
    """The smoke suite's sparse L3 batches aimed at the masked route with the global mask, smallest first."""
    chosen = [c for c in smoke().sparse_cases if c.numeric is not None and c.family == "sparse-masked-global"]
    return sorted(chosen, key=lambda c: (sum(c.context_lens) + sum(c.query_lens), c.name))[index]


def mask_case(index: int = 0) -> TopkMaskCase:
    """The smoke suite's smallest mask case of the global form over several
    requests (0), and of the single form (1)."""
    by_size = sorted(smoke().mask_cases, key=lambda m: (sum(m.query_lens) * m.index_topk, m.name))
    if index == 0:
        return next(m for m in by_size if m.form == "global" and m.num_requests > 1)
    return next(m for m in by_size if m.form == "single")


def bits_of(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``values`` as the bit patterns of ``dtype`` (32- or 16-bit)."""
    wide = torch.tensor(values, dtype=torch.int64)
    if dtype.itemsize == 4:
        return wide.to(torch.int32).view(dtype)
    return wide.to(torch.int16).view(dtype)


# NaN payloads (quiet and signalling, either sign), -0.0, +-inf, a denormal, a
# word with only its sign bit, the largest finite value.
SPECIAL_32 = [0x7FC00001, -0x003FFFFF, 0x7F800001, -0x80000000, 0x7F800000, -0x00800000, 0x1, 0x7F7FFFFF]
SPECIAL_16 = [0x7FC1, -0x8000, 0x7F80, -0x0080, 0x1, 0x7F81, -0x003F, 0x3F80]


class FakeSparseOracle:
    """A sparse oracle whose answers cost nothing and carry every special bit
    pattern; it names its sparse sources (as the pinned oracle does), counts its
    calls, and raises on the case names in ``fail``."""

    name = "fake-sparse"

    def __init__(self, sources: str = SOURCES, fail: tuple[str, ...] = ()) -> None:
        self.sources, self.fail, self.calls = sources, fail, 0

    def sparse_source_digest(self) -> str:
        return self.sources

    # A port's two questions (harness.protocol.port.Port); never asked here.
    def plan_layout(self, case: Case) -> Layout:
        raise NotImplementedError

    def workspace_size(self, config: WorkspaceConfig) -> int:
        raise NotImplementedError

    def _called(self, name: str) -> None:
        self.calls += 1
        if name in self.fail:
            raise AssertionError(f"refused {name}")

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        self._called(case.name)
        tokens = sum(case.query_lens)
        return SparseLayout(
            workspace_size=case.max_model_len,
            layout=Layout(chunks=(), empty_token_slices=((0, tokens),)),
            prefill_max_query_len=case.max_query_len,
            prefill_max_seq_len=case.max_seq_len,
            use_dense_mha=False,
            masked_threshold=True,
            masks_fit=None,
            use_masked_mha=True,
            route="masked-mha",
            global_mask_shape=None,
            global_mask_fits=None,
            suffix_mask_shape=(len(case.query_lens), 128, tokens),
            chunk_mask_shapes=((1, 256, 2), (2, 128, 3)),
        )

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        self._called(config.name)
        return config.max_model_len * config.index_topk

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        self._called(case.name)
        mask = torch.cat([t.reshape(-1) for t in topk])
        mask[: len(SPECIAL_32)] = torch.tensor(SPECIAL_32, dtype=torch.int64).to(torch.int32)
        return mask.reshape(1, -1)

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        self._called(case.name)
        # -1 where an index falls outside its range; one of them transposed.
        out = [torch.where(t >= start, t - start, -1) for t, start in zip(topk, case.range_starts, strict=True)]
        return [out[0].t(), *out[1:]]

    def sparse_prefill(self, case: SparseCase, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        self._called(case.name)
        g = torch.Generator().manual_seed(sum(case.context_lens) * 131 + case.index_topk)
        lse = torch.randint(-(2**31), 2**31, (4, 6), generator=g, dtype=torch.int64).to(torch.int32)
        lse.view(-1)[: len(SPECIAL_32)] = torch.tensor(SPECIAL_32, dtype=torch.int64).to(torch.int32)
        output = torch.randint(-(2**15), 2**15, (3, 2, 4), generator=g, dtype=torch.int64).to(torch.int16)
        output.view(-1)[: len(SPECIAL_16)] = torch.tensor(SPECIAL_16, dtype=torch.int64).to(torch.int16)
        # Names out of sorted order, a transposed LSE, two dtypes of one width.
        return {
            "output": output.view(torch.bfloat16),
            "lse": lse.view(torch.float32).t(),
            "context_output": output.flip(0).contiguous().view(torch.float16),
            "context_lse": bits_of(SPECIAL_32, torch.float32),
        }


Question = Callable[[Any], Any]


def questions(variant: int = 0) -> dict[str, Question]:
    """One question of each sparse kind, as the sparse runner asks them (fresh
    inputs on every call); ``variant`` picks other items."""
    case, mask = l3_case(variant), mask_case(variant)
    config = smoke().sparse_workspace_configs[variant]
    kernels = with_keyless_rows(kernels_for("cpu"), "neg-inf")
    return {
        "sparse-layout": lambda side: side.plan_sparse(case),
        "sparse-workspace": lambda side: side.sparse_workspace_size(config),
        "sparse-mask": lambda side: side.build_topk_mask(mask, materialise_topk(mask)),
        "sparse-remap": lambda side: side.remap_topk(mask, materialise_topk(mask)),
        "sparse-prefill": lambda side: side.sparse_prefill(case, materialise_sparse_prefill(case, "cpu"), kernels),
    }


def same_answer(fresh: Any, hit: Any) -> None:
    """The same sparse layout (and types), int, or tensors: names and order,
    dtype, shape, strides, device and every bit; new tensors, never the kept ones."""
    if isinstance(fresh, SparseLayout):
        assert type(hit) is SparseLayout and hit == fresh and hit.to_json() == fresh.to_json()
        assert check_sparse_layout(hit) is hit
        return
    if isinstance(fresh, int):
        assert type(hit) is int and hit == fresh
        return
    if isinstance(fresh, torch.Tensor):
        fresh, hit = [fresh], [hit]
    assert type(hit) is type(fresh)
    fresh_items = list(fresh.items()) if isinstance(fresh, dict) else list(enumerate(fresh))
    hit_items = list(hit.items()) if isinstance(hit, dict) else list(enumerate(hit))
    assert [n for n, _ in hit_items] == [n for n, _ in fresh_items]
    for (_, a), (_, b) in zip(fresh_items, hit_items, strict=True):
        assert type(b) is torch.Tensor and b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
        assert (b.dtype, b.shape, b.stride(), b.device) == (a.dtype, a.shape, a.stride(), a.device)
        as_bytes = [t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        assert torch.equal(*as_bytes)


def entries(folder: Path, kind: str) -> list[Path]:
    """``kind``'s entries under ``folder`` (no kind's name is another's followed by a dash)."""
    return sorted(p for p in folder.rglob(f"{kind}-*") if p.is_file())


# -- a second run asks the pinned oracle nothing -----------------------------------------------


class Counting:
    """The pinned oracle with every sparse question counted (its own class, so
    both runs below share one fingerprint)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.calls = inner, inner.name, 0

    def sparse_source_digest(self) -> str:
        return self.inner.sparse_source_digest()  # type: ignore[no-any-return]

    def _call(self, method: str, *args: Any) -> Any:
        self.calls += 1
        return getattr(self.inner, method)(*args)

    def plan_layout(self, case: Case) -> Layout:
        return self._call("plan_layout", case)  # type: ignore[no-any-return]

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self._call("workspace_size", config)  # type: ignore[no-any-return]

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        return self._call("plan_sparse", case)  # type: ignore[no-any-return]

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        return self._call("sparse_workspace_size", config)  # type: ignore[no-any-return]

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        return self._call("build_topk_mask", case, topk)  # type: ignore[no-any-return]

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._call("remap_topk", case, topk)  # type: ignore[no-any-return]

    def sparse_prefill(self, case: SparseCase, inputs: Any, kernels: Any) -> dict[str, torch.Tensor]:
        return self._call("sparse_prefill", case, inputs, kernels)  # type: ignore[no-any-return]


def test_a_second_run_of_the_sparse_levels_asks_the_oracle_nothing(oracle: Port, tmp_path: Path) -> None:
    """The pinned oracle's sparse answers, kept by one run, are the next run's:
    every row the same, every answer from disk, no question asked."""
    from harness.sides.loading import load_port

    full = smoke()
    suite = Suite(
        "sparse-second-run",
        (),
        (),
        sparse_cases=(l3_case(0), full.sparse_cases[0]),
        sparse_workspace_configs=full.sparse_workspace_configs[:2],
        mask_cases=(mask_case(0), mask_case(1)),
    )
    port = load_port("per_request")
    levels = ("sparse-layout", "sparse-mask", "sparse-prefill")
    counting = Counting(oracle)

    def run() -> tuple[CachedOracle, list[dict[str, Any]]]:
        cached = with_oracle_cache(counting, PROVENANCE, directory=tmp_path)
        assert isinstance(cached, CachedOracle) and cached.sparse_on_disk
        return cached, [r.to_json() for r in run_items(cached, port, suite, levels)]

    first, cold = run()
    asked = counting.calls
    # Every item compared (none not-run: the L3 batches take the masked route).
    assert asked > 0 and "not-run" not in {row["status"] for row in cold}
    assert {row["kind"] for row in cold} == {*levels, "sparse-workspace"}
    stored = first.stats()["stored"]
    assert first.stats()["bypassed"] == 0 and first.stats()["misses"] == stored == asked
    assert first.directory is not None
    assert all(entries(first.directory, kind) for kind in SPARSE_KINDS)

    second, warm = run()
    assert warm == cold and counting.calls == asked
    assert second.stats()["disk_hits"] == stored and second.stats()["misses"] == 0


# -- hits are the fresh answers, bit for bit ---------------------------------------------------


def test_sparse_hits_from_memory_and_disk_keep_every_bit(tmp_path: Path) -> None:
    fake = FakeSparseOracle()
    asked = questions()
    fresh = {kind: question(fake) for kind, question in asked.items()}
    assert fake.calls == len(SPARSE_KINDS)
    first = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    second = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    for cache_ in (first, first, second):  # misses, memory hits, disk hits
        for kind, question in asked.items():
            same_answer(fresh[kind], question(cache_))
    assert fake.calls == 2 * len(SPARSE_KINDS)
    assert first.stats()["memory_hits"] == second.stats()["disk_hits"] == len(SPARSE_KINDS)
    # Bits, not values: NaN payloads, -0.0 and the infinities of the LSE and the output.
    hit = asked["sparse-prefill"](second)
    assert torch.equal(hit["context_lse"].view(torch.int32), torch.tensor(SPECIAL_32, dtype=torch.int32))
    assert hit["lse"].stride() == (1, 6) and hit["lse"].isnan().any() and (hit["lse"] == float("-inf")).any()
    assert (hit["output"].view(torch.int16) == -0x8000).any()


# -- another key misses ------------------------------------------------------------------------


def _pin_edited(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.sides.oracle_cache_keys as keys

    pinned = keys._pin_of

    def edited(provenance: Any) -> Any:
        pin = pinned(provenance)
        return {**pin, "edited": True}

    monkeypatch.setattr(keys, "_pin_of", edited)


def _sources_edited(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.sides.oracle_cache_keys as keys

    monkeypatch.setattr(keys, "sources_digest", lambda: "e" * 64)


def _sparse_sources_edited(monkeypatch: pytest.MonkeyPatch, fake: FakeSparseOracle) -> None:
    monkeypatch.setattr(fake, "sources", "b" * 64)


# Each change of the key: what it patches, and the provenance the next run opens with.
CHANGES: dict[str, tuple[Callable[[pytest.MonkeyPatch, FakeSparseOracle], None] | None, dict[str, Any]]] = {
    "pin": (lambda mp, fake: _pin_edited(mp), PROVENANCE),
    "harness-sources": (lambda mp, fake: _sources_edited(mp), PROVENANCE),
    "sparse-sources": (_sparse_sources_edited, PROVENANCE),
    "installed-commit": (None, {**PROVENANCE, "installed_commit_id": "g0"}),
    "release": (None, {**PROVENANCE, "release": "vllm==0.27.1"}),
    "pinned-symbols": (None, {**PROVENANCE, "fingerprints": {**PROVENANCE["fingerprints"], "forward_mha": "ok"}}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_another_key_misses_every_sparse_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, change: str) -> None:
    """The dense answers' invalidation, for the sparse ones: another pin, another
    harness or oracle source, another sparse backend source, another release
    or fingerprint status; the same key again hits."""
    fake, asked = FakeSparseOracle(), questions()

    def ask_all(provenance: dict[str, Any]) -> CachedOracle:
        cached = with_oracle_cache(fake, provenance, directory=tmp_path)
        assert isinstance(cached, CachedOracle)
        for question in asked.values():
            question(cached)
        return cached

    ask_all(PROVENANCE)
    assert fake.calls == len(SPARSE_KINDS)
    patch, provenance = CHANGES[change]
    if patch is not None:
        patch(monkeypatch, fake)
    changed = ask_all(provenance)
    assert changed.directory is not None  # on disk, in a folder of its own
    assert changed.stats()["misses"] == len(SPARSE_KINDS) and fake.calls == 2 * len(SPARSE_KINDS)
    monkeypatch.undo()
    again = ask_all(PROVENANCE)
    assert again.stats()["disk_hits"] == len(SPARSE_KINDS) and fake.calls == 2 * len(SPARSE_KINDS)


def test_another_item_misses_and_patched_kernels_are_never_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One byte of the top-k indices or of an L3 input, one field of a case: another
    item. The masked kernel rebound at run time (an in-process port can): the
    sparse prefill is computed afresh and kept nowhere, the other kinds still hit."""
    import harness.kernels.masked_attention as masked

    fake = FakeSparseOracle()
    cached = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    asked = questions()
    for question in asked.values():
        question(cached)
    mask, case = mask_case(), l3_case()
    topk = materialise_topk(mask)
    topk[-1].view(-1)[-1] ^= 1
    cached.build_topk_mask(mask, topk)
    cached.remap_topk(mask, topk)
    inputs = materialise_sparse_prefill(case, "cpu")
    inputs.topk.view(-1)[0] ^= 1
    cached.sparse_prefill(case, inputs, with_keyless_rows(kernels_for("cpu"), "neg-inf"))
    cached.plan_sparse(dataclasses.replace(case, max_num_seqs=case.max_num_seqs + 1))
    assert fake.calls == len(SPARSE_KINDS) + 4 and cached.stats()["misses"] == fake.calls

    monkeypatch.setattr(masked, "QUERY_BLOCK", 64)
    reader = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    for _ in range(2):
        for question in asked.values():
            question(reader)
    assert reader.stats()["bypassed"] == 2 and reader.stats()["disk_hits"] == len(SPARSE_KINDS) - 1
    assert fake.calls == len(SPARSE_KINDS) + 4 + 2 and len(entries(tmp_path, "sparse-prefill")) == 2


def test_sparse_answers_of_an_overridden_drift_stay_in_memory(tmp_path: Path) -> None:
    fake = FakeSparseOracle()
    drifted = {**PROVENANCE, "oracle_drift_overridden": True}
    for _ in range(2):
        cached = with_oracle_cache(fake, drifted, directory=tmp_path)
        assert isinstance(cached, CachedOracle) and cached.directory is None
        for question in questions().values():
            question(cached)
    assert fake.calls == 2 * len(SPARSE_KINDS) and not list(tmp_path.rglob("sparse-*"))


# -- a damaged or mistyped entry is a miss -----------------------------------------------------


def _fresh_and_entry(tmp_path: Path, kind: str, fake: FakeSparseOracle) -> tuple[Any, Path]:
    fresh = questions()[kind](CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True))
    (entry,) = entries(tmp_path, kind)
    return fresh, entry


def _reads_as_a_miss(tmp_path: Path, kind: str, fake: FakeSparseOracle, fresh: Any, entry: Path, whole: bytes) -> None:
    """The damaged entry is refused (counted unreadable), the oracle asked once,
    its answer handed on and written over the entry; the next reader hits."""
    calls = fake.calls
    reader = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    same_answer(fresh, questions()[kind](reader))
    assert reader.stats()["unreadable"] == 1 and reader.stats()["misses"] == 1 and fake.calls == calls + 1
    assert entry.read_bytes() == whole
    again = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    same_answer(fresh, questions()[kind](again))
    assert again.stats()["disk_hits"] == 1 and fake.calls == calls + 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other-key", "flipped-bit"])
@pytest.mark.parametrize("kind", SPARSE_KINDS)
def test_a_damaged_sparse_entry_is_a_miss_and_is_rewritten(tmp_path: Path, kind: str, damage: str) -> None:
    fake = FakeSparseOracle()
    fresh, entry = _fresh_and_entry(tmp_path, kind, fake)
    whole = entry.read_bytes()
    if damage == "other-key":
        # A whole entry, of another item of the kind, under this item's name.
        questions(1)[kind](CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True))
        (other,) = [p for p in entries(tmp_path, kind) if p != entry]
        entry.write_bytes(other.read_bytes())
    elif damage == "flipped-bit":
        flipped = bytearray(whole)
        flipped[len(whole) * 3 // 4] ^= 0x01
        entry.write_bytes(bytes(flipped))
    else:
        entry.write_bytes(
            {"garbage": b"\x00not an entry\xff" * 9, "truncated": whole[: len(whole) // 2]}.get(damage, b"")
        )
    _reads_as_a_miss(tmp_path, kind, fake, fresh, entry, whole)


def _edit_json(entry: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    payload = json.loads(unsealed(entry.read_bytes()))
    edit(payload)
    entry.write_bytes(sealed(json.dumps(payload, separators=(",", ":")).encode()))


def _edit_tensors(entry: Path, edit: Callable[[dict[str, Any], dict[str, torch.Tensor]], None]) -> None:
    """Rewrite a tensor entry's metadata and tensors, sealed again: a whole,
    well-formed entry of its key, as a harness that wrote another form would."""
    from safetensors.torch import load, save

    data = unsealed(entry.read_bytes())
    length = int.from_bytes(data[:8], "little")
    meta = json.loads(json.loads(data[8 : 8 + length].decode())["__metadata__"]["entry"])
    tensors = load(data)
    edit(meta, tensors)
    entry.write_bytes(sealed(save(tensors, metadata={"entry": json.dumps(meta, sort_keys=True)})))


def _renamed(meta: dict[str, Any], tensors: dict[str, torch.Tensor], names: dict[str, str]) -> None:
    """Tensors renamed in the listing and the file alike (they still agree)."""
    for old, new in names.items():
        tensors[new] = tensors.pop(old)
    meta["tensors"] = [[names.get(n, n), device, stride] for n, device, stride in meta["tensors"]]


def _set_layout(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda payload: payload["sparse_layout"].__setitem__(field, value)


MISTYPED: dict[str, tuple[str, Callable[..., None]]] = {
    "route-unknown": ("sparse-layout", _set_layout("route", "fast")),
    "flag-int": ("sparse-layout", _set_layout("use_dense_mha", 1)),
    "size-text": ("sparse-layout", _set_layout("workspace_size", "16")),
    "shape-short": ("sparse-layout", _set_layout("suffix_mask_shape", [1, 128])),
    "fit-text": ("sparse-layout", _set_layout("masks_fit", "yes")),
    "slice-float": (
        "sparse-layout",
        lambda p: p["sparse_layout"]["layout"].__setitem__("empty_token_slices", [[0, 1.5]]),
    ),
    "workspace-bool": ("sparse-workspace", lambda p: p.__setitem__("value", True)),
    "workspace-float": ("sparse-workspace", lambda p: p.__setitem__("value", 96.0)),
    "error-beside-value": (
        "sparse-workspace",
        lambda p: p.__setitem__("error", {"module": "builtins", "name": "ValueError", "message": 7}),
    ),
    "mask-as-dict": ("sparse-mask", lambda meta, tensors: meta.__setitem__("form", "dict")),
    "mask-renamed": ("sparse-mask", lambda meta, tensors: _renamed(meta, tensors, {"mask": "output"})),
    "mask-stride-text": ("sparse-mask", lambda meta, tensors: meta["tensors"][0].__setitem__(2, ["1"])),
    "remap-as-tuple": ("sparse-remap", lambda meta, tensors: meta.__setitem__("form", "tuple")),
    "remap-reordered": ("sparse-remap", lambda meta, tensors: meta.__setitem__("tensors", meta["tensors"][::-1])),
    "prefill-as-list": ("sparse-prefill", lambda meta, tensors: meta.__setitem__("form", "list")),
    "prefill-name-twice": (
        "sparse-prefill",
        lambda meta, tensors: meta.__setitem__("tensors", [*meta["tensors"], meta["tensors"][0]]),
    ),
    "prefill-error-and-tensors": (
        "sparse-prefill",
        lambda meta, tensors: meta.__setitem__("error", {"module": "builtins", "name": "ValueError", "message": "x"}),
    ),
}


@pytest.mark.parametrize("mistake", list(MISTYPED))
def test_a_mistyped_sparse_entry_is_a_miss_never_a_wrong_answer(tmp_path: Path, mistake: str) -> None:
    """Entries whole and sealed, naming their own key, whose answer is not their
    kind's (a field of another type, a form or tensor names another kind's): refused
    on reading as a damaged entry is, and the fresh answer written over them."""
    kind, edit = MISTYPED[mistake]
    fake = FakeSparseOracle()
    fresh, entry = _fresh_and_entry(tmp_path, kind, fake)
    if mistake == "remap-reordered":
        assert len(fresh) == 2  # two requests: reversed, their names are out of order
    whole = entry.read_bytes()
    if entry.suffix == ".json":
        _edit_json(entry, edit)
    else:
        _edit_tensors(entry, edit)
    assert unsealed(entry.read_bytes())  # still sealed: only the kind's check refuses it
    _reads_as_a_miss(tmp_path, kind, fake, fresh, entry, whole)


@pytest.mark.parametrize("kind", ["sparse-layout", "sparse-prefill"])
def test_a_kept_sparse_error_reads_back_and_a_mistyped_one_is_a_miss(tmp_path: Path, kind: str) -> None:
    """The oracle's refusal is an answer, kept on disk; an error entry whose
    fields are not strings is refused like any mistyped entry."""
    fake = FakeSparseOracle(fail=(l3_case().name,))
    question = questions()[kind]
    with pytest.raises(AssertionError, match="refused") as fresh:
        question(CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True))
    with pytest.raises(AssertionError, match="refused") as hit:
        question(CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True))
    assert str(hit.value) == str(fresh.value) and fake.calls == 1
    (entry,) = entries(tmp_path, kind)
    if entry.suffix == ".json":
        _edit_json(entry, lambda p: p["error"].__setitem__("message", ["refused"]))
    else:
        _edit_tensors(entry, lambda meta, tensors: meta["error"].__setitem__("name", None))
    reader = CachedOracle(fake, SOURCES, tmp_path, sparse_on_disk=True)
    with pytest.raises(AssertionError, match="refused"):
        question(reader)
    assert reader.stats()["unreadable"] == 1 and fake.calls == 2


def test_the_sparse_entries_live_in_the_dense_ones_folder(tmp_path: Path) -> None:
    """One folder per cache format and fingerprint for every kind: the dense
    answers' pruning and last-used stamp cover the sparse ones."""
    cached = with_oracle_cache(FakeSparseOracle(), PROVENANCE, directory=tmp_path)
    assert isinstance(cached, CachedOracle) and cached.directory is not None
    for question in questions().values():
        question(cached)
    folder = cached.directory
    assert folder.parent.name == f"format-{CACHE_FORMAT}" and (folder / LAST_USED).exists()
    assert sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir() if p.name != LAST_USED) == sorted(SPARSE_KINDS)
