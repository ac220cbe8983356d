# Sourced by .ci/lanes/*.sh (not a lane itself: .ci/run runs only .ci/lanes/*.sh).
# `find_python 3.13` prints a Python 3.13 interpreter: $ATTN_ALIGN_CI_PYTHON313 when set (one
# variable per version, ATTN_ALIGN_CI_PYTHON3XX), else the first candidate that runs as that version:
# python3.13 on PATH, each pyenv version 3.13.* (`pyenv prefix`), `uv python find 3.13`.
# A pyenv shim on PATH for a version that is not selected exists but does not run, hence the probe.
find_python() {
  local version="$1" var="ATTN_ALIGN_CI_PYTHON${1//./}" candidate found
  if [ -n "${!var:-}" ]; then
    echo "${!var}"
    return 0
  fi
  local candidates=("python$version")
  if command -v pyenv >/dev/null 2>&1; then
    for found in $(pyenv versions --bare 2>/dev/null | grep -E "^${version//./\\.}(\\.[0-9]+)?$" || true); do
      candidates+=("$(pyenv prefix "$found")/bin/python")
    done
  fi
  if command -v uv >/dev/null 2>&1; then
    candidates+=("$(uv python find "$version" 2>/dev/null || true)")
  fi
  for candidate in "${candidates[@]}"; do
    if [ -n "$candidate" ] && "$candidate" -c \
      "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$version')" >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  echo "no Python $version found: set $var to one" >&2
  return 1
}

# `plugin_source` prints what a lane installs the plugin from: the wheel .ci/run built once for all
# lanes ($ATTN_ALIGN_CI_PLUGIN_WHEEL; lanes run side by side, and builds from one checkout would share
# its build/ folder), else the checkout itself (a lane run on its own).
plugin_source() {
  echo "${ATTN_ALIGN_CI_PLUGIN_WHEEL:-.}"
}
