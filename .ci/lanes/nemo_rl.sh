#!/usr/bin/env bash
# Lane "nemo_rl": the plugin against the real NeMo-RL sources (tests/real_nemo_rl, marker real_nemo_rl).
# Python 3.13 (NeMo-RL main builds for it; megatron-core 0.19.x needs it), a venv of its own under
# $ATTN_ALIGN_CI_VENVS/nemo_rl, pinned packages from PyPI, the plugin installed non-editable.
# Stand-ins (tests/real_nemo_rl/stand_ins) replace only Transformer Engine and three names
# megatron-core 0.19.2 lacks. Prints NeMo-RL's own seam tests as "plugin on: N = plugin off: N".
set -euo pipefail
cd "$(dirname "$0")/../.."
lane_start=$SECONDS
: "${ATTN_ALIGN_CI_VENVS:=$PWD/.ci-venvs}"
: "${ATTN_ALIGN_TEST_NEMO_RL_SNAPSHOTS:?set it to the NeMo-RL snapshots folder (.ci/run does when CI laid the snapshots beside the clone)}"
# shellcheck source=../python.sh
source .ci/python.sh
python313="$(find_python 3.13)"  # $ATTN_ALIGN_CI_PYTHON313, else found by name

venv="$ATTN_ALIGN_CI_VENVS/nemo_rl"
pip=("$venv/bin/python" -m pip install -q)
# The probe's training venv (nemo_rl_attn_align/probe/envs.py holds its pins: `probe --make-envs`
# builds the same; torch is a CUDA wheel, it imports and runs on CPU), with what NeMo-RL's Megatron
# modules and the tests import on CPU resolved together with it.
PYTHONPATH="$PWD" "$python313" -m nemo_rl_attn_align.probe.envs training "$venv" --python "$python313" --with \
  "ray[default]==2.60.0" hydra-core==1.3.8 pydantic==2.14.4 pytest==9.2.0 \
  datasets==5.2.0 matplotlib==3.11.2 ipython==9.18.1 tensorboard==2.21.0 \
  megatron-energon==7.4.1 nvidia-modelopt==0.47.0 pyzmq==27.3.0 uvicorn==0.54.0 fastapi==0.165.0 \
  mlflow==3.17.2 swanlab==0.10.3 wandb==0.31.0 prometheus_client==0.26.0 tensordict==0.15.3 \
  torchdata==0.11.0 soundfile==0.14.0
# decord for NeMo-RL v0.6.0 (its wheel's requirements are not needed here).
"${pip[@]}" --no-deps decord==0.6.0
"${pip[@]}" --no-deps "$(plugin_source)"
echo "lane nemo_rl: venv ready in $((SECONDS - lane_start))s"

ATTN_ALIGN_TEST_LANE=nemo_rl "$venv/bin/python" -m pytest -q -p no:cacheprovider -m real_nemo_rl tests/real_nemo_rl tests/upstream_bugs
echo "lane nemo_rl: $((SECONDS - lane_start))s"
