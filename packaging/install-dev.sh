#!/usr/bin/env bash
# Create .venv and install Tandem into it (editable, with test extras).
#
# llama-cpp-python is built from source for this machine's CPU, without -march=native: GGML_NATIVE=OFF
# gives an AVX2/FMA/F16C build, and when /proc/cpuinfo lists AVX-512 (F, CD, VL, DQ, BW) its kernels are
# added (with VBMI, VNNI and BF16 where listed). On a CPU with AVX-512 the target's verify batches cost
# much less (a batch of 16 tokens: about 4 decode steps instead of 6.2), which decides speculation
# on a CPU. AMX is never enabled: some virtual machines advertise it and fault on its instructions,
# and -march=native would turn it on. TANDEM_PORTABLE=1 keeps the plain AVX2 build (for a wheel meant
# for other machines).
# Extra flags for a GPU build go in TANDEM_CMAKE_ARGS, e.g. "-DGGML_CUDA=on" or "-DGGML_METAL=on".
# The built wheel is kept in a cache folder keyed by version and flags (pip's own wheel cache
# ignores CMAKE_ARGS, so it could hand back a wheel built with other flags).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
simd=""
if [[ "${TANDEM_PORTABLE:-0}" != 1 && -r /proc/cpuinfo ]]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { [[ "$flags" == *" $1 "* ]]; }
  if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
    simd=" -DGGML_AVX512=ON"
    has avx512vbmi && simd+=" -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && simd+=" -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && simd+=" -DGGML_AVX512_BF16=ON"
  fi
fi
cmake_args="-DGGML_NATIVE=OFF$simd ${TANDEM_CMAKE_ARGS:-}"
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
