"""Ports in any language: a command speaking newline-delimited JSON.

``--port 'cmd:build/cpp-port --mode per_request'`` starts the command once per
run (in its own process group) and exchanges one JSON object per line over its
stdin and stdout; ``docs/external-port-protocol.md`` is the specification.
Every request has a timeout. A port that crashes, hangs, prints something that
is not a JSON reply, or replies with an error or a malformed result makes that
item a ``port-error`` carrying the tail of its stderr; the process is killed and
a fresh one is started for the next item. No process outlives the run: the
harness kills the group on close and at interpreter exit.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import shlex
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.model import Case, Layout, WorkspaceConfig, layout_from_json
from harness.model.levels import LEVELS, registered_levels
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase, sparse_layout_from_json
from harness.protocol.errors import ExternalPortError
from harness.protocol.port import DEFAULT_PORT_TIMEOUT_S, HarnessFault

if TYPE_CHECKING:
    # The tensor ops' types: a port asked for layouts alone never loads torch.
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs

PROTOCOL_VERSION = 1
STDERR_TAIL = 600
# The levels a port may declare in its hello (the sparse ones: SPEC 1d): the registry's.
PROTOCOL_LEVELS = LEVELS
# A reply line longer than this is a port gone wrong, not a layout.
MAX_REPLY_BYTES = 256 << 20


def read_port_file(path: Path, limit: int, op: str) -> bytes:
    """The bytes of a file a port wrote in answer to ``op``, read once into
    memory: a regular file (never a FIFO or a device, which could block the
    harness, and never a link) of at most ``limit`` bytes. The tensors are parsed
    from these bytes, so nothing the port does to the file afterwards (rewrite,
    truncate) reaches them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ExternalPortError(f"port answered {op!r} but wrote no {path.name}") from None
    except OSError as exc:
        raise ExternalPortError(f"port's {path.name} cannot be opened ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ExternalPortError(f"port's {path.name} is not a regular file")
        if status.st_size > limit:
            raise ExternalPortError(f"port's {path.name} holds {status.st_size} bytes, more than the {limit} expected")
        data = file.read(min(status.st_size, limit) + 1)
    if len(data) > min(status.st_size, limit):
        raise ExternalPortError(f"port's {path.name} changed size while it was read")
    return data


def merge_request(inputs: MergeInputs) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The ``merge`` op's tensors and fields (docs/external-port-protocol.md)."""
    tensors = {
        "prefix_output": inputs.prefix_output,
        "prefix_lse": inputs.prefix_lse,
        "suffix_output": inputs.suffix_output,
        "suffix_lse": inputs.suffix_lse,
    }
    return tensors, {"prefill_tokens_with_context": inputs.prefill_tokens_with_context}


class ExternalPort:
    """The :class:`harness.protocol.port.Port` interface over an external process."""

    # Each request carries its own timeout (it kills the process on expiry).
    enforces_timeout = True
    # Its L3 ops are sent each attention's partials: what they compare is
    # harness.model.levels.LevelSpec.compares_over_protocol (harness.protocol.port.l3_compares).
    over_protocol = True

    def __init__(
        self, command: str, timeout_s: float = DEFAULT_PORT_TIMEOUT_S, startup_timeout_s: float = 30.0
    ) -> None:
        self.command = shlex.split(command)
        if not self.command:
            raise ValueError("cmd: port needs a command")
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = bytearray()
        self._next_id = 0
        self.hello: dict[str, Any] = {}
        self.prefill_layout: Layout | None = None
        self._start()
        self.name = str(self.hello.get("name", Path(self.command[0]).name))
        # The levels the port declares; the harness runs only these for it.
        self.levels = tuple(lv for lv in self.hello.get("levels", ["layout"]) if lv in PROTOCOL_LEVELS)
        atexit.register(self.close)

    # -- process ---------------------------------------------------------------------------------

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExternalPortError(f"cannot start {self.command[0]!r}: {exc.strerror or exc}") from None
        self._buffer = bytearray()
        reply = self._request({"op": "hello", "protocol": PROTOCOL_VERSION}, self.startup_timeout_s)
        if reply.get("protocol", PROTOCOL_VERSION) != PROTOCOL_VERSION:
            raise ExternalPortError(f"port speaks protocol {reply.get('protocol')}, harness {PROTOCOL_VERSION}")
        self.hello = reply

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        # The whole group, even when the port itself already exited: helpers it
        # started must not outlive it.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """Ask the port to exit, then make sure its whole process group is gone."""
        process = self._process
        if process is not None and process.poll() is None:
            try:
                assert process.stdin is not None
                process.stdin.write(b'{"id": -1, "op": "bye"}\n')
                process.stdin.flush()
                process.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - STDERR_TAIL))
        tail = self._stderr.read().decode("utf-8", "replace")
        return " ".join(tail.split())

    # -- requests --------------------------------------------------------------------------------

    def _fail(self, reason: str) -> ExternalPortError:
        tail = self.stderr_tail()
        self._kill()
        return ExternalPortError(reason + (f"; stderr: ...{tail}" if tail else ""))

    def _send(self, data: bytes, deadline: float) -> None:
        """Write one request within the deadline: a port that stops reading its
        input (a request can be megabytes of case JSON) times out like one that
        stops answering, never blocks the harness."""
        assert self._process is not None and self._process.stdin is not None
        fd = self._process.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"port did not read its request within {self.timeout_s:g} s")
            _, writable, _ = select.select([], [fd], [], min(left, 0.2))
            if not writable:
                continue
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError as exc:
                raise self._fail(f"port closed its input ({exc.strerror or exc})") from None

    def _readline(self, deadline: float) -> bytes:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        # Only what arrived since the last look is searched for the line's end:
        # a long reply costs its length, not its length squared.
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"port did not answer within {self.timeout_s:g} s")
            # Wake up now and then: a port's helper processes may hold its stdout
            # open after the port itself died, so EOF alone is not enough.
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            chunk = os.read(fd, 1 << 16) if ready else None
            if chunk:
                self._buffer += chunk
                if len(self._buffer) > MAX_REPLY_BYTES:
                    raise self._fail(f"port's reply runs past {MAX_REPLY_BYTES >> 20} MiB without ending its line")
                continue
            code = self._process.poll()
            if code is None and chunk == b"":
                # Its stdout closed: it is exiting; give it a moment to say how.
                try:
                    code = self._process.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
            if code is None and chunk == b"":
                raise self._fail("port closed its output before answering (it is still running)")
            if code is not None or chunk == b"":
                raise self._fail(f"port exited (code {code}) before answering")
        line, self._buffer = bytes(self._buffer[:end]), self._buffer[end + 1 :]
        return line

    def _request(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            self._kill()
            self._start()
        assert self._process is not None and self._process.stdin is not None
        self._next_id += 1
        message = {"id": self._next_id, **message}
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        try:
            self._send(json.dumps(message).encode() + b"\n", deadline)
            line = self._readline(deadline)
        except ExternalPortError:
            raise
        except BaseException:
            # Interrupted mid-request (a harness time limit, ^C): the reply would
            # arrive out of turn, so this process is done.
            self._kill()
            raise
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise self._fail(f"port printed something that is not JSON: {line[:80]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != message["id"]:
            raise self._fail(f"port replied out of turn: {line[:80]!r}")
        if not reply.get("ok", False):
            # A clean error reply leaves the process usable.
            raise ExternalPortError(f"port error: {reply.get('error', 'no reason given')}", reply)
        return reply

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply, under the port's timeout: what a plug-in
        level's adapter (:attr:`harness.model.levels.LevelSpec.external`) sends."""
        return self._request(message)

    def __getattr__(self, name: str) -> Any:
        # A plug-in level's port methods, over the protocol as the level adapts them
        # (only names this class lacks reach here).
        if not name.startswith("_"):
            for spec in registered_levels():
                adapter = spec.external.get(name)
                if adapter is not None:
                    return functools.partial(adapter, self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- the Port interface ----------------------------------------------------------------------

    def plan_layout(self, case: Case) -> Layout:
        reply = self._request({"op": "layout", "case": case.to_json()})
        # Bounds the case sets on any layout of it, checked before anything the
        # reply describes is built: each chunk holds a context row; over the whole
        # layout token_to_seq names each context row once and the DCP padded rows
        # are at most a rank's share of them plus an interleave per request; twice
        # that, so a wrong but sane layout still reaches the comparison.
        context_rows = sum(case.context_lens)
        padding = len(case.context_lens) * case.cp_kv_cache_interleave_size
        max_rows = 2 * (2 * context_rows + padding + case.workspace_size)
        try:
            return layout_from_json(reply.get("layout"), max_rows=max_rows, max_chunks=context_rows)
        except (ValueError, TypeError) as exc:
            raise ExternalPortError(f"port sent a malformed layout: {exc}") from None

    def workspace_size(self, config: WorkspaceConfig) -> int:
        reply = self._request(
            {
                "op": "workspace_size",
                "config": {
                    "max_model_len": config.max_model_len,
                    "max_num_seqs": config.max_num_seqs,
                    "block_size": config.block_size,
                    "dcp_world_size": config.dcp_world_size,
                    "cp_kv_cache_interleave_size": config.cp_kv_cache_interleave_size,
                },
            }
        )
        size = reply.get("workspace_size")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ExternalPortError(f"port sent workspace_size {size!r}, not an integer")
        return size

    def _tensor_call(self, op: str, tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> dict[str, torch.Tensor]:
        from safetensors.torch import load, save_file

        # A hello may list its ops beside its levels; without, each level is its op.
        supported = self.hello.get("ops", self.hello.get("levels", []))
        if op not in supported:
            raise ExternalPortError(f"port does not support {op!r} (hello lists {supported})")
        with tempfile.TemporaryDirectory(prefix="parity-port-") as folder:
            inputs, outputs = Path(folder) / "inputs.safetensors", Path(folder) / "outputs.safetensors"
            save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(inputs))
            self._request({"op": op, "inputs": str(inputs), "outputs": str(outputs), **extra})
            # No answer of an op is larger than its question by much (the outputs
            # repeat the partials' shapes at most twice over); the limit is fixed
            # before the port runs, from what was sent, not from files it can touch.
            sent = sum(t.nelement() * t.element_size() for t in tensors.values())
            data = read_port_file(outputs, limit=4 * sent + (1 << 20), op=op)
            # The protocol exchanges host files: the process's results go back to
            # the device its inputs came from (the run's), as its own values.
            device = next(iter(tensors.values())).device if tensors else "cpu"
            try:
                return {name: t.to(device) for name, t in load(data).items()}
            except Exception as exc:
                raise ExternalPortError(f"port wrote an unreadable {outputs.name}: {exc}") from None

    # -- the sparse path (SPEC 1d) ---------------------------------------------------------------

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        reply = self._request({"op": "sparse_layout", "case": case.to_json()})
        context_rows = sum(case.context_lens)
        padding = len(case.context_lens) * case.cp_kv_cache_interleave_size
        max_rows = 2 * (2 * context_rows + padding + (1 << 22))
        try:
            return sparse_layout_from_json(reply.get("sparse_layout"), max_rows=max_rows, max_chunks=context_rows)
        except (ValueError, TypeError) as exc:
            raise ExternalPortError(f"port sent a malformed sparse layout: {exc}") from None

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        reply = self._request({"op": "sparse_workspace_size", "config": config.to_json()})
        size = reply.get("workspace_size")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ExternalPortError(f"port sent workspace_size {size!r}, not an integer")
        return size

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        """The ``topk_mask`` op: request ``r``'s indices travel as int32 ``topk.{r}``;
        the port writes ``mask`` (int32 ``[batch, rows, words]``)."""
        tensors = {f"topk.{r}": t for r, t in enumerate(topk)}
        out = self._tensor_call("topk_mask", tensors, {"case": case.to_json()})
        if sorted(out) != ["mask"]:
            raise ExternalPortError(f"port's topk_mask outputs are {sorted(out)}, not ['mask']")
        return out["mask"]

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        """The ``topk_remap`` op: inputs as for ``topk_mask``; the port writes
        ``remapped.{r}`` for every request."""
        tensors = {f"topk.{r}": t for r, t in enumerate(topk)}
        out = self._tensor_call("topk_remap", tensors, {"case": case.to_json()})
        wanted = [f"remapped.{r}" for r in range(len(topk))]
        if sorted(out) != sorted(wanted):
            raise ExternalPortError(f"port's topk_remap outputs are {sorted(out)}, not {wanted}")
        return [out[name] for name in wanted]

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        """Sparse L3 over the protocol: the port's route, layout and per-attention
        selections, run here on the shared kernels, folded by the port
        (:mod:`harness.protocol.external_sparse`)."""
        from harness.protocol.external_sparse import sparse_prefill_over_protocol

        return sparse_prefill_over_protocol(self, case, inputs, kernels)

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._tensor_call("merge", *merge_request(inputs))
        if "output" not in out or "lse" not in out:
            raise ExternalPortError("port's merge outputs lack 'output' or 'lse'")
        return out["output"], out["lse"]

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        """L3 over the protocol: the port's own layout for ``case``, each of its
        chunks' partials and the new-token partial computed here on the shared
        kernels, folded and merged by the port (the ``prefill`` op)."""
        from harness.kernels.context_chunks import planned_chunk_partials
        from harness.kernels.numeric import new_token_partial

        self.prefill_layout = None
        layout = self.plan_layout(case)
        # The layout this request runs on, for its row (checked against the port's L1 answer).
        self.prefill_layout = layout
        try:
            partials = planned_chunk_partials(layout, case, inputs, kernels)
            suffix_output, suffix_lse = new_token_partial(inputs, kernels)
        except ValueError as exc:
            raise ExternalPortError(f"port's layout cannot be run: {exc}") from None
        except Exception as exc:  # the harness's kernels on a runnable layout: its own fault
            raise HarnessFault(f"{type(exc).__name__}: {exc}") from exc
        tensors = {"suffix_output": suffix_output, "suffix_lse": suffix_lse}
        for i, (output, lse) in enumerate(partials):
            tensors[f"chunk_output.{i}"], tensors[f"chunk_lse.{i}"] = output, lse
        returned = self._tensor_call(
            "prefill",
            tensors,
            {"case": case.to_json(), "layout": layout.to_json(), "v_head_dim": inputs.spec.v_head_dim},
        )
        expected = ("context_output", "context_lse", "output", "lse") if layout.chunks else ("output", "lse")
        missing = [name for name in expected if name not in returned]
        if missing:
            raise ExternalPortError(
                f"port's prefill outputs lack {', '.join(missing)} (it wrote {', '.join(sorted(returned))})"
            )
        unexpected = sorted(set(returned) - set(expected))
        if unexpected:
            raise ExternalPortError(
                f"port's prefill outputs hold {', '.join(unexpected)}, not among {', '.join(expected)}"
            )
        return returned
