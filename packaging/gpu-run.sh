#!/usr/bin/env bash
# The GPU check in one call on a lent GPU machine, from the repository's root, with build/gpu-carry
# carried (packaging/gpu-carry.sh made it here):
#
#     bash packaging/gpu-run.sh [bench.gpu_check options...]
#
# 1. unpacks a carried CUDA build into /tmp/tandem-site (cuda-site.tar.xz, built elsewhere for this GPU),
#    or builds the carried llama-cpp-python sources for the machine's GPU there (packaging/gpu-build.sh),
#    and puts it first on the paths;
# 2. where a Vulkan build was carried, unpacks it into /tmp/vk-site (and the Vulkan loader's and glvnd's
#    .debs into /tmp/vk-loader when the machine lacks them), and measures it too (--backend);
# 3. runs `python3 -m bench.gpu_check`, its JSON written to $OUT/gpu-check.json as each step ends, so a
#    call stopped at its time limit still brings back what was measured; the logs beside it.
#
# GPU_RUN_DRY=1 prints what it would run and stops (tests).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
out=${OUT:-/tmp/gpu-check-out}
carry=${TANDEM_GPU_CARRY_DIR:-$here/build/gpu-carry}
site=/tmp/tandem-site
mkdir -p "$out"
export PYTHONUNBUFFERED=1
dry=${GPU_RUN_DRY:-}
t0=$(date +%s)

{ nvidia-smi -L; nproc; free -g | head -2; python3 --version
  ls /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null
  ldconfig -p | grep -E 'libvulkan|GLX_nvidia|GLdispatch' ; } 2>&1 | tee "$out/machine.txt"
# the shared libraries a carried build links that this machine's loader does not find (the CUDA
# runtime and cuBLAS, which a toolkit or pip's nvidia packages hold): their folders, for LD_LIBRARY_PATH
library_dirs() {
  local roots dirs=() name found
  roots="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)"
  for name in $(ldd "$1"/llama_cpp/lib/*.so 2>/dev/null | awk '/not found/{print $1}' | sort -u); do
    # shellcheck disable=SC2086  # several roots
    found=$(find -L $roots -name "$name" 2>/dev/null | head -1)
    [[ -n "$found" ]] && dirs+=("$(dirname "$found")") || echo "gpu-run: $name not found on this machine" >&2
  done
  (IFS=:; echo "${dirs[*]}")
}

if [[ -z "$dry" ]]; then
  if [[ -f "$carry/cuda-site.tar.xz" ]]; then
    # built elsewhere for this GPU (gpu-carry.sh with TANDEM_GPU_CARRY_CUDA_SITE): unpacked, not built
    rm -rf "$site" && mkdir -p "$site" && tar -xJf "$carry/cuda-site.tar.xz" -C "$site"
    if compgen -G "$carry/wheels/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$carry"/wheels/*.whl
    fi
    dirs=$(library_dirs "$site")
    {
      echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
      echo "export LD_LIBRARY_PATH=$dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    } >"$site/env.sh"
    echo "carried CUDA build unpacked into $site in $(($(date +%s) - t0)) s; libraries from: ${dirs:-the default paths}" | tee "$out/build.log"
  else
    bash packaging/gpu-build.sh "$carry" "$site" 2>&1 | tee "$out/build.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || { echo "BUILD FAILED after $(($(date +%s) - t0)) s"; exit 2; }
  fi
  # shellcheck disable=SC1091  # written above or by gpu-build.sh
  source "$site/env.sh"
fi

backends=(--backend "cuda=$site")
if [[ -f "$carry/vulkan-site.tar.xz" ]]; then
  rm -rf /tmp/vk-site && mkdir -p /tmp/vk-site && tar -xJf "$carry/vulkan-site.tar.xz" -C /tmp/vk-site
  # NVIDIA's Vulkan driver (libGLX_nvidia) needs glvnd's dispatch library beside the loader
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 ' || ! ldconfig -p 2>/dev/null | grep -q 'libGLdispatch.so.0 '; then
    mkdir -p /tmp/vk-loader
    for deb in "$carry"/debs/*.deb; do [[ -f "$deb" ]] && dpkg -x "$deb" /tmp/vk-loader; done
    export LD_LIBRARY_PATH=/tmp/vk-loader/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [[ -n "${VK_DRIVER_FILES:-}" || ! -f "$icd" ]] || export VK_DRIVER_FILES=$icd
  backends+=(--backend vulkan=/tmp/vk-site)
fi

# the device tool stops a call at 600 s: start no step after ${GPU_RUN_LIMIT:-570} s from this script's start
deadline=$(( ${GPU_RUN_LIMIT:-570} - ($(date +%s) - t0) - 60 ))
cmd=(python3 -m bench.gpu_check --out "$out/gpu-check.json" --workdir /tmp/gpu-check --deadline "$deadline"
  "${backends[@]}" "$@")
echo "+ ${cmd[*]}"
[[ -z "$dry" ]] || exit 0
"${cmd[@]}" 2>&1 | tee "$out/check.log"
status=${PIPESTATUS[0]}
echo "gpu-run: $(($(date +%s) - t0)) s in all, check exit $status"
exit "$status"
