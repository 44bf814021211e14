"""Malformed requests to the C++ reference port: each gets an ok:false reply
naming what is wrong (and the request's id where it can be read), the process
stays up for the next request, and well-formed requests still work after them.
Before these checks existed the port segfaulted on a safetensors header whose
element count overflows, divided by zero on block_size 0 and overflowed its
stack on deeply nested JSON."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any


def safetensors_file(path: Path, header: dict[str, Any], data: bytes) -> str:
    """A safetensors file with `header` as given, unchecked: the point is to break it."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return str(path)


def f32_entry(shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def merge_inputs(path: Path, tokens: int, heads: int, dim: int) -> str:
    """A well-formed merge input of F32 zeros (values) and zeros (LSE)."""
    values, lse = tokens * heads * dim * 4, heads * tokens * 4
    header, offset = {}, 0
    for name, shape, size in (
        ("prefix_output", [tokens, heads, dim], values),
        ("suffix_output", [tokens, heads, dim], values),
        ("prefix_lse", [heads, tokens], lse),
        ("suffix_lse", [heads, tokens], lse),
    ):
        header[name] = f32_entry(shape, offset, offset + size)
        offset += size
    return safetensors_file(path, header, bytes(offset))


class Port:
    """The port process, one request line and one reply line at a time."""

    def __init__(self, binary: str) -> None:
        self.process = subprocess.Popen(
            [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.next_id = 0

    def ask(self, request: dict[str, Any] | str) -> dict[str, Any] | None:
        """The reply to `request` (a dict, or a raw line); None when the port died."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.next_id += 1
        line = request if isinstance(request, str) else json.dumps({"id": self.next_id, **request})
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        answer = self.process.stdout.readline()
        return json.loads(answer) if answer else None


def run_checks(binary: str, work: Path) -> list[str]:
    """The failed checks of `binary`, its files written under `work`."""
    from harness.model import Case, WorkspaceConfig
    from ports.per_request import dense_workspace_size
    from ports.per_request.metadata import build_layout

    failures: list[str] = []
    port = Port(binary)
    outputs = str(work / "outputs.safetensors")
    case = {"context_lens": [40, 0], "query_lens": [3, 2], "block_size": 16, "workspace_size": 32}

    def restart() -> None:
        """A fresh process, so that the remaining checks still run after a crash."""
        nonlocal port
        port = Port(binary)
        port.ask({"op": "hello", "protocol": 1})

    def expect_error(label: str, request: dict[str, Any] | str, *words: str, keeps_id: bool = True) -> None:
        """An ok:false reply whose one-line error holds every one of `words` (and the request's id, if readable)."""
        reply = port.ask(request)
        if reply is None:
            failures.append(f"{label}: the port died (exit code {port.process.wait()})")
            restart()
            return
        error = str(reply.get("error", ""))
        wrong_id = keeps_id and reply.get("id") != port.next_id
        if reply.get("ok") is not False or wrong_id or "\n" in error or not all(w in error for w in words):
            failures.append(f"{label}: wanted ok:false naming {words}, got {reply}")

    def expect_ok(label: str, request: dict[str, Any]) -> dict[str, Any]:
        reply = port.ask(request)
        if reply is None or reply.get("ok") is not True or reply.get("id") != port.next_id:
            failures.append(f"{label}: wanted ok:true with id {port.next_id}, got {reply}")
            return {}
        return reply

    expect_ok("hello", {"op": "hello", "protocol": 1})

    # Every tensor a merge needs, each 2^64 elements that a wrapping product counts as 0 bytes.
    huge, wide = [1 << 32, 1 << 32, 1], [1 << 32, 1 << 32]
    overflowing = {name: f32_entry(huge, 0, 0) for name in ("prefix_output", "suffix_output")}
    overflowing |= {name: f32_entry(wide, 0, 0) for name in ("prefix_lse", "suffix_lse")}
    path = safetensors_file(work / "overflowing-shape.safetensors", overflowing, b"")
    expect_error("shape [2^32, 2^32, 1]", {"op": "merge", "inputs": path, "outputs": outputs}, path, "overflow")
    wide_empty = work / "empty-but-wide.safetensors"
    path = safetensors_file(wide_empty, {"suffix_output": f32_entry([0, 1 << 32, 1 << 32], 0, 0)}, b"")
    expect_error("shape [0, 2^32, 2^32]", {"op": "merge", "inputs": path, "outputs": outputs}, path, "overflow")
    negative = work / "negative-dim.safetensors"
    path = safetensors_file(negative, {"suffix_output": f32_entry([-1, 2, 2], 0, 0)}, b"")
    expect_error("negative dimension", {"op": "merge", "inputs": path, "outputs": outputs}, path, "negative")
    short = work / "span-mismatch.safetensors"
    path = safetensors_file(short, {"suffix_output": f32_entry([1, 1, 2], 0, 4)}, bytes(8))
    expect_error(
        "span mismatch", {"op": "merge", "inputs": path, "outputs": outputs}, path, "suffix_output", "span 4 bytes"
    )
    past_end = work / "past-end.safetensors"
    path = safetensors_file(past_end, {"suffix_output": f32_entry([1, 1, 2], 8, 16)}, bytes(8))
    expect_error("offsets past the data", {"op": "merge", "inputs": path, "outputs": outputs}, path, "outside")
    backwards = work / "backwards.safetensors"
    path = safetensors_file(backwards, {"suffix_output": f32_entry([1, 1, 2], 8, 0)}, bytes(8))
    expect_error("offsets out of order", {"op": "merge", "inputs": path, "outputs": outputs}, path, "out of order")

    expect_error("empty case object", {"op": "layout", "case": {}}, "context_lens")
    expect_error("block_size 0", {"op": "layout", "case": {**case, "block_size": 0}}, "block_size")
    expect_error("dcp_world_size 0", {"op": "layout", "case": {**case, "dcp_world_size": 0}}, "dcp_world_size")
    expect_error("interleave 0", {"op": "layout", "case": {**case, "cp_kv_cache_interleave_size": 0}}, "interleave")
    expect_error("negative context", {"op": "layout", "case": {**case, "context_lens": [40, -1]}}, "context_lens[1]")
    expect_error("lengths differ", {"op": "layout", "case": {**case, "query_lens": [3]}}, "query_lens")
    config = {"max_model_len": 4096, "max_num_seqs": 8, "block_size": 0}
    expect_error("workspace block 0", {"op": "workspace_size", "config": config}, "block_size")
    huge_int = json.dumps({"id": port.next_id + 1, "op": "layout", "case": case})
    huge_int = huge_int.replace('"workspace_size": 32', '"workspace_size": 123456789012345678901234567890')
    expect_error("huge JSON integer", huge_int, "workspace_size", "64 bits")
    expect_error("nesting 100000 deep", "[" * 100_000, "nested", keeps_id=False)

    # What ports/per_request answers for a batch without requests, bypassing the
    # harness's case validation (which refuses one).
    empty_batch = Case(name="empty", context_lens=(), query_lens=(), block_size=16, workspace_size=32)
    python_layout = build_layout(empty_batch)
    want = {"chunks": list(python_layout.chunks), "empty_token_slices": list(python_layout.empty_token_slices)}
    reply = expect_ok("empty batch", {"op": "layout", "case": {**case, "context_lens": [], "query_lens": []}})
    if reply and reply["layout"] != want:
        failures.append(f"empty batch: per_request gives {want}, the port {reply['layout']}")

    big = {"max_model_len": 1 << 40, "max_num_seqs": 1 << 40, "block_size": 1 << 40}
    reply = expect_ok("workspace_size of 2^40 sizes", {"op": "workspace_size", "config": big})
    if reply and reply["workspace_size"] != dense_workspace_size(WorkspaceConfig(**big)):
        failures.append(
            f"workspace_size of 2^40 sizes: per_request gives {dense_workspace_size(WorkspaceConfig(**big))}"
        )

    reply = expect_ok("layout after the errors", {"op": "layout", "case": case})
    if reply and len(reply["layout"]["chunks"]) != 2:
        failures.append(f"layout after the errors: wanted 2 chunks, got {reply['layout']}")
    inputs = merge_inputs(work / "merge.safetensors", tokens=2, heads=1, dim=4)
    expect_ok("merge after the errors", {"op": "merge", "inputs": inputs, "outputs": outputs})
    if not Path(outputs).is_file():
        failures.append("merge after the errors: no outputs file")

    port.ask({"op": "bye"})
    code = port.process.wait(timeout=10)
    if code != 0:
        failures.append(f"bye: exit code {code}")
    return failures


def test_malformed_requests_get_error_replies_and_the_port_lives_on(cpp_port: Path, tmp_path: Path) -> None:
    assert run_checks(str(cpp_port), tmp_path) == []
