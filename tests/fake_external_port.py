"""A fake external port for the protocol tests: correct answers (per_request's),
except that on the cases named by --on (repeatable; every request of
--fault-op when --on is not given) it commits the fault named by --fault.

    python tests/fake_external_port.py --fault FAULT [--fault-op layout|merge|prefill]
        [--on CASE]... [--pid-dir DIR] [--merge] [--prefill]

Faults: crash, hang, garbage (a line that is not JSON), error (an ok:false
reply), malformed (a layout lacking a field), wrong-shape, wrong-dtype, nan,
missing (an output tensor left out), no-file (no outputs file written), fifo
(a named pipe at the outputs path), close-stdout (closes its output and lives
on), deaf (answers, then never reads again), huge-run (a layout whose
token_to_seq runs to 10^12 rows), many-runs (ten chunks whose rows together
exceed what the case could need), deep-json (a reply nested 100,000 deep), unrunnable (a layout whose cu_seq_lens do not
add up),
write-continuations (a prefill that writes a continuation instead of merging it),
replan-for-prefill (for every layout request of the case after its first, the
plan of a workspace of one alignment unit: right at L1, another runnable plan
for its prefill),
shift-or-hang (the dcp-padded-by-shift mutant's layout while the case holds at
least --hang-below context tokens, a hang on any smaller one: a port that loops
on the small cases shrinking tries), hang-few (a hang on every batch of fewer
than --requests-below requests, right answers on the rest), none.
--merge and --prefill add those levels to the hello. With --pid-dir it records
its pid and a grandchild's (a `sleep` it starts), so a test can check that no
process outlives the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRITON_INTERPRET", "1")  # the merge runs per_request's Triton kernel on CPU

from harness.cases.files import case_from_json
from harness.model import WorkspaceConfig, layout_from_json
from ports.per_request import PORT

if TYPE_CHECKING:  # torch is imported when a tensor op first arrives: a restart stays quick
    import torch


def commit_process_fault(fault: str, rid: int, where: str) -> bool:
    """The faults that need no result: True when one was committed (reply sent or none due)."""
    print(f"fake port: committing {fault} on {where}", file=sys.stderr, flush=True)
    if fault == "crash":
        sys.exit(3)
    if fault == "hang":
        time.sleep(3600)
    if fault == "garbage":
        print("Segmentation fault (core dumped)", flush=True)
        return True
    if fault == "error":
        print(json.dumps({"id": rid, "ok": False, "error": f"cannot do {where}"}), flush=True)
        return True
    if fault == "deep-json":
        print("[" * 100_000, flush=True)
        return True
    if fault == "close-stdout":
        os.close(sys.stdout.fileno())
        time.sleep(3600)
    return False


def corrupt(tensors: dict[str, torch.Tensor], fault: str) -> dict[str, torch.Tensor] | None:
    """The tensor faults, applied to the outputs; None: write no file at all."""
    import torch

    name = "output"
    if fault == "wrong-shape":
        tensors[name] = tensors[name][..., :-1].contiguous()
    elif fault == "wrong-dtype":
        tensors[name] = tensors[name].to(torch.float64)
    elif fault == "nan":
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = float("nan")
    elif fault == "missing":
        del tensors[name]
    elif fault in ("no-file", "fifo"):
        return None
    return tensors


def merge(request: dict[str, Any]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from harness.kernels.numeric import MergeInputs

    tensors = load_file(request["inputs"])
    inputs = MergeInputs(
        tensors["prefix_output"], tensors["prefix_lse"], tensors["suffix_output"], tensors["suffix_lse"],
        request["prefill_tokens_with_context"],
    )  # fmt: skip
    out, lse = PORT.merge_states(inputs)
    return {"output": out, "lse": lse}


def prefill(request: dict[str, Any], fault: str) -> dict[str, torch.Tensor]:
    """per_request's fold and final merge over the partials the harness sent."""
    from safetensors.torch import load_file

    from ports.per_request.prefill import final_merge, fold_partials

    tensors = load_file(request["inputs"])
    layout = layout_from_json(request["layout"])
    suffix = (tensors["suffix_output"], tensors["suffix_lse"])
    if not layout.chunks:
        return {"output": suffix[0], "lse": suffix[1]}
    partials = [(tensors[f"chunk_output.{i}"], tensors[f"chunk_lse.{i}"]) for i in range(layout.num_chunks)]
    if fault == "write-continuations":
        # A porting bug: a continuation overwrites its request's earlier pieces.
        chunks = tuple(dataclasses.replace(c, is_continuation=False) for c in layout.chunks)
        layout = dataclasses.replace(layout, chunks=chunks)
    context = fold_partials(layout, int(suffix[0].shape[0]), partials)
    return {name: t.contiguous() for name, t in final_merge(context, suffix, request["v_head_dim"]).items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault-op", default="layout")
    parser.add_argument("--on", action="append", default=[])
    parser.add_argument("--pid-dir")
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("--prefill", action="store_true")
    parser.add_argument("--hang-below", type=int, default=0)
    parser.add_argument("--requests-below", type=int, default=3)
    args = parser.parse_args()
    if args.pid_dir:
        child = subprocess.Popen(["sleep", "1000"])
        Path(args.pid_dir, f"{os.getpid()}.pids").write_text(f"{os.getpid()} {child.pid}\n")
    asked: dict[str, int] = {}  # layout requests per case name
    for line in sys.stdin:
        request = json.loads(line)
        op, rid = request["op"], request["id"]
        if op == "bye":
            return
        case_name = request["case"]["name"] if "case" in request else None
        faulty = op == args.fault_op and (not args.on or case_name in args.on)
        if faulty and commit_process_fault(args.fault, rid, f"{op} {case_name or ''}".strip()):
            continue
        if op == "hello":
            levels = ["layout"] + ["merge"] * args.merge + ["prefill"] * args.prefill
            reply = {"id": rid, "ok": True, "protocol": 1, "name": f"fake-{args.fault}", "levels": levels}
        elif op == "layout":
            case = case_from_json(request["case"], "request")
            layout = PORT.plan_layout(case).to_json()
            if faulty and args.fault == "replan-for-prefill":
                asked[case.name] = asked.get(case.name, 0) + 1
                if asked[case.name] > 1:
                    smallest = dataclasses.replace(case, workspace_size=case.alignment)
                    layout = PORT.plan_layout(smallest).to_json()
            if faulty and args.fault == "hang-few" and len(case.context_lens) < args.requests_below:
                time.sleep(3600)
            if faulty and args.fault == "shift-or-hang":
                if sum(case.context_lens) < args.hang_below:
                    time.sleep(3600)
                from ports.mutants import MUTANTS

                layout = MUTANTS["dcp-padded-by-shift"]().plan_layout(case).to_json()
            if faulty and args.fault == "malformed":
                del layout["chunks"][0]["seq_lens"]
            if faulty and args.fault == "huge-run":
                layout["chunks"][0]["token_to_seq"] = [[0, 10**12]]
            if faulty and args.fault == "many-runs":
                layout["chunks"] = [{**layout["chunks"][0], "token_to_seq": [[0, 1000]]}] * 10
            if faulty and args.fault == "unrunnable":
                layout["chunks"][0]["cu_seq_lens"][-1] += 1
            reply = {"id": rid, "ok": True, "layout": layout}
        elif op == "workspace_size":
            reply = {"id": rid, "ok": True, "workspace_size": PORT.workspace_size(WorkspaceConfig(**request["config"]))}
        elif op in ("merge", "prefill"):
            from safetensors.torch import save_file

            outputs = merge(request) if op == "merge" else prefill(request, args.fault if faulty else "none")
            written = corrupt(outputs, args.fault) if faulty else outputs
            if faulty and args.fault == "fifo":
                os.mkfifo(request["outputs"])
            elif written is not None:
                save_file(written, request["outputs"])
            reply = {"id": rid, "ok": True}
        else:
            reply = {"id": rid, "ok": False, "error": f"unsupported op {op}"}
        print(json.dumps(reply), flush=True)
        if faulty and args.fault == "deaf":
            time.sleep(3600)


if __name__ == "__main__":
    main()
