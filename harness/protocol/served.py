"""The answering end of the external protocol's tensor ops, for a side served
in a process of its own (``python -m oracle.serve``: a release as the oracle).

A tensor op's request names a safetensors file of inputs and one for the
outputs (docs/external-port-protocol.md). A served oracle's inputs carry one
thing more than a port's: each tensor travels as its whole storage plus its
view (``views``: shape, stride, offset), so the release's code gets the very
layout the harness built (the merge kernel reads LSEs by their strides).
Each level's served op (:attr:`harness.model.levels.LevelSpec.served`) reads
its inputs and writes its outputs through these two functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def request_tensors(request: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The request's input tensors, each viewed as the harness held it when the
    request has ``views`` (a served oracle's), else as stored (a port's)."""
    from safetensors.torch import load_file

    stored = load_file(request["inputs"])
    views = request.get("views")
    if views is None:
        return stored
    tensors = {}
    for name, view in views.items():
        # A fresh allocation, aligned as torch aligns every tensor: a file's
        # tensors sit at any byte offset, and the CPU matmul takes another path
        # (other fp32 bits) for a misaligned operand.
        base = stored[name].clone()
        tensors[name] = base.as_strided(tuple(view["shape"]), tuple(view["stride"]), int(view["offset"]))
    return tensors


def write_outputs(request: dict[str, Any], outputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write ``outputs`` where the request says; the reply's fields (none: the
    answer is the file)."""
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in outputs.items()}, request["outputs"])
    return {}


def prefill_inputs(request: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """The L3 ops' inputs (``oracle_prefill``, ``oracle_sparse_prefill``): the
    harness's :class:`~harness.kernels.numeric.PrefillInputs` rebuilt from the
    request's tensors, numeric section and scalars."""
    from harness.cases.fields import numeric_from_json
    from harness.kernels.numeric import PrefillInputs

    scalars = request["scalars"]
    return PrefillInputs(
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


def request_kernels(request: dict[str, Any]) -> Any:
    """The shared CPU kernels the request's scalars ask for (its keyless-row behaviour)."""
    from harness.kernels import CpuKernels

    return CpuKernels(request["scalars"]["keyless_rows"])
