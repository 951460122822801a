#!/usr/bin/env bash
# Create .venv and install Tandem into it (editable, with test extras).
#
# llama-cpp-python is built from source with portable CPU flags: GGML_NATIVE=OFF gives an AVX2/FMA/F16C
# build without AVX-512 or AMX. A native build (-march=native) can crash with "Illegal instruction"
# on other machines, and on some virtual machines that advertise AMX without supporting it.
# Extra flags for a GPU build go in TANDEM_CMAKE_ARGS, e.g. "-DGGML_CUDA=on" or "-DGGML_METAL=on".
# The built wheel is kept in a cache folder keyed by version and flags (pip's own wheel cache
# ignores CMAKE_ARGS, so it could hand back a wheel built with other flags).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
cmake_args="-DGGML_NATIVE=OFF ${TANDEM_CMAKE_ARGS:-}"
key=$(printf '%s %s %s' "$LLAMA_VERSION" "$cmake_args" "$(uname -sm)" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels/$key"
python=${PYTHON:-python3}

[[ -x .venv/bin/python ]] || "$python" -m venv .venv
if ! compgen -G "$wheels/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; then
  echo "building llama-cpp-python $LLAMA_VERSION ($cmake_args); about 10 minutes on 2 cores" >&2
  mkdir -p "$wheels"
  CMAKE_ARGS="$cmake_args" .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps \
    --no-cache-dir -w "$wheels" "llama-cpp-python==$LLAMA_VERSION"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --find-links "$wheels" \
  "llama-cpp-python==$LLAMA_VERSION" -e ".[test]"
echo "installed: .venv/bin/tandem" >&2
