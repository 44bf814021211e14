"""The pin covers the sparse path (issue 44): both pins fingerprint the sparse
backend's functions the trace finds the sparse oracle executing, and a sparse
symbol edited in a copy of its module refuses every start of the pinned oracle,
naming it (the 0.27.1 pin's twin is in tests/test_legacy_oracle.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine import UsageError, open_oracle
from oracle.pin import OTHER_PINS, PIN_FILE, SPARSE, check_fingerprints, load_pin
from tests.cli_in_process import parity_in_process
from tests.edited_vllm import EDIT, edited_module

# Upstream's top-k remap: the sparse-mask level and the masked prefill loop run it.
SYMBOL = f"{SPARSE}:SparseMLACommonImpl._remap_topk_to_ranges"

# What the sparse oracle runs of both releases' sparse backends, whatever else
# each pin holds: the workspace size, the fit check's shape, the mask builder and
# its kernels, the remap, the masked loop and the layer's forward_mha.
SPARSE_SYMBOLS = tuple(
    f"{SPARSE}:{name}"
    for name in (
        "SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size",
        "SparseMLACommonMetadataBuilder.build",
        "_build_topk_mask",
        "_scatter_topk_kernel",
        "_scatter_topk_single_req_kernel",
        "SparseMLACommonImpl._try_build_global_mask",
        "SparseMLACommonImpl._run_masked_mha",
        "SparseMLACommonImpl._remap_topk_to_ranges",
        "SparseMLACommonImpl._compute_context_mha",
        "SparseMLACommonImpl.forward_mha",
    )
)


@pytest.mark.parametrize("pin", [PIN_FILE, OTHER_PINS / "vllm-0.27.1.json"], ids=["0.28.0", "0.27.1"])
def test_both_pins_fingerprint_the_sparse_path(pin: Path) -> None:
    fingerprints = load_pin(pin)["fingerprints"]
    assert set(SPARSE_SYMBOLS) <= set(fingerprints)


@pytest.fixture
def edited(tmp_path: Path) -> Iterator[Path]:
    """``SYMBOL``'s module, a copy with one statement added to ``SYMBOL``."""
    with edited_module(SYMBOL, tmp_path) as copy:
        yield copy


def test_a_sparse_symbol_edited_in_a_copy_refuses_every_start(edited: Path) -> None:
    assert EDIT in edited.read_text(encoding="utf-8")
    pinned = load_pin()["fingerprints"][SYMBOL]
    # The check names the edited symbol and nothing else: the rest of the copied
    # module reads as installed.
    drifted = [(s.symbol, s.status) for s in check_fingerprints() if s.status != "ok"]
    assert drifted == [(SYMBOL, "mismatch")]

    with pytest.raises(UsageError) as refused:
        open_oracle(False)
    assert str(refused.value).startswith(f"oracle fingerprint mismatch: {SYMBOL} (pinned {pinned}, installed ")

    # The command line, oracle cache on (the default): one line, exit 2.
    done = parity_in_process("run", "--suite", "smoke", "--level", "sparse-layout")
    assert done.returncode == 2
    assert done.stderr.startswith(f"parity: error: oracle fingerprint mismatch: {SYMBOL} (pinned {pinned}")
    assert done.stderr.count("\n") == 1

    # `parity oracle` lists every pinned symbol, this one drifted.
    done = parity_in_process("oracle")
    assert done.returncode == 1 and "oracle: DRIFTED from the pin" in done.stdout
    assert f"mismatch {SYMBOL}  pinned {pinned}" in done.stdout
    assert sum(line.startswith("  ok ") for line in done.stdout.splitlines()) == len(load_pin()["fingerprints"])


def test_the_installed_module_is_back_after_the_copy(tmp_path: Path) -> None:
    with edited_module(SYMBOL, tmp_path):
        assert any(s.status != "ok" for s in check_fingerprints())
    assert all(s.status == "ok" for s in check_fingerprints())


def test_an_upstream_value_changed_in_place_refuses_every_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin holds the values the oracle's answers are read from, not only
    code: a threshold bucket edge moved by one in the installed module is drift."""
    from oracle.environment import import_vllm_module
    from oracle.pin import MLA, READ_VALUES

    symbol = f"{MLA}:_DSV32_SEQ_LEN_BUCKETS"
    assert symbol in READ_VALUES and symbol in load_pin()["fingerprints"]
    module = import_vllm_module(MLA)
    edges = module._DSV32_SEQ_LEN_BUCKETS
    monkeypatch.setattr(module, "_DSV32_SEQ_LEN_BUCKETS", (edges[0] + 1, *edges[1:]))
    drifted = [(s.symbol, s.status) for s in check_fingerprints() if s.status != "ok"]
    assert drifted == [(symbol, "mismatch")]
    with pytest.raises(UsageError) as refused:
        open_oracle(False)
    assert str(refused.value).startswith(f"oracle fingerprint mismatch: {symbol} ")
