"""Builds ``.gpu/``: what the lent H200 needs to import the pinned oracle.

The device has torch and Triton but no vLLM, and vLLM's compiled extension
cannot load there (SPEC section 2). This carries vLLM 0.28.0's Python sources
(from the pinned wheel, no compiled objects) zipped, and the wheels of the few
packages ``mla_attention`` imports that the device image lacks, for Python 3.12.
Nothing here is committed: ``.gpu/`` is git-ignored and rebuilt on demand.

    python tools/build_gpu_bundle.py        # then carry .gpu in the device call
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu"
# Found by importing mla_attention with the device image's packages only: these
# were missing (with their own dependencies), at the versions vllm 0.28.0 resolves.
WHEELS = (
    "pyzmq==27.3.0",
    "cbor2==6.3.0",
    "openai==3.57.0",
    "openai-harmony==0.0.8",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "truststore==0.10.5",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64")


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def main() -> None:
    wheels = BUNDLE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    download = BUNDLE / "download"
    pip("download", "-q", "--no-deps", "vllm==0.28.0", "-d", str(download))
    wheel = next(download.glob("vllm-0.28.0-*.whl"))
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(BUNDLE / "vllm-src.zip", "w", zipfile.ZIP_DEFLATED) as out:
        for name in source.namelist():
            # The dist-info too: vLLM reads its own version through importlib.metadata.
            if name.startswith(("vllm/", "vllm-0.28.0.dist-info/")) and not name.endswith((".so", ".cubin", ".fatbin")):
                out.writestr(name, source.read(name))
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for requirement in WHEELS:
        pip(
            "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *platform_args, "-d", str(wheels), requirement,
        )  # fmt: skip
    size = sum(f.stat().st_size for f in BUNDLE.rglob("*") if f.is_file() and download not in f.parents)
    print(f"{BUNDLE}: vllm-src.zip and {len(list(wheels.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB to carry")


if __name__ == "__main__":
    main()
