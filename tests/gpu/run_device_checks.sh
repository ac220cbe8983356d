#!/usr/bin/env bash
# The device checks for the GPU machine this workplace lends (one H200; Python 3.12, torch with
# CUDA, Triton; no TE, flash-attn or vLLM). One call, hard-capped at 9 minutes:
#
#   tests/gpu/run_device_checks.sh OUT       # writes OUT/device-checks.json, OUT/environment.txt, OUT/log.txt
#
# A megatron-core wheel that travelled with the tree (ATTN_ALIGN_DEVICE_WHEELS, default
# .device-wheels/) is installed --no-deps into a temporary folder first; without it that section is
# recorded as an import error. Exit: 0 all equalities held, 1 one failed, 2 unusable arguments.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: tests/gpu/run_device_checks.sh OUT" >&2
  exit 2
fi
mkdir -p "$1"
OUT_DIR="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 || echo "no nvidia-smi"
  python -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$OUT_DIR/environment.txt" 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
wheels="${ATTN_ALIGN_DEVICE_WHEELS:-.device-wheels}"
if ! python -c "import megatron.core" 2>/dev/null && compgen -G "$wheels/megatron_core-*.whl" > /dev/null; then
  site="$(mktemp -d)"
  python -m pip install -q --no-deps --target "$site" "$wheels"/megatron_core-*.whl >> "$OUT_DIR/log.txt" 2>&1 \
    && export PYTHONPATH="$PYTHONPATH:$site"
fi
timeout 540 python -m tests.gpu.device_checks "$OUT_DIR" 2>&1 | tee -a "$OUT_DIR/log.txt"
