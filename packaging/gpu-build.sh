#!/usr/bin/env bash
# On the lent GPU machine (no network): build the carried llama-cpp-python sources (packaging/gpu-carry.sh)
# for its GPU and install them, with the carried wheels, into a scratch folder to put on PYTHONPATH.
#
#     bash packaging/gpu-build.sh [CARRY_DIR] [SITE_DIR]    # defaults: build/gpu-carry, /tmp/tandem-site
#
# CMake and ninja drive llama-cpp-python's own CMakeLists (the one scikit-build-core drives for a pip
# install), so nothing is fetched and no build isolation is needed; `cmake --install` puts the shared
# libraries into SITE_DIR/llama_cpp/lib, beside the package's Python files, as a wheel holds them; then
# `source SITE_DIR/env.sh` puts the package and the CUDA libraries it links on the paths.
# TANDEM_GPU_CMAKE_ARGS: the backend's flags (default CUDA for the GPU's compute capability from
# nvidia-smi, else 90: -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); TANDEM_GPU_JOBS: parallel jobs
# (default: every core). Prints the seconds each part took.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
carry=${1:-$here/build/gpu-carry}
site=${2:-/tmp/tandem-site}
jobs=${TANDEM_GPU_JOBS:-$(nproc)}
src=$(mktemp -d /tmp/llama-cpp-src.XXXXXX)
t0=$(date +%s)

tar -xzf "$carry"/llama-cpp-python-*-src.tar.gz -C "$src" --strip-components=1

arch=${TANDEM_GPU_ARCH:-}
if [[ -z "$arch" ]] && command -v nvidia-smi >/dev/null; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
fi
arch=${arch:-90}
cmake_args=${TANDEM_GPU_CMAKE_ARGS:-"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$arch"}

# cuBLAS: ggml-cuda links it. A toolkit without it (nvcc alone) takes pip's nvidia-cublas, as PyTorch
# has it: its headers on the include path, its libraries named to CMake and linked beside ours.
extra=() libdirs=()
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_root=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")}
[[ -f "$cuda_root/include/cuda_runtime.h" || ! -d /usr/local/cuda ]] || cuda_root=$(readlink -f /usr/local/cuda)
libdirs+=("$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib")
if [[ "$cmake_args" == *GGML_CUDA=ON* ]] && ! compgen -G "$cuda_root/include/cublas_v2.h" >/dev/null \
  && ! compgen -G "$cuda_root/targets/*/include/cublas_v2.h" >/dev/null; then
  roots=$(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)
  # shellcheck disable=SC2086  # several roots
  header=$(find $roots -name cublas_v2.h 2>/dev/null | head -1 || true)
  [[ -n "$header" ]] || { echo "no cuBLAS: neither $cuda_root nor pip's nvidia-cublas has cublas_v2.h" >&2; exit 1; }
  inc=$(dirname "$header")
  lib=$(dirname "$inc")/lib
  cublas=$(ls "$lib"/libcublas.so* | head -1)
  cublaslt=$(ls "$lib"/libcublasLt.so* | head -1)
  extra+=("-DCUDA_cublas_LIBRARY=$cublas" "-DCUDA_cublasLt_LIBRARY=$cublaslt"
    "-DCMAKE_CUDA_FLAGS=-I$inc" "-DCMAKE_CXX_FLAGS=-I$inc")
  libdirs+=("$lib")
  echo "cuBLAS from pip's nvidia-cublas: $inc"
fi

# The driver library (VMM memory pools): CMake looks for an unversioned libcuda.so or the toolkit's
# stub; a driver that ships libcuda.so.1 alone is named to it, and with none at all VMM is left out.
if [[ "$cmake_args" == *GGML_CUDA=ON* ]] && ! compgen -G "$cuda_root/lib64/stubs/libcuda.so" >/dev/null \
  && ! compgen -G "$cuda_root/targets/*/lib/stubs/libcuda.so" >/dev/null; then
  driver=$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF}'; \
    ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null) | head -1 || true)
  if [[ -z "$driver" ]] && command -v cc >/dev/null; then
    # a machine with the toolkit and no GPU (building here to carry there): a stub under the driver's
    # soname, defining the driver calls ggml-cuda makes; the real libcuda.so.1 is loaded where it runs
    stub=$src/cuda-stub
    mkdir -p "$stub"
    grep -rhoE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$src/vendor/llama.cpp/ggml/src/ggml-cuda" \
      | tr -d '( \t' | sort -u | sed 's/.*/void &(void) {}/' >"$stub/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/stub.c"
    driver=$stub/libcuda.so
    echo "no libcuda.so here: linking a stub of the $(wc -l <"$stub/stub.c") driver calls ggml-cuda makes"
  fi
  if [[ -n "$driver" ]]; then
    extra+=("-DCUDA_cuda_driver_LIBRARY=$driver")
  else
    extra+=("-DGGML_CUDA_NO_VMM=ON")
    echo "no libcuda.so found: building without VMM memory pools" >&2
  fi
fi
# shellcheck disable=SC2086  # the flags are words
cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF \
  -DGGML_NATIVE=OFF -DSKBUILD_PLATLIB_DIR="$site" -DCMAKE_INSTALL_PREFIX="$src/prefix" $cmake_args "${extra[@]}" >"$src/configure.log" 2>&1 \
  || { tail -40 "$src/configure.log"; exit 1; }
t1=$(date +%s)
if [[ -n "${TANDEM_GPU_CONFIGURE_ONLY:-}" ]]; then  # tests: the flags and the build's size, no build
  echo "configured in $((t1 - t0)) s: $src/build; $(ninja -C "$src/build" -n | grep -c '\.cu\.o') CUDA objects"
  exit 0
fi
cmake --build "$src/build" -j "$jobs" >"$src/build.log" 2>&1 || { tail -60 "$src/build.log"; exit 1; }
t2=$(date +%s)
rm -rf "$site"
mkdir -p "$site"
cmake --install "$src/build" >"$src/install.log" 2>&1 || { tail -20 "$src/install.log"; exit 1; }
cp -r "$src/llama_cpp/." "$site/llama_cpp/"  # the Python files (lib/ is installed already)
if compgen -G "$carry/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$carry"/wheels/*.whl
fi
# what the engine needs at run time: the package first on the path, and the CUDA libraries it links
{
  echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
} >"$site/env.sh"
t3=$(date +%s)
echo "llama-cpp-python built for: $cmake_args ($jobs jobs): configure $((t1 - t0)) s, build $((t2 - t1)) s, install $((t3 - t2)) s"
echo "site: $site (source $site/env.sh) ($(du -sh "$site" | cut -f1)); libraries: $(cd "$site/llama_cpp/lib" && ls | tr '\n' ' ')"
