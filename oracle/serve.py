"""One vLLM release as the harness's oracle, served from inside its own environment.

``python -m oracle.serve`` runs in the tox environment of a release
(``.tox/vllm-X``, tox.ini) and answers the harness over the external-port
protocol (docs/external-port-protocol.md: one JSON object per line on stdin and
stdout), so any release can be the oracle without sharing a process, or a
torch, with the harness. :class:`oracle.process.OracleProcess` is the other end.

Ops: ``hello`` (the release, its pin's fingerprint statuses and the levels),
``layout``, ``workspace_size``, ``merge`` and ``oracle_prefill``. The two
tensor ops read their inputs from a safetensors file the harness wrote and
write their outputs to another, as a port's do, with one difference: every
input tensor travels as its whole storage plus its view (shape, stride,
offset), so the release's code gets the very layout the harness built (the
merge kernel reads LSEs by their strides). L3 runs the release's own context
loop and final merge on the harness's shared CPU kernels, inside this process.
Under decode context parallelism only the harness's own rank's cache travels;
the process rebuilds every rank's by the harness's deterministic code and
checks the sent one against it bit for bit (:func:`rank_caches`).

An exception the release's side marks as a refusal (``refusal = True``:
:class:`oracle.legacy.LegacyRefusal`, a batch that release cannot plan or run)
is replied ``ok: false, refusal: true`` with its message; any other exception
``ok: false`` with its type and first line. Both make the item
``oracle-error``; only the first is a class a baseline may expect. Nothing but protocol replies
reaches stdout: the process's own stdout is sent to stderr before vLLM loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import IO, Any

PROTOCOL_VERSION = 1
TENSOR_OPS = ("merge", "oracle_prefill", "oracle_sparse_prefill")
SPARSE_TENSOR_OPS = ("topk_mask", "topk_remap")
# The release whose oracle is not the pinned one's code: its own side module.
LEGACY_RELEASE = "0.27.1"


def side_for(release_version: str) -> Any:
    """The side that calls ``release_version``'s code (the Port interface)."""
    if release_version == LEGACY_RELEASE:
        from oracle.legacy import LegacyOracleSide

        return LegacyOracleSide()
    from oracle.side import OracleSide

    return OracleSide()


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def hello() -> dict[str, Any]:
    """The installed release, its pin's statuses (``pin`` null when the release
    has none) and what this server answers."""
    from harness.model.levels import LEVELS
    from oracle.pin import check_fingerprints, installed_version, load_pin, pin_file_for

    version, commit = installed_version()
    path = pin_file_for(version)
    pin: dict[str, Any] | None = None
    statuses: list[dict[str, Any]] = []
    if path.is_file():
        loaded = load_pin(path)
        pin = {k: loaded.get(k) for k in ("release", "upstream_commit", "upstream_pr")}
        statuses = [
            {"symbol": s.symbol, "expected": s.expected, "found": s.found, "status": s.status}
            for s in check_fingerprints(path)
        ]
    return {
        "protocol": PROTOCOL_VERSION,
        "name": f"oracle vllm=={version}",
        "levels": list(LEVELS),
        "ops": ["layout", "workspace_size", *TENSOR_OPS, "sparse_layout", "sparse_workspace_size", *SPARSE_TENSOR_OPS],
        "installed_vllm": version,
        "installed_commit_id": commit,
        "pin": pin,
        "fingerprints": statuses,
        # What else decides this process's answers (the harness's oracle cache keys on it).
        "environment": numeric_environment(),
    }


def numeric_environment() -> dict[str, str | None]:
    """The Python, torch, Triton and numpy versions of this environment."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "triton", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def _viewed(stored: dict[str, Any], views: dict[str, Any]) -> dict[str, Any]:
    """Each tensor as the harness held it: its storage, viewed as it was."""
    tensors = {}
    for name, view in views.items():
        # A fresh allocation, aligned as torch aligns every tensor: a file's
        # tensors sit at any byte offset, and the CPU matmul takes another path
        # (other fp32 bits) for a misaligned operand.
        base = stored[name].clone()
        tensors[name] = base.as_strided(tuple(view["shape"]), tuple(view["stride"]), int(view["offset"]))
    return tensors


def rank_caches(case: Any, inputs: Any, rank: int) -> Any:
    """Every DCP rank's cache of ``case``, rebuilt here by the harness's own
    deterministic code (:func:`harness.kernels.numeric.materialise_rank_caches`, the
    case's seed), with every rank held by this process.

    Only rank ``rank``'s cache crosses the process boundary (as ``kv_cache``,
    ``block_table``, ``poison_block``); the rebuilt one must be the same bits,
    or the harness and this process disagree on the inputs and the item fails
    (never as a refusal).
    """
    import torch

    from harness.compare.bits import identical_bits
    from harness.kernels.numeric import DcpInputs, materialise_rank_caches
    from harness.model.dcp import OneProcessRanks

    world, interleave = case.dcp_world_size, case.cp_kv_cache_interleave_size
    if not 0 <= rank < world:
        raise ValueError(f"DCP rank {rank} is outside the case's world of {world}")
    caches = materialise_rank_caches(case.context_lens, case.block_size, inputs.spec, world, interleave)
    own = caches[rank]
    sent = inputs.kv_cache.cpu(), inputs.block_table.cpu(), inputs.poison_block
    if not (
        identical_bits(own.kv_cache, sent[0]) and torch.equal(own.block_table, sent[1]) and own.poison_block == sent[2]
    ):
        raise ValueError(
            f"case {case.name}: DCP rank {rank}'s cache rebuilt here differs from the one the harness sent "
            "(kv_cache, block_table or poison_block)"
        )
    device = inputs.kv_cache.device
    held = tuple(replace(c, kv_cache=c.kv_cache.to(device), block_table=c.block_table.to(device)) for c in caches)
    return DcpInputs(world, interleave, rank, held, OneProcessRanks(world, rank))


class Server:
    def __init__(self) -> None:
        from oracle.pin import installed_version

        self.version, _ = installed_version()
        self.side = side_for(self.version)

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "hello":
            return hello()
        if op == "layout":
            from harness.cases.files import case_from_json

            layout = self.side.plan_layout(case_from_json(request["case"], "request"))
            return {"layout": layout.to_json()}
        if op == "workspace_size":
            from harness.cases.files import workspace_config_from_json

            config = workspace_config_from_json(request["config"], "request")
            return {"workspace_size": int(self.side.workspace_size(config))}
        if op == "sparse_layout":
            from harness.cases.sparse_inputs import sparse_case_from_json

            return {"sparse_layout": self.side.plan_sparse(sparse_case_from_json(request["case"], "request")).to_json()}
        if op == "sparse_workspace_size":
            from harness.cases.sparse_inputs import sparse_workspace_config_from_json

            sparse_config = sparse_workspace_config_from_json(request["config"], "request")
            return {"workspace_size": int(self.side.sparse_workspace_size(sparse_config))}
        if op in SPARSE_TENSOR_OPS:
            return self._topk_op(op, request)
        if op in TENSOR_OPS:
            return self._tensor_op(op, request)
        raise ValueError(f"unknown op {op!r}")

    def _topk_op(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import load_file, save_file

        from harness.cases.sparse_inputs import topk_mask_case_from_json

        case = topk_mask_case_from_json(request["case"], "request")
        stored = load_file(request["inputs"])
        topk = [stored[f"topk.{r}"].clone() for r in range(case.num_requests)]
        if op == "topk_mask":
            outputs = {"mask": self.side.build_topk_mask(case, topk)}
        else:
            outputs = {f"remapped.{r}": t for r, t in enumerate(self.side.remap_topk(case, topk))}
        save_file({k: v.contiguous() for k, v in outputs.items()}, request["outputs"])
        return {}

    def _tensor_op(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import load_file, save_file

        tensors = _viewed(load_file(request["inputs"]), request["views"])
        if op == "merge":
            from harness.kernels.numeric import MergeInputs

            output, lse = self.side.merge_states(
                MergeInputs(
                    tensors["prefix_output"],
                    tensors["prefix_lse"],
                    tensors["suffix_output"],
                    tensors["suffix_lse"],
                    request["prefill_tokens_with_context"],
                )
            )
            outputs = {"output": output, "lse": lse}
        else:
            from harness.cases.fields import numeric_from_json
            from harness.cases.files import case_from_json
            from harness.kernels import CpuKernels
            from harness.kernels.numeric import PrefillInputs

            scalars = request["scalars"]
            kernels = CpuKernels(scalars["keyless_rows"])
            inputs = PrefillInputs(
                spec=numeric_from_json(request["spec"], "request"),
                kv_cache=tensors["kv_cache"],
                block_table=tensors["block_table"],
                q=tensors["q"],
                new_kv_c=tensors["new_kv_c"],
                new_k_pe=tensors["new_k_pe"],
                kv_b_weight=tensors["kv_b_weight"],
                query_start_loc=tensors["query_start_loc"],
                max_query_len=int(scalars["max_query_len"]),
                scale=float(scalars["scale"]),
                poison_block=int(scalars["poison_block"]),
            )
            if op == "oracle_sparse_prefill":
                from harness.cases.sparse_inputs import sparse_case_from_json
                from harness.kernels.sparse_prefill import SparsePrefillInputs

                sparse_case = sparse_case_from_json(request["case"], "request")
                outputs = self.side.sparse_prefill(sparse_case, SparsePrefillInputs(inputs, tensors["topk"]), kernels)
                save_file({k: v.contiguous() for k, v in outputs.items()}, request["outputs"])
                return {}
            case = case_from_json(request["case"], "request")
            if case.dcp_world_size > 1:
                inputs = replace(inputs, dcp=rank_caches(case, inputs, int(scalars.get("dcp_rank", 0))))
            outputs = self.side.prefill(case, inputs, kernels)
        save_file({k: v.contiguous() for k, v in outputs.items()}, request["outputs"])
        return {}


def serve(requests: IO[str], replies: IO[str]) -> int:
    server: Server | None = None
    for line in requests:
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            replies.write(json.dumps({"id": None, "ok": False, "error": "request is not JSON"}) + "\n")
            replies.flush()
            continue
        if request.get("op") == "bye":
            return 0
        try:
            if server is None:
                server = Server()
            reply = {"ok": True, **server.answer(request)}
        except Exception as exc:
            # A refusal (an exception the side marks ``refusal``) is a class of
            # batches the release cannot plan or run, stated in its own words; any
            # other exception is the oracle failing, never a class a baseline names.
            if getattr(exc, "refusal", False):
                reply = {"ok": False, "error": str(exc).splitlines()[0], "refusal": True}
            else:
                reply = {"ok": False, "error": one_line(exc)}
        replies.write(json.dumps({"id": request.get("id"), **reply}) + "\n")
        replies.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--hello", action="store_true", help="print the hello reply (release, pin statuses) and exit")
    args = parser.parse_args(argv)
    import torch

    # One intra-op thread, as in every process of the harness that compares
    # (harness.engine.device.NUMERIC_THREADS): an fp32 matmul's bits depend on it.
    torch.set_num_threads(1)
    # Only protocol replies go to the real stdout; anything vLLM or torch print
    # goes to stderr, where the harness keeps its tail for error messages.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if args.hello:
        replies.write(json.dumps(hello(), indent=2) + "\n")
        replies.flush()
        return 0
    return serve(sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main())
