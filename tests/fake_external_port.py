"""A fake external port for the protocol tests: correct answers (per_request's),
except for the case named by --on, where it commits the fault named by --fault.

    python tests/fake_external_port.py --fault crash|hang|garbage|malformed|error|none
        [--on CASE] [--pid-dir DIR] [--merge]

With --pid-dir it records its pid and a grandchild's (a `sleep` it starts), so
a test can check that no process outlives the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRITON_INTERPRET", "1")  # the merge runs per_request's Triton kernel on CPU

from harness.cases import case_from_json
from harness.model import WorkspaceConfig
from ports.per_request import PORT


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none")
    parser.add_argument("--on", default="")
    parser.add_argument("--pid-dir")
    parser.add_argument("--merge", action="store_true")
    args = parser.parse_args()
    if args.pid_dir:
        child = subprocess.Popen(["sleep", "1000"])
        Path(args.pid_dir, f"{os.getpid()}.pids").write_text(f"{os.getpid()} {child.pid}\n")
    for line in sys.stdin:
        request = json.loads(line)
        op, rid = request["op"], request["id"]
        if op == "bye":
            return
        if op == "hello":
            levels = ["layout", "merge"] if args.merge else ["layout"]
            reply = {"id": rid, "ok": True, "protocol": 1, "name": f"fake-{args.fault}", "levels": levels}
        elif op == "layout":
            case = case_from_json(request["case"], "request")
            if case.name == args.on:
                print(f"fake port: committing {args.fault} on {case.name}", file=sys.stderr, flush=True)
                if args.fault == "crash":
                    sys.exit(3)
                if args.fault == "hang":
                    time.sleep(3600)
                if args.fault == "garbage":
                    print("Segmentation fault (core dumped)", flush=True)
                    continue
                if args.fault == "error":
                    print(json.dumps({"id": rid, "ok": False, "error": "cannot plan this"}), flush=True)
                    continue
            layout = PORT.plan_layout(case).to_json()
            if case.name == args.on and args.fault == "malformed":
                del layout["chunks"][0]["seq_lens"]
            reply = {"id": rid, "ok": True, "layout": layout}
        elif op == "workspace_size":
            reply = {"id": rid, "ok": True, "workspace_size": PORT.workspace_size(WorkspaceConfig(**request["config"]))}
        elif op == "merge":
            from safetensors.torch import load_file, save_file

            from harness.numeric import MergeInputs

            tensors = load_file(request["inputs"])
            inputs = MergeInputs(
                tensors["prefix_output"], tensors["prefix_lse"], tensors["suffix_output"], tensors["suffix_lse"],
                request["prefill_tokens_with_context"],
            )  # fmt: skip
            out, lse = PORT.merge_states(inputs)
            if args.fault == "wrong-shape":
                out = out[..., :-1].contiguous()
            save_file({"output": out, "lse": lse}, request["outputs"])
            reply = {"id": rid, "ok": True}
        else:
            reply = {"id": rid, "ok": False, "error": f"unsupported op {op}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
