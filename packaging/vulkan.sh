#!/usr/bin/env bash
# What llama.cpp's Vulkan backend needs to build, checked (and the headers fetched where too old):
#
#     flags=$(bash packaging/vulkan.sh)             # the CMake flags: "-DGGML_VULKAN=on [-DVulkan_INCLUDE_DIR=...]"
#     flags=$(bash packaging/vulkan.sh --no-fetch)  # the same without fetching (exit 2: would fetch first)
#     include=$(bash packaging/vulkan.sh --headers) # only the headers' folder
#     export VK_ICD_FILENAMES=$(bash packaging/vulkan.sh --lavapipe)   # tests: a lavapipe that works
#
# Exit 1 when something is missing: the reason is the last line on stderr ("vulkan: ..."), which
# install-dev.sh and build.sh show. The build needs, besides a C++ compiler and CMake:
#   - glslc (the shader compiler: on PATH or in $VULKAN_SDK/bin; Debian: glslc);
#   - SPIRV-Headers' CMake package (Debian: spirv-headers; the Vulkan SDK has it);
#   - the Vulkan loader to link (libvulkan.so; Debian: libvulkan-dev);
#   - Vulkan headers 1.3.261 or newer: the pinned llama.cpp (llama-cpp-python 0.3.36) uses
#     vk::LayerSettingEXT. When the system's (/usr/include, or $VULKAN_SDK/include) are older (Debian 12
#     has 1.3.239), the newer ones are taken from the distribution's own registry rather than patching
#     llama.cpp: Debian 13 (trixie)'s libvulkan-dev .deb is downloaded with `apt-get download` against a
#     private source list (nothing is installed and the system's apt state is not touched), unpacked with
#     `dpkg-deb -x` into $TANDEM_VULKAN_HEADERS_DIR/<suite> (default ~/.cache/tandem/vulkan-headers/trixie)
#     and kept there for the next build (its path is part of the build flags, so it is fixed); the flags
#     then add -DVulkan_INCLUDE_DIR=<that folder>/usr/include.
#
# --lavapipe is for the tests (tests/test_vulkan.py, .ci/run): Mesa's lavapipe, the Vulkan device that
# runs on the CPU, of Mesa 24 or newer. Debian 12's (Mesa 22.3.6) crashes (SIGSEGV in its shader code)
# on the pinned llama.cpp's Vulkan shaders at the third batch size a context evaluates; Mesa 25.0.7
# runs them. When the system's is older, <codename>-backports' mesa-vulkan-drivers is fetched and
# unpacked like the headers (into ~/.cache/tandem/lavapipe/<suite>; it uses the system's libLLVM-15,
# which Debian 12's mesa-vulkan-drivers brings), and the ICD file printed names it: select it with
# VK_ICD_FILENAMES. TANDEM_LAVAPIPE_SUITE picks another suite.
#
# Settings: TANDEM_VULKAN_HEADERS_SUITE (default trixie), TANDEM_VULKAN_HEADERS_MIRROR (default
# http://deb.debian.org/debian); TANDEM_VULKAN_SYSTEM_INCLUDES (default "/usr/include /usr/local/include",
# the folders searched besides $VULKAN_SDK/include; the tests point it elsewhere).
set -euo pipefail

fetch=1
want=flags
for arg in "$@"; do
  case "$arg" in
    --no-fetch) fetch=0 ;;
    --headers) want=headers ;;
    --lavapipe) want=lavapipe ;;
    *) echo "vulkan.sh: unknown argument $arg" >&2; exit 64 ;;
  esac
done
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

apt_unpack() {  # SUITE PACKAGE DEST: the package's newest .deb in SUITE, unpacked into DEST (nothing installed)
  local suite="$1" package="$2" dest="$3" keyring="" k apt_dir deb
  local mirror="${TANDEM_VULKAN_HEADERS_MIRROR:-http://deb.debian.org/debian}"
  if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "vulkan: no apt-get to fetch $suite's $package" >&2
    return 1
  fi
  for k in /usr/share/keyrings/debian-archive-keyring.gpg "/usr/share/keyrings/debian-archive-${suite%-backports}-stable.gpg"; do
    [[ -r "$k" ]] && keyring="$k" && break
  done
  apt_dir="$cache/apt-$suite"  # a private source list, lists and archives: the system's apt is untouched
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/etc"
  echo "deb [arch=$(dpkg --print-architecture)${keyring:+ signed-by=$keyring}] $mirror $suite main" >"$apt_dir/etc/sources.list"
  local apt_opts=(
    -o "Dir::Etc::sourcelist=$apt_dir/etc/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir"
    -o "Dir::Cache::archives=$apt_dir/archives"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
    -o "APT::Get::List-Cleanup=0"
    -o "APT::Sandbox::User=root"
    -o "Debug::NoLocking=1"
  )
  if ! apt-get -q "${apt_opts[@]}" update >"$apt_dir/update.log" 2>&1; then
    echo "vulkan: apt-get update against $suite failed (see $apt_dir/update.log)" >&2
    return 1
  fi
  rm -f "$apt_dir/${package}"_*.deb
  if ! (cd "$apt_dir" && apt-get -q "${apt_opts[@]}" download "$package/$suite" >"$apt_dir/download.log" 2>&1); then
    echo "vulkan: apt-get download of $suite's $package failed (see $apt_dir/download.log)" >&2
    return 1
  fi
  deb=$(ls "$apt_dir/${package}"_*.deb | head -1)
  unpacked_version=$(dpkg-deb -f "$deb" Version)
  rm -rf "$dest.partial"
  dpkg-deb -x "$deb" "$dest.partial"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
}

find_headers() {  # sets $found; returns 0, 1 (none) or 2 (--no-fetch: would fetch into $found)
  for inc in ${VULKAN_SDK:+"$VULKAN_SDK/include"} ${TANDEM_VULKAN_SYSTEM_INCLUDES:-/usr/include /usr/local/include}; do
    v=$(header_version "$inc")
    if [[ -n "$v" ]]; then
      if new_enough "$v" && [[ -r "$inc/vulkan/vulkan.hpp" ]]; then
        echo "vulkan: headers $v in $inc" >&2
        found="$inc"
        return 0
      fi
      echo "vulkan: system headers $v in $inc are older than 1.3.$NEED" >&2
    fi
  done

  cache="${TANDEM_VULKAN_HEADERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vulkan-headers}"
  suite="${TANDEM_VULKAN_HEADERS_SUITE:-trixie}"
  mirror="${TANDEM_VULKAN_HEADERS_MIRROR:-http://deb.debian.org/debian}"
  dest="$cache/$suite"
  inc="$dest/usr/include"
  v=$(header_version "$inc")
  if [[ -n "$v" ]] && new_enough "$v" && [[ -r "$inc/vulkan/vulkan.hpp" ]]; then
    echo "vulkan: headers $v ($suite's libvulkan-dev) in $inc" >&2
    found="$inc"
    return 0
  fi

  if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "vulkan: no Vulkan headers 1.3.$NEED or newer, and no apt-get to fetch $suite's libvulkan-dev (install the Vulkan SDK and set VULKAN_SDK)" >&2
    return 1
  fi
  if [[ "$fetch" == 0 ]]; then
    echo "vulkan: headers from $suite's libvulkan-dev, to be fetched into $dest" >&2
    found="$inc"
    return 2
  fi
  echo "vulkan: fetching $suite's libvulkan-dev from $mirror (apt-get download, unpacked into $dest)" >&2
  if ! apt_unpack "$suite" libvulkan-dev "$dest"; then
    echo "vulkan: no Vulkan headers 1.3.$NEED or newer, and $suite's libvulkan-dev could not be fetched" >&2
    return 1
  fi
  v=$(header_version "$inc")
  if [[ -z "$v" ]] || ! new_enough "$v"; then
    echo "vulkan: $suite's libvulkan-dev $unpacked_version has headers ${v:-?}, older than 1.3.$NEED" >&2
    return 1
  fi
  echo "vulkan: headers $v ($suite's libvulkan-dev $unpacked_version) in $inc" >&2
  found="$inc"
}

lavapipe() {  # an ICD file for Mesa's lavapipe of Mesa 24 or newer: the system's, else fetched
  local sys_json ver major codename dest json lib api
  sys_json=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1 || true)
  ver=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  major=${ver#*:}
  major=${major%%.*}
  if [[ -n "$sys_json" && "$major" =~ ^[0-9]+$ ]] && ((major >= 24)); then
    echo "vulkan: lavapipe of Mesa $ver (the system's)" >&2
    echo "$sys_json"
    return 0
  fi
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}" || true)
  suite="${TANDEM_LAVAPIPE_SUITE:-${codename:+$codename-backports}}"
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/lavapipe"
  if [[ -z "$suite" ]]; then
    echo "vulkan: no lavapipe of Mesa 24 or newer (the system has ${ver:-none}); set TANDEM_LAVAPIPE_SUITE" >&2
    return 1
  fi
  dest="$cache/$suite"
  json="$dest/lvp_icd.json"
  if [[ -r "$json" ]]; then
    echo "vulkan: lavapipe from $suite in $dest (unpacked earlier)" >&2
    echo "$json"
    return 0
  fi
  if [[ "$fetch" == 0 ]]; then
    echo "vulkan: lavapipe from $suite's mesa-vulkan-drivers, to be fetched into $dest" >&2
    echo "$json"
    return 2
  fi
  echo "vulkan: the system's lavapipe is Mesa ${ver:-none}; fetching $suite's mesa-vulkan-drivers" >&2
  if ! apt_unpack "$suite" mesa-vulkan-drivers "$dest"; then
    echo "vulkan: no lavapipe of Mesa 24 or newer: $suite's mesa-vulkan-drivers could not be fetched" >&2
    return 1
  fi
  lib=$(find "$dest" -name libvulkan_lvp.so | head -1)
  if [[ -z "$lib" ]]; then
    echo "vulkan: $suite's mesa-vulkan-drivers $unpacked_version has no lavapipe" >&2
    return 1
  fi
  api=$(cat "$dest"/usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | sed -n 's/.*"api_version": *"\([^"]*\)".*/\1/p' | head -1)
  printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "%s"}}\n' \
    "$lib" "${api:-1.3.0}" >"$json"
  echo "vulkan: lavapipe of Mesa $unpacked_version ($suite) in $dest" >&2
  echo "$json"
}

if [[ "$want" == lavapipe ]]; then
  rc=0
  lavapipe || rc=$?
  exit "$rc"
fi

if [[ "$want" == flags ]]; then  # first the shader compiler: without it no headers are fetched
  if command -v glslc >/dev/null 2>&1; then
    glslc=$(command -v glslc)
  elif [[ -n "${VULKAN_SDK:-}" && -x "$VULKAN_SDK/bin/glslc" ]]; then
    glslc="$VULKAN_SDK/bin/glslc"
  else
    echo "vulkan: no glslc, the shader compiler (on PATH or in \$VULKAN_SDK/bin; Debian: apt-get install glslc)" >&2
    exit 1
  fi
fi
found=""
rc=0
find_headers || rc=$?
if [[ "$want" == headers || "$rc" == 1 ]]; then
  [[ -n "$found" ]] && echo "$found"
  exit "$rc"
fi

# --- the rest of the build's needs ---------------------------------------------------------------
spirv=""
for d in "${VULKAN_SDK:-/nonexistent}"/{share,lib,lib/cmake,lib/*/cmake}/SPIRV-Headers /usr/share/cmake/SPIRV-Headers \
  /usr/{lib,lib64,local/share,local/lib}/cmake/SPIRV-Headers /usr/lib/*/cmake/SPIRV-Headers; do
  [[ -r "$d/SPIRV-HeadersConfig.cmake" ]] && spirv="$d" && break
done
if [[ -z "$spirv" ]]; then
  echo "vulkan: no SPIRV-Headers CMake package (Debian: apt-get install spirv-headers)" >&2
  exit 1
fi
loader=""
for f in "${VULKAN_SDK:-/nonexistent}"/lib/libvulkan.so /usr/lib/*/libvulkan.so /usr/lib64/libvulkan.so \
  /usr/lib/libvulkan.so /usr/local/lib/libvulkan.so "${VULKAN_SDK:-/nonexistent}"/Lib/vulkan-1.lib; do
  [[ -e "$f" ]] && loader="$f" && break
done
if [[ -z "$loader" ]]; then
  echo "vulkan: no Vulkan loader to link (libvulkan.so; Debian: apt-get install libvulkan-dev)" >&2
  exit 1
fi
flags="-DGGML_VULKAN=on"
[[ "$found" == /usr/include ]] || flags+=" -DVulkan_INCLUDE_DIR=$found"  # the system's need no flag
echo "vulkan: glslc $glslc, SPIRV-Headers in $spirv, loader $loader" >&2
echo "$flags"
exit "$rc"
