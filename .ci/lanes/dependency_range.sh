#!/usr/bin/env bash
# Lane "dependency_range": the declared ranges of pyproject.toml's `dependencies` are the tested ones.
# Two throwaway venvs, each with the plugin (--no-deps) and only its declared dependencies: "lower"
# on the oldest Python the package supports with every dependency at the lower end of its range
# (`name>=X` installed as `name==X`), "upper" on the newest Python with pip's newest inside each
# range. `pip check` must find every requirement met; then the tests that exercise those
# dependencies: the loader against OmegaConf.load and Hydra's own override code, on every NeMo-RL
# recipe where the snapshots are given (tests/config), the supported-version checks (packaging),
# `check` on the examples. About two minutes a venv on two shared cores (issue #40, item 7).
set -euo pipefail
cd "$(dirname "$0")/../.."
lane_start=$SECONDS
: "${ATTN_ALIGN_CI_VENVS:=$PWD/.ci-venvs}"
# shellcheck source=../python.sh
source .ci/python.sh
newest="$(find_python 3.13)"
# Each dependency as declared, then pinned to its lower end (read with the newest Python's tomllib).
mapfile -t declared < <("$newest" -c 'import tomllib; [print(d) for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]]')
mapfile -t lowest < <(printf '%s\n' "${declared[@]}" | sed -E 's/^([A-Za-z0-9_.-]+)>=([^,;]+).*$/\1==\2/')
# (test_nemo_rl_config_equivalence needs NeMo-RL installed: lane nemo_rl compares with it)
tests=(tests/config --ignore=tests/config/test_nemo_rl_config_equivalence.py tests/hosts/test_versions.py
  tests/test_cli_examples.py)

run_end() {
  local name="$1" python="$2"
  shift 2
  local venv="$ATTN_ALIGN_CI_VENVS/dependency_range_$name"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-deps "$(plugin_source)"
  "$venv/bin/python" -m pip install -q "$@" "pytest>=8" "hypothesis>=6.100"
  "$venv/bin/python" -m pip check
  echo "dependency_range lane: $name end, $("$venv/bin/python" -V): $("$venv/bin/python" -m pip list 2>/dev/null |
    awk 'tolower($1) ~ /^(omegaconf|hydra-core|packaging|pyyaml)$/ {printf "%s %s; ", $1, $2}')"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"
}

run_end lower "$(find_python 3.10)" "${lowest[@]}"
run_end upper "$newest" "${declared[@]}"
echo "dependency_range lane: $((SECONDS - lane_start))s"
