#!/usr/bin/env bash
# The GPU check in one call on a lent GPU machine, from the repository's root, with build/gpu-carry
# carried (packaging/gpu-carry.sh made it here):
#
#     bash packaging/gpu-run.sh [bench.gpu_check options...]
#
# 1. builds the carried llama-cpp-python sources for the machine's GPU into /tmp/tandem-site
#    (packaging/gpu-build.sh) and puts it first on the paths;
# 2. where a Vulkan build was carried, unpacks it into /tmp/vk-site (and the Vulkan loader's .deb into
#    /tmp/vk-loader when the machine has no libvulkan.so.1), and measures it too (--backend);
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

{ nvidia-smi -L; nproc; free -g | head -2; python3 --version; } 2>&1 | tee "$out/machine.txt"
if [[ -z "$dry" ]]; then
  bash packaging/gpu-build.sh "$carry" "$site" 2>&1 | tee "$out/build.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "BUILD FAILED after $(($(date +%s) - t0)) s"; exit 2; }
  # shellcheck disable=SC1091  # written by gpu-build.sh
  source "$site/env.sh"
fi

backends=(--backend "cuda=$site")
if [[ -f "$carry/vulkan-site.tar.xz" ]]; then
  rm -rf /tmp/vk-site && mkdir -p /tmp/vk-site && tar -xJf "$carry/vulkan-site.tar.xz" -C /tmp/vk-site
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
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
