"""tox's install command: pip install, then drop the CUDA media wheels.

vllm 0.28.0 pulls CUDA builds of torchvision, torchaudio and torchcodec that
break ``import vllm`` next to the CPU torch 2.13.0 ("operator torchvision::nms
does not exist", SPEC section 2). The oracle uses none of them, so every install
into the environment is followed by their removal. Running here rather than in
``commands_pre`` keeps it out of every run: it happens only when tox installs.
"""

from __future__ import annotations

import subprocess
import sys

BREAKS_VLLM_ON_CPU = ("torchvision", "torchaudio", "torchcodec")


def main(argv: list[str]) -> int:
    subprocess.run([sys.executable, "-m", "pip", "install", *argv], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-q", "-y", *BREAKS_VLLM_ON_CPU],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
