#!/usr/bin/env bash
# Every GPU-node check in one call: the `pytest -m mcore` suite (plus the vLLM engine tests) and the
# attention backend benchmark. Sized for one H200: about 4-6 minutes, hard-capped below 10.
#
#   tests/gpu/run_gpu_checks.sh [OUT_DIR]        # default: $OUT when set, else ./gpu-results
#
# Writes to OUT_DIR: environment.txt (GPU, driver, library versions), mcore-pytest.log,
# mcore-junit.xml (with te_selected / bound ratios as test properties), cases/<test>/ (every
# subprocess case's spec, result and log), attention_backends.json, benchmark.log, summary.txt.
# Exit status: the suite's when it failed, else the benchmark's (2: no CUDA / TE on this machine).
set -u
OUT_DIR="${1:-${OUT:-gpu-results}}"
mkdir -p "$OUT_DIR" && OUT_DIR="$(cd "$OUT_DIR" && pwd)" || exit 2
cd "$(dirname "$0")/../.." || exit 2

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
  python - <<'EOF'
import importlib.metadata as md
import sys
print("python", sys.version.split()[0])
for name in ("torch", "transformer-engine", "transformer_engine_torch", "flash-attn", "flash-attn-3", "megatron-core",
             "vllm", "transformers", "nemo-rl-attn-align"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
EOF
} > "$OUT_DIR/environment.txt" 2>&1

# vLLM finds the plugin through its installed entry point: install this checkout when it is not
# there (editable, no dependencies, no build isolation: nothing is downloaded). GPU_CHECKS_NO_INSTALL=1 skips it.
if [ -z "${GPU_CHECKS_NO_INSTALL:-}" ] && ! python -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'nemo_rl_attn_align' for e in m.entry_points(group='vllm.general_plugins')))"; then
  python -m pip install --no-deps --no-build-isolation -e . >> "$OUT_DIR/environment.txt" 2>&1 \
    || echo "pip install -e . failed: the vLLM tests will use the .pth bootstrap only" >> "$OUT_DIR/environment.txt"
fi

export NEMO_RL_ATTN_ALIGN_GPU_ARTIFACTS="$OUT_DIR"
timeout 420 python -m pytest -m "mcore or vllm_gpu" tests/gpu tests/hosts/test_vllm_worker.py -v -rA \
  --junitxml "$OUT_DIR/mcore-junit.xml" 2>&1 | tee "$OUT_DIR/mcore-pytest.log"
suite=${PIPESTATUS[0]}

timeout 120 python benchmarks/attention_backends.py --out "$OUT_DIR/attention_backends.json" 2>&1 | tee "$OUT_DIR/benchmark.log"
bench=${PIPESTATUS[0]}

echo "mcore suite exit $suite, benchmark exit $bench" | tee "$OUT_DIR/summary.txt"
if [ "$suite" -ne 0 ]; then exit "$suite"; fi
exit "$bench"
