"""The sparse MLA path (SPEC 1d, issue 28): the sparse workspace, route and mask
shapes at level sparse-layout, the mask builder and the remap at sparse-mask.

The oracle is the pinned release's own sparse backend, in this process; the
legacy release's (0.27.1) is served from its own environment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cases.fields import CaseError
from harness.cases.files import load_item_file
from harness.cases.sparse_inputs import materialise_topk
from harness.cases.suites import load_suite
from harness.model.sparse import SparseCase, SparseWorkspaceConfig, TopkMaskCase
from harness.sides.items import DIVERGENT, PARITY
from harness.sides.runner import run_item
from ports.equal_share import PORT as EQUAL_SHARE
from ports.mutants import MUTANTS
from ports.mutants.sparse import SPARSE_L3_MUTANTS, SPARSE_MUTANTS
from ports.per_request import PORT as PER_REQUEST
from ports.per_request.sparse import topk_mask_shape

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def oracle() -> Any:
    from oracle.environment import prepare_cpu_environment

    prepare_cpu_environment()
    from oracle.side import OracleSide

    return OracleSide()


def _run(oracle: Any, port: Any, kind: str, item: Any) -> Any:
    from harness.kernels import kernels_for

    return run_item(oracle, port, kind, item, kernels_for("cpu"))


def test_smoke_sparse_items_are_at_parity(oracle: Any) -> None:
    suite = load_suite("smoke")
    assert suite.sparse_cases and suite.sparse_workspace_configs and suite.mask_cases
    items: list[tuple[str, Any]] = [("sparse-layout", c) for c in suite.sparse_cases]
    items += [("sparse-workspace", c) for c in suite.sparse_workspace_configs]
    items += [("sparse-mask", c) for c in suite.mask_cases]
    statuses = {(kind, item.name): _run(oracle, PER_REQUEST, kind, item).status for kind, item in items}
    assert set(statuses.values()) == {PARITY}, [k for k, v in statuses.items() if v != PARITY]


def _batch(**fields: Any) -> SparseCase:
    base = dict(
        name="t",
        context_lens=(3000, 0, 500),
        query_lens=(600, 5, 100),
        block_size=16,
        max_model_len=163840,
        max_num_seqs=256,
        index_topk=2048,
        tensor_parallel_size=8,
    )
    return SparseCase(**{**base, **fields})


def test_route_takes_each_value_and_agrees(oracle: Any) -> None:
    routes = {
        "dense-mha": _batch(context_lens=(1000, 0, 500), query_lens=(1048, 5, 100)),
        "masked-mha": _batch(),
        "mqa": _batch(tensor_parallel_size=3),
        "masked-mha-unavailable": _batch(
            context_lens=(1000, 0, 5), query_lens=(600, 5, 100), force_masked_mha=True, masked_kernel=False
        ),
        # Forced masked MHA under DCP on a batch with context: the masked context loop refuses DCP.
        "masked-mha-unavailable ": _batch(
            context_lens=(1000, 0, 5), query_lens=(600, 5, 100), force_masked_mha=True, dcp_world_size=2
        ),
        # Forced masked MHA on a batch whose suffix mask (3 x 640 rows x 19 words) the workspace cannot hold.
        "masked-mha-overflow": _batch(
            context_lens=(1000, 0, 5), query_lens=(600, 5, 100), force_masked_mha=True, mask_workspace_words=30000
        ),
        # The same under DCP: forward_mha runs the suffix before the context loop, whose DCP refusal never comes.
        "masked-mha-overflow ": _batch(
            context_lens=(1000, 0, 5),
            query_lens=(600, 5, 100),
            force_masked_mha=True,
            mask_workspace_words=30000,
            dcp_world_size=2,
        ),
    }
    for route, case in routes.items():
        mine, theirs = PER_REQUEST.plan_sparse(case), oracle.plan_sparse(case)
        assert theirs.route == route.strip(), (route, theirs)
        assert mine == theirs


def test_dense_route_edge_is_inclusive(oracle: Any) -> None:
    """A longest sequence of exactly index_topk keys takes dense MHA; one more does not."""
    at = _batch(context_lens=(1448,), query_lens=(600,))
    past = _batch(context_lens=(1449,), query_lens=(600,))
    assert oracle.plan_sparse(at).use_dense_mha is True
    assert oracle.plan_sparse(past).use_dense_mha is False
    mutant = MUTANTS["sparse-route-lt-topk"]()
    assert _run(oracle, mutant, "sparse-layout", at).status == DIVERGENT
    assert _run(oracle, mutant, "sparse-layout", past).status == PARITY


@pytest.mark.parametrize("slack", [1, 0, -1])
def test_global_mask_fits_by_one_and_misses_by_one(oracle: Any, slack: int) -> None:
    case = _batch()
    needed = math.prod(topk_mask_shape(3, 600, 3600, key_starts_word=True))
    case = dataclasses.replace(case, mask_workspace_words=needed + slack)
    theirs = oracle.plan_sparse(case)
    assert theirs.global_mask_fits is (slack >= 0)
    assert PER_REQUEST.plan_sparse(case) == theirs


def test_threshold_bucket_edges(oracle: Any) -> None:
    """FLASHMLA_SPARSE at TP 1: 1536 queries for sequences up to 2048 keys, 4096 up to 4096."""
    for context, query, expected in ((512, 1536, True), (513, 1536, False), (513, 1535, False)):
        case = _batch(context_lens=(context,), query_lens=(query,), index_topk=256, tensor_parallel_size=1)
        theirs = oracle.plan_sparse(case)
        assert theirs.masked_threshold is expected, (context, query)
        assert PER_REQUEST.plan_sparse(case) == theirs


def test_sparse_workspace_terms_and_legacy_floor(oracle: Any) -> None:
    configs = [
        SparseWorkspaceConfig(100, 3, 16, 2048),  # 8 * max_model_len binds
        SparseWorkspaceConfig(163840, 1024, 64, 2048),  # 65536 binds
        SparseWorkspaceConfig(163840, 4, 64, 256),  # max_num_seqs * index_topk binds
        SparseWorkspaceConfig(163840, 1, 528, 1),  # the block floor
        SparseWorkspaceConfig(100, 3, 48, 2049, 3, 16),  # DCP alignment
    ]
    for config in configs:
        assert PER_REQUEST.sparse_workspace_size(config) == oracle.sparse_workspace_size(config)
    floor = MUTANTS["sparse-workspace-floor"]()
    assert _run(oracle, floor, "sparse-workspace", SparseWorkspaceConfig(163840, 4, 64, 16)).status == DIVERGENT


def _mask_case(**fields: Any) -> TopkMaskCase:
    base = dict(
        name="m",
        query_lens=(129, 7),
        seq_lens=(200, 65),
        index_topk=64,
        form="batched",
        pattern="boundary",
        seed=5,
        range_starts=(40, 32),
        range_lens=(100, 33),
    )
    return TopkMaskCase(**{**base, **fields})


@pytest.mark.parametrize(
    "name", [m.name for m in SPARSE_MUTANTS if m.name != "sparse-workspace-floor" and m not in SPARSE_L3_MUTANTS]
)
def test_each_mask_or_route_mutant_is_caught_on_a_small_item(oracle: Any, name: str) -> None:
    mutant = MUTANTS[name]()
    mask = _mask_case()
    global_mask = _mask_case(form="global", key_starts=(40, 0))
    batch = _batch(context_lens=(1448,), query_lens=(600,))
    results = [
        _run(oracle, mutant, "sparse-mask", mask),
        _run(oracle, mutant, "sparse-mask", global_mask),
        _run(oracle, mutant, "sparse-layout", batch),
    ]
    assert DIVERGENT in {r.status for r in results}, [r.detail() for r in results]
    for item in (mask, global_mask):
        assert _run(oracle, PER_REQUEST, "sparse-mask", item).status == PARITY


def test_mask_divergence_names_the_word_and_the_indices(oracle: Any) -> None:
    result = _run(oracle, MUTANTS["sparse-mask-msb-first"](), "sparse-mask", _mask_case())
    message = result.detail()
    assert "mask[request 0, query row 0, word" in message and "indices setting the differing bits" in message
    assert result.divergence is not None and len(result.divergence.oracle) == 32


def test_explicit_indices_and_bad_input(tmp_path: Path, oracle: Any) -> None:
    good = {
        "kind": "topk-mask",
        "name": "explicit",
        "query_lens": [2],
        "seq_lens": [40],
        "index_topk": 3,
        "form": "single",
        "topk": [[[0, 31, -1], [32, 39, 39]]],
    }
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(good))
    kind, case = load_item_file(path)
    assert kind == "sparse-mask"
    mask = oracle.build_topk_mask(case, materialise_topk(case))
    assert mask[0, 0, 0] == (1 | (1 << 31)) - (1 << 32) and mask[0, 1, 1] == 1 | (1 << 7)
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "index past the sequence": ({**good, "topk": [[[0, 40, -1], [1, 2, 3]]]}, "topk[0][0][1]"),
        "float index": ({**good, "topk": [[[0, 1.5, -1], [1, 2, 3]]]}, "topk[0][0][1]"),
        "short row": ({**good, "topk": [[[0, 1], [1, 2, 3]]]}, "topk[0][0]"),
        "index_topk 0": ({**good, "index_topk": 0}, "index_topk"),
    }
    bad["name with a space"] = ({**good, "name": "two words"}, "name")
    for why, (data, field) in bad.items():
        path.write_text(json.dumps(data))
        with pytest.raises(CaseError) as caught:
            load_item_file(path)
        assert caught.value.field == field, why
        assert str(path) in str(caught.value)
    batch = {
        "kind": "sparse",
        "name": "b",
        "context_lens": [10],
        "query_lens": [5],
        "block_size": 16,
        "max_model_len": 4096,
        "max_num_seqs": 4,
        "index_topk": 2048,
        "backend": "NO_SUCH_BACKEND",
    }
    path.write_text(json.dumps(batch))
    with pytest.raises(CaseError) as caught:
        load_item_file(path)
    assert caught.value.field == "backend"


def test_diff_on_a_bad_sparse_file_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "kind": "topk-mask",
                "name": "x",
                "query_lens": [1],
                "seq_lens": [4],
                "index_topk": 1,
                "form": "single",
                "topk": [[[9]]],
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "harness", "diff", str(path), "--port", "per_request"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "topk[0][0][0]" in done.stderr and "Traceback" not in done.stderr


def test_equal_share_sparse_matches_0_27_1(legacy_oracle: Any) -> None:
    legacy = legacy_oracle
    suite = load_suite("smoke")
    items: list[tuple[str, Any]] = [("sparse-layout", c) for c in suite.sparse_cases[:12]]
    items += [("sparse-workspace", c) for c in suite.sparse_workspace_configs[:30]]
    items += [("sparse-mask", c) for c in suite.mask_cases[:3]]
    results = [_run(legacy, EQUAL_SHARE, kind, item) for kind, item in items]
    # Where 0.27.1 plans, equal_share is at parity; where it refuses, the refusal is 0.27.1's own class.
    refused = [r for r in results if r.status != PARITY]
    assert all(r.status == "oracle-error" and "OracleRefusal" in (r.error or "") for r in refused), refused
    assert len(results) - len(refused) >= 40
    # 0.27.1 checks its global mask against a fixed 64 MiB, then views the
    # workspace it has: a small one cannot hold it (and 0.28.0 checks first).
    small = _batch(
        context_lens=(1000, 0, 5), query_lens=(600, 5, 100), force_masked_mha=True, mask_workspace_words=30000
    )
    assert legacy.plan_sparse(small).route == "masked-mha-overflow"
    assert _run(legacy, EQUAL_SHARE, "sparse-layout", small).status == PARITY
    # The pinned port is not 0.27.1's: its sparse workspace lost the floor.
    floor = _run(legacy, PER_REQUEST, "sparse-workspace", SparseWorkspaceConfig(163840, 4, 64, 16))
    assert floor.status == DIVERGENT


def test_stood_in_modules_are_put_back_as_they_were() -> None:
    """The sparse oracle's stand-ins for vLLM's CUDA-only modules touch only their
    names: an absent name is absent again, a blocked one (None) blocked again,
    and a module imported meanwhile stays imported."""
    import sys
    import types

    from oracle.environment import stood_in_modules

    blocked, absent = "parity_test_blocked_module", "parity_test_absent_module"
    sys.modules[blocked] = None  # type: ignore[assignment]
    try:
        stand_ins = {blocked: types.ModuleType(blocked), absent: types.ModuleType(absent)}
        with stood_in_modules(stand_ins):
            assert sys.modules[blocked] is stand_ins[blocked] and sys.modules[absent] is stand_ins[absent]
            import colorsys  # noqa: F401  (imported inside the block)
        assert sys.modules[blocked] is None and absent not in sys.modules and "colorsys" in sys.modules
    finally:
        del sys.modules[blocked]
