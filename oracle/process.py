"""Any released vLLM as the oracle: its own environment, served as a subprocess.

``--oracle vllm==X`` names a release. The pinned one (``oracle/pin.json``) is
called in-process, as always; any other runs ``python -m oracle.serve`` inside
its tox environment ``.tox/vllm-X`` (tox.ini, ``requirements/vllm-X.txt``),
built on first use with ``tox -e vllm-X --notest`` and reused after. The
process speaks the external-port protocol, so :class:`OracleProcess` is an
:class:`harness.protocol.external.ExternalPort` whose errors are the oracle's: an item
the release refuses (or cannot run) is ``oracle-error`` with its reason.

Each release has its own pin (``oracle/pins/vllm-X.json``: the fingerprints of
the symbols its side executes); the process checks them when it starts and the
harness refuses drift exactly as it does for the pinned release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.model import Case, Layout, WorkspaceConfig
from harness.model.sparse import SparseCase, SparseLayout, SparseWorkspaceConfig, TopkMaskCase
from harness.protocol.errors import ExternalPortError
from harness.protocol.external import ExternalPort, merge_request

if TYPE_CHECKING:
    # The tensor ops' types: a release asked for layouts alone never loads torch here.
    import torch

    from harness.kernels import SharedKernels
    from harness.kernels.numeric import MergeInputs, PrefillInputs
    from harness.kernels.sparse_prefill import SparsePrefillInputs

ROOT = Path(__file__).resolve().parent.parent
RELEASE_SPEC = re.compile(r"vllm==(\d+\.\d+\.\d+)")
# Importing vLLM and checking its pin takes seconds; an L3 item of the ci suite
# under Triton's interpreter takes up to about a minute.
STARTUP_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 1800.0


class OracleSpecError(ValueError):
    """A ``--oracle`` value that names no release the harness can serve (one line)."""


def parse_release(spec: str) -> str:
    """``vllm==X.Y.Z`` -> ``X.Y.Z``."""
    match = RELEASE_SPEC.fullmatch(spec.strip())
    if match is None:
        raise OracleSpecError(f"--oracle {spec!r}: expected vllm==X.Y.Z (for example vllm==0.27.1)")
    return match.group(1)


def requirements_file(release: str) -> Path:
    return ROOT / "requirements" / f"vllm-{release}.txt"


def known_releases() -> list[str]:
    """Every release with a requirements file here, oldest first."""
    found = [p.stem.removeprefix("vllm-") for p in (ROOT / "requirements").glob("vllm-*.txt")]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def environment_python(release: str) -> Path:
    return ROOT / ".tox" / f"vllm-{release}" / "bin" / "python"


def _tox_command() -> list[str]:
    """tox from this environment, else the python3 that has it (make's bootstrap)."""
    if shutil.which("tox"):
        return ["tox"]
    for python in (sys.executable, shutil.which("python3") or "python3"):
        probe = subprocess.run([python, "-m", "tox", "--version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [python, "-m", "tox"]
    raise OracleSpecError("tox is not installed (pip install 'tox>=4.10', or run make once)")


def ensure_environment(release: str) -> Path:
    """The python of ``release``'s environment, building it first if needed."""
    python = environment_python(release)
    if python.is_file():
        return python
    if not requirements_file(release).is_file():
        known = ", ".join(f"vllm=={v}" for v in known_releases())
        raise OracleSpecError(
            f"--oracle vllm=={release}: no requirements/vllm-{release}.txt (releases set up here: {known}); "
            "add one and list the release in tox.ini's [testenv:vllm-{...}]"
        )
    print(f"parity: building the vllm=={release} oracle environment (tox -e vllm-{release}) ...", file=sys.stderr)
    build = subprocess.run(
        [*_tox_command(), "-e", f"vllm-{release}", "--notest"],
        cwd=ROOT,
        stdout=sys.stderr,
        check=False,
    )
    if build.returncode != 0 or not python.is_file():
        raise OracleSpecError(f"--oracle vllm=={release}: tox -e vllm-{release} failed (exit {build.returncode})")
    return python


def _stored(tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """``tensor``'s whole storage, flat, and the view that recovers it from that."""
    import torch

    size = tensor.untyped_storage().nbytes() // tensor.element_size()
    flat = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    flat.set_(tensor.untyped_storage(), 0, (size,), (1,))
    view = {"shape": list(tensor.shape), "stride": list(tensor.stride()), "offset": tensor.storage_offset()}
    return flat.cpu(), view


class OracleProcessError(RuntimeError):
    """The release's process failed an item (or failed to start); one line."""


class OracleRefusal(RuntimeError):
    """The release refuses the item: a batch it cannot plan or run, in its own
    words (one line, ``vllm==X: <its reason>``). The only oracle error a
    baseline may expect (harness/verdicts/baseline.py)."""


class OracleProcess(ExternalPort):
    """One release's oracle in its own environment (the Port interface)."""

    def __init__(self, release: str, python: Path) -> None:
        self.release = release
        env_command = f"{python} -m oracle.serve"
        super().__init__(env_command, timeout_s=REQUEST_TIMEOUT_S, startup_timeout_s=STARTUP_TIMEOUT_S)
        self.name = f"oracle vllm=={release}"

    def _start(self) -> None:
        # The serving environment is the release's own: nothing of this
        # process's interpreter settings (a virtualenv, PYTHONPATH) reaches it.
        saved = {k: os.environ.pop(k) for k in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") if k in os.environ}
        first = dict(self.hello)
        try:
            super()._start()
        except ExternalPortError as exc:
            raise OracleProcessError(f"the vllm=={self.release} oracle did not start: {exc}") from None
        finally:
            os.environ.update(saved)
        # A process restarted after a failure must be the one the run was judged
        # to have: the same release and the same fingerprint statuses.
        identity = ("installed_vllm", "installed_commit_id", "pin", "fingerprints")
        if first and any(self.hello.get(k) != first.get(k) for k in identity):
            self._kill()
            raise OracleProcessError(f"the vllm=={self.release} oracle restarted as another release or pin")

    def _call(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except ExternalPortError as exc:
            if exc.reply.get("refusal") is True:
                raise OracleRefusal(f"vllm=={self.release}: {exc.reply.get('error')}") from None
            reason = str(exc).removeprefix("port error: ")
            raise OracleProcessError(f"vllm=={self.release}: {reason}") from None

    def plan_layout(self, case: Case) -> Layout:
        return self._call(super().plan_layout, case)  # type: ignore[no-any-return]

    def workspace_size(self, config: WorkspaceConfig) -> int:
        return self._call(super().workspace_size, config)  # type: ignore[no-any-return]

    def plan_sparse(self, case: SparseCase) -> SparseLayout:
        return self._call(super().plan_sparse, case)  # type: ignore[no-any-return]

    def sparse_workspace_size(self, config: SparseWorkspaceConfig) -> int:
        return self._call(super().sparse_workspace_size, config)  # type: ignore[no-any-return]

    def build_topk_mask(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> torch.Tensor:
        return self._call(super().build_topk_mask, case, topk)  # type: ignore[no-any-return]

    def remap_topk(self, case: TopkMaskCase, topk: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._call(super().remap_topk, case, topk)  # type: ignore[no-any-return]

    def _viewed_call(self, op: str, tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> dict[str, torch.Tensor]:
        stored, views = {}, {}
        for name, tensor in tensors.items():
            stored[name], views[name] = _stored(tensor)
        device = next(iter(tensors.values())).device
        out = self._call(self._tensor_call, op, stored, {"views": views, **extra})
        return {name: t.to(device) for name, t in out.items()}

    def merge_states(self, inputs: MergeInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._viewed_call("merge", *merge_request(inputs))
        if sorted(out) != ["lse", "output"]:
            raise OracleProcessError(f"vllm=={self.release}: its merge returned {', '.join(sorted(out)) or 'nothing'}")
        return out["output"], out["lse"]

    def prefill(self, case: Case, inputs: PrefillInputs, kernels: SharedKernels) -> dict[str, torch.Tensor]:
        return self._prefill_call("oracle_prefill", case, inputs, kernels, {})

    def sparse_prefill(
        self, case: SparseCase, inputs: SparsePrefillInputs, kernels: SharedKernels
    ) -> dict[str, torch.Tensor]:
        return self._prefill_call("oracle_sparse_prefill", case, inputs.prefill, kernels, {"topk": inputs.topk})

    def _prefill_call(
        self,
        op: str,
        case: Case | SparseCase,
        inputs: PrefillInputs,
        kernels: SharedKernels,
        extra: dict[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        if getattr(kernels, "name", None) != "cpu":
            raise OracleProcessError(f"vllm=={self.release}: the oracle's process runs the shared kernels on cpu only")
        names = ("kv_cache", "block_table", "q", "new_kv_c", "new_k_pe", "kv_b_weight", "query_start_loc")
        scalars = {
            "max_query_len": inputs.max_query_len,
            "scale": inputs.scale,
            "poison_block": inputs.poison_block,
            "keyless_rows": getattr(kernels, "keyless_rows", "neg-inf"),
            # Under DCP the cache sent is this rank's; the process rebuilds every
            # rank's (harness.levels.prefill.rank_caches) and checks this one against it.
            "dcp_rank": inputs.dcp.rank if inputs.dcp is not None else 0,
        }
        assert case.numeric is not None
        out = self._viewed_call(
            op,
            {name: getattr(inputs, name) for name in names} | extra,
            {"case": case.to_json(), "spec": inputs.spec.to_json(), "scalars": scalars},
        )
        # The tensors an oracle's L3 owes: the comparison covers what came back,
        # so nothing missing may pass as nothing compared.
        owed = ("context_output", "context_lse", "output", "lse") if any(case.context_lens) else ("output", "lse")
        if sorted(out) != sorted(owed):
            raise OracleProcessError(
                f"vllm=={self.release}: its prefill returned {', '.join(sorted(out)) or 'nothing'}, "
                f"not {', '.join(owed)}"
            )
        return out


def open_oracle_process(release: str) -> tuple[OracleProcess, dict[str, Any]]:
    """The release's oracle process (its environment built if missing) and its
    hello: ``installed_vllm``, ``pin`` (null without a pin file) and the
    ``fingerprints`` statuses."""
    try:
        process = OracleProcess(release, ensure_environment(release))
    except ExternalPortError as exc:
        raise OracleProcessError(f"the vllm=={release} oracle did not start: {exc}") from None
    if process.hello.get("installed_vllm") != release:
        process.close()
        raise OracleProcessError(
            f"the vllm-{release} environment holds vllm {process.hello.get('installed_vllm')}, not {release}"
        )
    return process, process.hello
