#!/usr/bin/env bash
# Lane "te": Transformer Engine's real Python (its backend selector, DotProductAttention, the CP
# code) beside real megatron-core 0.16.1, on declared GPUs (tests/real_te, marker real_te).
# TE's wheels hold only Python; tests/real_te/stand_ins.py replaces the compiled core
# (transformer_engine_torch, the shared-library load) and declares the device facts (compute
# capability, cuDNN version, flash-attn packages). Two TE versions: 2.20.2 in the venv, and
# 2.14.1 (NeMo-RL main's pin) installed with --target and put first on PYTHONPATH by the table
# test. Own venv under $ATTN_ALIGN_CI_VENVS/te (Python 3.11: pip takes the local torch 2.13.0 CPU
# wheel), the plugin installed non-editable. .ci/run sets ATTN_ALIGN_TEST_REQUIRE_REAL=1: a skip fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
# shellcheck source=../python.sh
source .ci/python.sh
python311="$(find_python 3.11)"  # $ATTN_ALIGN_CI_PYTHON311, else found by name
venv="${ATTN_ALIGN_CI_VENVS:?set by .ci/run}/te"
[ -x "$venv/bin/python" ] || "$python311" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q)
"${pip[@]}" torch==2.13.0
# What TE's Python imports (its own requirements name the CUDA core packages, hence --no-deps below).
# transformers: the shipped examples' models are config.json files made with its config classes (tests/example_models.py).
"${pip[@]}" megatron-core==0.16.1 pytest==9.2.0 hypothesis==6.170.17 einops==0.8.2 pydantic==2.14.4 \
  onnx==1.23.2 onnxscript==0.7.2 triton==3.9.0 packaging transformers==5.8.1
"${pip[@]}" --no-deps transformer-engine==2.20.2
te214="$venv/te-2.14.1"
[ -d "$te214/transformer_engine" ] || "${pip[@]}" --no-deps --target "$te214" transformer-engine==2.14.1
"${pip[@]}" "$(plugin_source)"
echo "te lane: installs took $((SECONDS - started))s"
ATTN_ALIGN_TEST_TE_PATHS="$te214" "$venv/bin/python" -m pytest -q -p no:cacheprovider -m real_te tests/real_te
echo "te lane: $((SECONDS - started))s"
