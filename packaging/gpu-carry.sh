#!/usr/bin/env bash
# What the GPU check carries to a lent GPU machine (no network there; the device tool carries at most
# 64 MiB with the working tree), into an ignored folder (default build/gpu-carry, name it in `carry`):
#
#   llama-cpp-python-0.3.36-src.tar.gz   the pinned sdist without what a build does not need: vocabulary
#                                        files (vendor/llama.cpp/models, 75 MB), docs (38 MB), the git
#                                        history (38 MB), tools, examples, tests, media, CI, the sources of
#                                        backends never built here; built there by packaging/gpu-build.sh
#   wheels/*.whl                         pure-Python packages Tandem's engine imports that the machine's
#                                        image lacks (diskcache for llama_cpp, gguf for the model writers)
#   cuda-site.tar.xz                     with TANDEM_GPU_CARRY_CUDA_SITE=DIR (a site that packaging/gpu-build.sh
#                                        built here for the GPU's compute capability, with the toolkit and no
#                                        GPU): its llama_cpp package, each library once; gpu-run.sh then
#                                        unpacks it instead of building (the build is 4-5 minutes of the
#                                        GPU machine's time on 16 cores)
#   vulkan-site.tar.xz, debs/*.deb       with TANDEM_GPU_CARRY_VULKAN_WHEEL=WHEEL (a Vulkan build made here,
#                                        e.g. by install-dev.sh): its llama_cpp package, each library once
#                                        (the wheel holds each six times: 77 MB), and the Vulkan loader's
#                                        .debs with the GL vendor library NVIDIA's Vulkan driver loads
#                                        (apt-get download libvulkan1 libglvnd0 libglx0 libegl1) for a
#                                        machine without them
#
#     bash packaging/gpu-carry.sh [SDIST.tar.gz]     # default: the sdist from pip's registry, kept in
#                                                    # ~/.cache/tandem/sdist
#
# TANDEM_GPU_CARRY_DIR: the folder; TANDEM_GPU_CARRY_NO_WHEELS=1: no wheels (tests: nothing fetched).
# Prints the folder and its size; exits 1 if it is over TANDEM_GPU_CARRY_LIMIT_MB (default: 63 MiB less
# the working tree, which travels in the same 64 MiB).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${TANDEM_GPU_CARRY_DIR:-$here/build/gpu-carry}
# the device tool carries 64 MiB with the working tree (tracked and untracked files git does not ignore)
tree=$(cd "$here" && git ls-files -z -co --exclude-standard 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
limit_mb=${TANDEM_GPU_CARRY_LIMIT_MB:-$((63 - ${tree:-8388608} / 1048576))}
version=0.3.36
name=llama_cpp_python-$version
python=${PYTHON:-python3}

sdist=${1:-}
if [[ -z "$sdist" ]]; then
  cache=${TANDEM_SDIST_CACHE:-$HOME/.cache/tandem/sdist}
  sdist=$cache/$name.tar.gz
  if [[ ! -f "$sdist" ]]; then
    mkdir -p "$cache"
    # --no-binary for this package alone: with :all: pip also builds the sdist's build requirements
    # (scikit-build-core and what it needs) from source to read its metadata, for many minutes
    "$python" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$cache"
  fi
fi
[[ -f "$sdist" ]] || { echo "no sdist at $sdist" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
[[ -f "$src/CMakeLists.txt" && -d "$src/vendor/llama.cpp/ggml" ]] || { echo "$sdist is not llama-cpp-python's sdist" >&2; exit 1; }
before=$(du -sb "$src" | cut -f1)

# What neither llama-cpp-python's CMakeLists (with LLAVA_BUILD=OFF) nor llama.cpp's as its subproject
# (no tools, examples, tests or server) reads. src/models (the architectures) stays: only the top-level
# models folder (vocabulary files for llama.cpp's tests) goes.
ll=$src/vendor/llama.cpp
rm -rf "$src"/{.git,docs,examples,tests,docker,.github} "$ll"/.git \
  "$ll"/{models,docs,media,examples,tests,benches,pocs,tools,app,ci,.github,.devops,conversion,gguf-py,grammars,requirements,skills,scripts} \
  "$ll"/ggml/src/{ggml-sycl,ggml-cann,ggml-opencl,ggml-hexagon,ggml-et,ggml-openvino,ggml-webgpu,ggml-metal,ggml-virtgpu,ggml-zdnn,ggml-musa}
find "$ll" -maxdepth 1 -type f \( -name '*.py' -o -name '*.md' -o -name '*.nix' -o -name '*.sh' \) -delete
after=$(du -sb "$src" | cut -f1)

mkdir -p "$out"
rm -f "$out"/llama-cpp-python-*-src.tar.gz
tar -czf "$out/llama-cpp-python-$version-src.tar.gz" -C "$work" "$(basename "$src")"

if [[ "${TANDEM_GPU_CARRY_NO_WHEELS:-0}" != 1 ]]; then
  rm -rf "$out/wheels"
  mkdir -p "$out/wheels"
  # pure Python: any platform's wheel is the one; versions as in Tandem's own environment here
  "$python" -m pip download -q --no-deps --only-binary :all: -d "$out/wheels" diskcache==5.6.3 gguf==0.19.0
fi

rm -f "$out/cuda-site.tar.xz"
if [[ -n "${TANDEM_GPU_CARRY_CUDA_SITE:-}" ]]; then
  cs=$work/cuda-site
  mkdir -p "$cs"
  cp -r "$TANDEM_GPU_CARRY_CUDA_SITE/llama_cpp" "$cs/"
  rm -rf "$cs/llama_cpp/server" "$cs"/llama_cpp/lib/libmtmd* "$cs"/llama_cpp/__pycache__
  [[ -f "$cs/llama_cpp/lib/libggml-cuda.so" ]] || { echo "$TANDEM_GPU_CARRY_CUDA_SITE has no CUDA backend" >&2; exit 1; }
  tar -cJf "$out/cuda-site.tar.xz" -C "$cs" .
fi

rm -rf "$out/vulkan-site.tar.xz" "$out/debs"
if [[ -n "${TANDEM_GPU_CARRY_VULKAN_WHEEL:-}" ]]; then
  vk=$work/vulkan-site
  mkdir -p "$vk"
  "$python" -m zipfile -e "$TANDEM_GPU_CARRY_VULKAN_WHEEL" "$vk"
  rm -rf "$vk/lib" "$vk/bin" "$vk/include" "$vk"/*.dist-info "$vk/llama_cpp/server" "$vk"/llama_cpp/lib/libmtmd*
  [[ -f "$vk/llama_cpp/lib/libggml-vulkan.so.0" ]] || { echo "$TANDEM_GPU_CARRY_VULKAN_WHEEL has no Vulkan backend" >&2; exit 1; }
  # one file per library, under its soname; the other names link to it
  for so in "$vk"/llama_cpp/lib/*.so.0; do
    base=${so%.0}
    rm -f "$base" "$base".0.*
    ln -s "$(basename "$so")" "$base"
  done
  tar -cJf "$out/vulkan-site.tar.xz" -C "$vk" .
  mkdir -p "$out/debs"
  (cd "$out/debs" && apt-get download -q libvulkan1 libglvnd0 libglx0 libegl1 >/dev/null) || echo "no Vulkan loader .debs (apt-get download failed)" >&2
fi

total=$(du -sb "$out" | cut -f1)
echo "sdist unpacked: $((before / 1048576)) MiB -> $((after / 1048576)) MiB; carried: $out ($((total / 1048576)) MiB)"
(cd "$out" && find . -type f -printf "  %8s  %p\n" | sort -k2)
if (( total > limit_mb * 1048576 )); then
  echo "over $limit_mb MiB: the working tree travels in the same 64 MiB" >&2
  exit 1
fi
