#!/usr/bin/env bash
# Create .venv and install Tandem into it (editable, with test extras).
#
# llama-cpp-python is built from source for this machine, and the script chooses the backend itself:
#   - Metal on Apple Silicon (uname -s Darwin, uname -m arm64);
#   - CUDA where the CUDA toolkit (nvcc, on PATH or in $CUDA_HOME/bin, default /usr/local/cuda) is
#     found AND an NVIDIA GPU is present (nvidia-smi -L lists one, or /dev/nvidia0 exists); nvcc alone
#     is not enough (build machines often have the toolkit and no GPU, and a CUDA build takes far
#     longer). The build targets the GPU's compute capability when nvidia-smi reports it;
#   - else Vulkan on Linux and Windows where `glslc` (on PATH or in $VULKAN_SDK/bin) and the Vulkan
#     headers (/usr/include/vulkan, or $VULKAN_SDK/include) are found: one build for AMD, Intel and
#     NVIDIA GPUs with nothing but the graphics driver, beside the CPU backend. packaging/vulkan.sh
#     checks the rest (SPIRV-Headers, the loader) and gives the flags: the pinned llama.cpp needs
#     headers >= 1.3.261, and older system headers (Debian 12 has 1.3.239) are replaced by Debian 13's
#     libvulkan-dev, fetched with apt-get download into ~/.cache/tandem/vulkan-headers (nothing
#     installed). Debian: apt-get install glslc libvulkan-dev spirv-headers. When something is
#     missing, the automatic choice is the CPU, with the reason. A machine without a Vulkan driver
#     still runs a Vulkan build, on the CPU;
#   - else the CPU.
# TANDEM_BACKEND=cpu|cuda|metal|vulkan forces a choice. When TANDEM_CMAKE_ARGS itself sets a GPU backend
# (GGML_CUDA, GGML_METAL, GGML_VULKAN, GGML_HIP, GGML_SYCL, ...), no backend is added: its flags decide.
# TANDEM_CMAKE_ARGS is always appended to the flags.
#
# CPU code is built without -march=native: GGML_NATIVE=OFF gives an AVX2/FMA/F16C build, and when
# /proc/cpuinfo lists AVX-512 (F, CD, VL, DQ, BW) its kernels are added (with VBMI, VNNI and BF16 where
# listed). On a CPU with AVX-512 the target's verify batches cost much less (a batch of 16 tokens: about
# 4 decode steps instead of 6.2), which decides speculation on a CPU. AMX is never enabled: some virtual
# machines advertise it and fault on its instructions, and -march=native would turn it on.
# TANDEM_PORTABLE=1 keeps the plain AVX2 build (for a wheel meant for other machines).
#
# The built wheel is kept in a cache folder keyed by version and flags (pip's own wheel cache ignores
# CMAKE_ARGS, so it could hand back a wheel built with other flags).
# TANDEM_DRY_RUN=1 prints the backend, the flags and the wheel folder, and stops before building.
# TANDEM_VENV=<folder> installs into that venv instead of .venv (CI's separate Vulkan venv).
# TANDEM_WHEEL_ONLY=1 builds (or finds) the cached wheel and stops before installing anything.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
user_args="${TANDEM_CMAKE_ARGS:-}"
system=$(uname -s)
machine=$(uname -m)

simd=""
simd_note="AVX2"
if [[ "${TANDEM_PORTABLE:-0}" != 1 && -r /proc/cpuinfo ]]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { [[ "$flags" == *" $1 "* ]]; }
  if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
    simd=" -DGGML_AVX512=ON"
    simd_note="AVX-512"
    has avx512vbmi && simd+=" -DGGML_AVX512_VBMI=ON" && simd_note+=" VBMI"
    has avx512_vnni && simd+=" -DGGML_AVX512_VNNI=ON" && simd_note+=" VNNI"
    has avx512_bf16 && simd+=" -DGGML_AVX512_BF16=ON" && simd_note+=" BF16"
  fi
fi
[[ "$machine" == x86_64 || "$machine" == amd64 ]] || simd_note="$machine"

# --- the CUDA toolkit and the GPU ---------------------------------------------------------------------
find_nvcc() {
  local cuda_bin="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}/bin"
  if command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  elif [[ -x "$cuda_bin/nvcc" ]]; then
    echo "$cuda_bin/nvcc"
  fi
}
nvidia_gpus() {  # one line per GPU ("GPU 0: NVIDIA ... (UUID: ...)"); none when there is no GPU
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep '^GPU ' || true
  fi
}
# --- Vulkan: glslc and the headers (their version is checked later, by vulkan-headers.sh) ---------------
find_glslc() {
  if command -v glslc >/dev/null 2>&1; then
    command -v glslc
  elif [[ -n "${VULKAN_SDK:-}" && -x "$VULKAN_SDK/bin/glslc" ]]; then
    echo "$VULKAN_SDK/bin/glslc"
  fi
}
vulkan_headers_present() {
  [[ -r "${VULKAN_SDK:-/nonexistent}/include/vulkan/vulkan.h" || -r /usr/include/vulkan/vulkan.h ]]
}
vulkan_system=0
case "$system" in Linux | MINGW* | MSYS* | CYGWIN*) vulkan_system=1 ;; esac
nvcc=$(find_nvcc)
gpus=$(nvidia_gpus)
gpu_present=0
if [[ -n "$gpus" || -e /dev/nvidia0 ]]; then gpu_present=1; fi

# --- the backend --------------------------------------------------------------------------------------
backend="${TANDEM_BACKEND:-}"
why=""
if [[ -n "$backend" ]]; then
  why="TANDEM_BACKEND=$backend"
elif [[ "$user_args" =~ GGML_(CUDA|METAL|VULKAN|HIP|SYCL|OPENCL|MUSA|CANN|KOMPUTE)[:=] ]]; then
  backend=custom
  why="TANDEM_CMAKE_ARGS sets GGML_${BASH_REMATCH[1]}"
elif [[ "$system" == Darwin && "$machine" == arm64 ]]; then
  backend=metal
  why="Apple Silicon"
elif [[ -n "$nvcc" && "$gpu_present" == 1 ]]; then
  backend=cuda
  why="CUDA toolkit and an NVIDIA GPU found"
elif [[ "$vulkan_system" == 1 && -n "$(find_glslc)" ]] && vulkan_headers_present; then
  backend=vulkan
  why="glslc and the Vulkan headers found"
  auto_vulkan=1
else
  backend=cpu
  if [[ -n "$nvcc" ]]; then
    why="CUDA toolkit found ($nvcc) but no NVIDIA GPU; TANDEM_BACKEND=cuda forces a CUDA build"
  elif [[ "$gpu_present" == 1 ]]; then
    why="NVIDIA GPU found but no CUDA toolkit (nvcc); install it for a CUDA build"
  else
    why="no GPU backend found"
  fi
fi

gpu_args=""
cuda_env=()
# Vulkan: what the build needs and its flags (packaging/vulkan.sh: headers new enough, fetched where the
# system's are older); an automatic choice that lacks something falls back to the CPU with the reason
vulkan_flags=""
if [[ "$backend" == vulkan ]]; then
  vulkan_rc=0
  vulkan_log=$(mktemp)
  fetch_arg=()
  [[ "${TANDEM_DRY_RUN:-0}" == 1 ]] && fetch_arg=(--no-fetch)  # a dry run downloads nothing
  vulkan_flags=$(bash packaging/vulkan.sh ${fetch_arg[@]+"${fetch_arg[@]}"} 2>"$vulkan_log") || vulkan_rc=$?
  headers_note=$(grep '^vulkan: headers' "$vulkan_log" | tail -1 | sed 's/^vulkan: //' || true)
  problem=$(tail -1 "$vulkan_log" | sed 's/^vulkan: //')
  [[ "${TANDEM_DRY_RUN:-0}" == 1 ]] || cat "$vulkan_log" >&2
  rm -f "$vulkan_log"
  if [[ "$vulkan_rc" == 1 ]]; then
    if [[ "${auto_vulkan:-0}" == 1 ]]; then
      backend=cpu
      why="no Vulkan build: $problem"
    else
      echo "install-dev.sh: TANDEM_BACKEND=vulkan: $problem" >&2
      exit 1
    fi
  fi
fi

case "$backend" in
  cpu)
    what="CPU ($simd_note)"
    [[ "$system" == Darwin ]] && gpu_args="-DGGML_METAL=off"  # llama.cpp turns Metal on by default there
    ;;
  metal)
    [[ "$system" == Darwin ]] || { echo "install-dev.sh: TANDEM_BACKEND=metal needs macOS" >&2; exit 1; }
    what="Metal"
    gpu_args="-DGGML_METAL=on"
    simd=""
    ;;
  cuda)
    [[ -n "$nvcc" ]] || {
      echo "install-dev.sh: TANDEM_BACKEND=cuda: no nvcc on PATH or in ${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}/bin" >&2
      exit 1
    }
    nvcc_version=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -1)
    gpu_args="-DGGML_CUDA=on"
    archs=""
    if [[ -n "$gpus" ]]; then
      # the GPUs' compute capabilities (8.6 -> 86): a build for this machine, much shorter than all
      archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' |
        grep -E '^[0-9]+$' | sort -u | tr '\n' ';' || true)
      archs="${archs%;}"
    fi
    [[ -n "$archs" && "$user_args" != *CMAKE_CUDA_ARCHITECTURES* ]] && gpu_args+=" -DCMAKE_CUDA_ARCHITECTURES=$archs"
    first_gpu=$(printf '%s\n' "$gpus" | head -1 | sed -e 's/^GPU [0-9]*: //' -e 's/ (UUID.*//')
    what="CUDA (nvcc ${nvcc_version:-?} at $nvcc; GPU: ${first_gpu:-none found}${archs:+, architectures $archs})"
    cuda_env=(CUDACXX="$nvcc")
    ;;
  vulkan)
    [[ "$vulkan_system" == 1 ]] || { echo "install-dev.sh: TANDEM_BACKEND=vulkan needs Linux or Windows" >&2; exit 1; }
    gpu_args="$vulkan_flags"
    what="Vulkan (${headers_note:-headers ?}) and CPU ($simd_note)"
    ;;
  custom)
    what="the backend TANDEM_CMAKE_ARGS sets"
    ;;
  *)
    echo "install-dev.sh: TANDEM_BACKEND must be cpu, cuda or metal, or vulkan on Linux and Windows (not '$backend')" >&2
    exit 1
    ;;
esac

# CPU only and no TANDEM_CMAKE_ARGS gives "-DGGML_NATIVE=OFF<simd> ", as before (the cache key stays)
extra="$gpu_args"
[[ -n "$user_args" ]] && extra="${extra:+$extra }$user_args"
cmake_args="-DGGML_NATIVE=OFF$simd $extra"
key=$(printf '%s %s %s' "$LLAMA_VERSION" "$cmake_args" "$(uname -sm)" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels/$key"
python=${PYTHON:-python3}

if [[ "${TANDEM_DRY_RUN:-0}" == 1 ]]; then
  echo "backend: $backend ($why)"
  echo "llama-cpp-python $LLAMA_VERSION for $what"
  echo "CMAKE_ARGS: $cmake_args"
  echo "wheels: $wheels"
  exit 0
fi

venv="${TANDEM_VENV:-.venv}"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
if ! compgen -G "$wheels/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; then
  minutes="about 10 minutes on 2 cores"
  [[ "$backend" == cuda ]] && minutes="CUDA kernels take much longer than the CPU build"
  [[ "$backend" == vulkan ]] && minutes="about 25 minutes on 2 cores: the shaders are compiled too"
  echo "building llama-cpp-python $LLAMA_VERSION for $what; $why" >&2
  echo "  CMAKE_ARGS: $cmake_args ($minutes)" >&2
  mkdir -p "$wheels"
  env ${cuda_env[@]+"${cuda_env[@]}"} CMAKE_ARGS="$cmake_args" "$venv/bin/python" -m pip wheel -q \
    --disable-pip-version-check --no-deps --no-cache-dir -w "$wheels" "llama-cpp-python==$LLAMA_VERSION"
else
  echo "llama-cpp-python $LLAMA_VERSION for $what: cached wheel in $wheels" >&2
fi
if [[ "${TANDEM_WHEEL_ONLY:-0}" == 1 ]]; then
  echo "wheel: $(ls "$wheels"/llama_cpp_python-$LLAMA_VERSION-*.whl)" >&2
  exit 0
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --find-links "$wheels" \
  "llama-cpp-python==$LLAMA_VERSION" -e ".[test]"
echo "installed: $venv/bin/tandem (llama.cpp for $what)" >&2
