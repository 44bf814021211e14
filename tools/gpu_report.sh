#!/usr/bin/env bash
# The GPU report on a machine with a CUDA GPU: <out>/<date>.md and .json
# (default out: reports/gpu). Where the pinned vLLM is not importable (the lent
# H200), the bundle that tools/build_gpu_bundle.py builds into .gpu/ (carried
# there) is unpacked into a scratch site-packages first.
#
#   tools/gpu_report.sh [OUT_DIR] [benchmarks.gpu_report options]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-reports/gpu}"
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
    if [ ! -f .gpu/vllm-src.zip ]; then
        echo "gpu_report: vllm is not importable and .gpu/ is missing (run python tools/build_gpu_bundle.py)" >&2
        exit 2
    fi
    site="${TMPDIR:-/tmp}/parity-gpu-site"
    mkdir -p "$site"
    python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$site" .gpu/wheels/*.whl
    python3 -m zipfile -e .gpu/vllm-src.zip "$site"
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec python3 -m benchmarks.gpu_report --out "$out" "${@:2}"
