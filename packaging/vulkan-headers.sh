#!/usr/bin/env bash
# Vulkan headers new enough for the pinned llama.cpp, printed as an include folder on stdout.
#
#     include_dir=$(bash packaging/vulkan-headers.sh)            # exit 1 (reason on stderr): none
#     include_dir=$(bash packaging/vulkan-headers.sh --no-fetch) # exit 2: would fetch into this folder
#
# The pinned llama.cpp (llama-cpp-python 0.3.36) uses vk::LayerSettingEXT, which Vulkan-Hpp has from
# headers 1.3.261 on. When the system's headers (/usr/include/vulkan/vulkan_core.h, or
# $VULKAN_SDK/include) are that new, their folder is printed. Otherwise, on Debian/Ubuntu with apt-get,
# the newer headers are taken from the distribution's own registry rather than patching llama.cpp:
# Debian 13 (trixie)'s libvulkan-dev .deb is downloaded with `apt-get download` against a private
# source list (nothing is installed and the system's apt state is not touched) and unpacked with
# `dpkg-deb -x` into $TANDEM_VULKAN_HEADERS_DIR/<suite> (default ~/.cache/tandem/vulkan-headers/trixie),
# where it is kept for the next build (the folder's path is part of the build flags, so it is fixed). The loader (libvulkan.so) and glslc stay the system's.
#
# Settings: TANDEM_VULKAN_HEADERS_SUITE (default trixie), TANDEM_VULKAN_HEADERS_MIRROR (default
# http://deb.debian.org/debian).
set -euo pipefail

fetch=1
[[ "${1:-}" == --no-fetch ]] && fetch=0
NEED=261  # 1.3.NEED, the header patch version with vk::LayerSettingEXT

header_version() {  # "1.3.239" from a vulkan_core.h, or nothing
  local h="$1/vulkan/vulkan_core.h"
  [[ -r "$h" ]] || return 0
  local complete patch
  complete=$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\),.*/\1.\2/p' "$h" | head -1)
  patch=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$h" | head -1)
  [[ -n "$complete" && -n "$patch" ]] && echo "$complete.$patch"
  return 0
}
new_enough() {  # "1.3.239" -> false; "1.4.309" -> true
  local major minor patch
  IFS=. read -r major minor patch <<<"$1"
  (( major > 1 || (major == 1 && minor > 3) || (major == 1 && minor == 3 && patch >= NEED) ))
}

for inc in ${VULKAN_SDK:+"$VULKAN_SDK/include"} /usr/include /usr/local/include; do
  v=$(header_version "$inc")
  if [[ -n "$v" ]]; then
    if new_enough "$v" && [[ -r "$inc/vulkan/vulkan.hpp" ]]; then
      echo "vulkan headers: $v in $inc" >&2
      echo "$inc"
      exit 0
    fi
    echo "vulkan headers: $v in $inc is older than 1.3.$NEED" >&2
  fi
done

cache="${TANDEM_VULKAN_HEADERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vulkan-headers}"
suite="${TANDEM_VULKAN_HEADERS_SUITE:-trixie}"
mirror="${TANDEM_VULKAN_HEADERS_MIRROR:-http://deb.debian.org/debian}"
dest="$cache/$suite"
inc="$dest/usr/include"
v=$(header_version "$inc")
if [[ -n "$v" ]] && new_enough "$v" && [[ -r "$inc/vulkan/vulkan.hpp" ]]; then
  echo "vulkan headers: $v in $inc ($suite's libvulkan-dev, unpacked earlier)" >&2
  echo "$inc"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "vulkan headers: none new enough (1.3.$NEED), and no apt-get to fetch $suite's libvulkan-dev (install the Vulkan SDK and set VULKAN_SDK)" >&2
  exit 1
fi
if [[ "$fetch" == 0 ]]; then
  echo "vulkan headers: $suite's libvulkan-dev would be fetched into $dest" >&2
  echo "$inc"
  exit 2
fi
keyring=""
for k in /usr/share/keyrings/debian-archive-keyring.gpg /usr/share/keyrings/debian-archive-$suite-stable.gpg; do
  [[ -r "$k" ]] && keyring="$k" && break
done
apt_dir="$cache/apt-$suite"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/etc"
echo "deb [arch=$(dpkg --print-architecture)${keyring:+ signed-by=$keyring}] $mirror $suite main" >"$apt_dir/etc/sources.list"
apt_opts=(
  -o "Dir::Etc::sourcelist=$apt_dir/etc/sources.list"
  -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir"
  -o "Dir::Cache::archives=$apt_dir/archives"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "APT::Get::List-Cleanup=0"
  -o "Debug::NoLocking=1"
)
echo "vulkan headers: fetching $suite's libvulkan-dev from $mirror (apt-get download, unpacked into $cache)" >&2
if ! apt-get -q "${apt_opts[@]}" update >"$apt_dir/update.log" 2>&1; then
  echo "vulkan headers: apt-get update against $suite failed (see $apt_dir/update.log)" >&2
  exit 1
fi
rm -f "$apt_dir"/libvulkan-dev_*.deb
if ! (cd "$apt_dir" && apt-get -q "${apt_opts[@]}" download libvulkan-dev >"$apt_dir/download.log" 2>&1); then
  echo "vulkan headers: apt-get download libvulkan-dev failed (see $apt_dir/download.log)" >&2
  exit 1
fi
deb=$(ls "$apt_dir"/libvulkan-dev_*.deb | head -1)
version=$(dpkg-deb -f "$deb" Version)
rm -rf "$dest.partial"
dpkg-deb -x "$deb" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
v=$(header_version "$inc")
if [[ -z "$v" ]] || ! new_enough "$v"; then
  echo "vulkan headers: $suite's libvulkan-dev $version has headers ${v:-?}, older than 1.3.$NEED" >&2
  exit 1
fi
echo "vulkan headers: $v ($suite libvulkan-dev $version) in $inc" >&2
echo "$inc"
