#!/usr/bin/env bash
# Build the packaged app from a clean checkout, in one command:
#
#     bash packaging/build.sh
#
# Linux:   dist/tandem/ (one folder) and dist/tandem-<version>-linux-<arch>.tar.gz (with tandem.desktop
#          and the icon), plus dist/tandem-<version>-<arch>.AppImage when appimagetool is on PATH.
# macOS:   dist/Tandem.app and dist/tandem-<version>-macos-<arch>.dmg (hdiutil).
# Windows: (Git Bash) dist/tandem/; the installer is made by packaging/windows/tandem.iss (ISCC).
#
# Steps: a build venv in build/venv; llama-cpp-python built from source with portable flags (wheel
# cached in ~/.cache/tandem/wheels/<key>/, the same cache and key as packaging/install-dev.sh); Tandem
# and PyInstaller installed into it; the self-test models and icons generated; PyInstaller run with
# packaging/tandem.spec; what is not needed stripped; the archive made; the frozen self-test run.
#
# Settings (environment):
#   TANDEM_CPU_VARIANTS=all  llama.cpp with -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON: one
#                            libggml-cpu-<variant> per x86 level, picked at run time (release builds;
#                            about 35 CPU-minutes to build). Default "off": one portable AVX2 build
#                            (GGML_NATIVE=OFF). On macOS and arm64 the variants are not used.
#   TANDEM_VULKAN=auto|on|off  llama.cpp's Vulkan backend beside the CPU one (AMD, Intel and NVIDIA GPUs
#                            with nothing but the graphics driver). Default on Linux "auto": on where
#                            packaging/vulkan.sh finds what the build needs (Debian: apt-get install glslc
#                            libvulkan-dev spirv-headers; headers older than 1.3.261 are replaced by
#                            Debian 13's), else a CPU-only package with the reason printed; "on" fails
#                            instead. Windows: off unless "on" (the Vulkan SDK, $VULKAN_SDK). Not on macOS.
#                            Not added when TANDEM_CMAKE_ARGS sets a GPU backend itself.
#   TANDEM_CMAKE_ARGS        extra CMake flags, e.g. "-DGGML_CUDA=on" (Windows/Linux CUDA build);
#                            on macOS "-DGGML_METAL=on" is added by default.
#   PYTHON                   the Python used for the build venv (default python3; 3.10-3.12)
#   TANDEM_SKIP_SELFTEST=1   do not run the frozen self-test at the end
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
PYINSTALLER_SPEC="pyinstaller>=6.10,<7"
python=${PYTHON:-python3}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' app/__init__.py)
[[ -n "$VERSION" ]] || { echo "build.sh: cannot read __version__ from app/__init__.py" >&2; exit 1; }

case "$(uname -s)" in
  Linux) os=linux ;;
  Darwin) os=macos ;;
  MINGW* | MSYS* | CYGWIN*) os=windows ;;
  *) echo "build.sh: unsupported system $(uname -s)" >&2; exit 1 ;;
esac
arch=$(uname -m)
case "$arch" in amd64 | AMD64) arch=x86_64 ;; aarch64) arch=arm64 ;; esac

# --- llama-cpp-python flags (the cache key matches install-dev.sh's for the same flags) -------------
extra="${TANDEM_CMAKE_ARGS:-}"
if [[ "$os" == macos && "$extra" != *GGML_METAL* ]]; then
  extra="-DGGML_METAL=on${extra:+ $extra}"
fi
vulkan="${TANDEM_VULKAN:-}"
[[ -n "$vulkan" ]] || { [[ "$os" == linux ]] && vulkan=auto || vulkan=off; }
case "$vulkan" in auto | on | off) ;; *) echo "build.sh: TANDEM_VULKAN must be auto, on or off" >&2; exit 1 ;; esac
if [[ "$extra" =~ GGML_(CUDA|METAL|VULKAN|HIP|SYCL|OPENCL|MUSA|CANN)[:=] || "$os" == macos ]]; then
  vulkan=off  # the flags given (or Metal) decide
fi
backend="CPU"
if [[ "$vulkan" != off ]]; then
  vulkan_log=$(mktemp)
  if vulkan_flags=$(bash packaging/vulkan.sh 2>"$vulkan_log"); then
    extra="$vulkan_flags${extra:+ $extra}"
    backend="Vulkan + CPU"
    grep '^vulkan: headers' "$vulkan_log" | tail -1 >&2 || true
  elif [[ "$vulkan" == on ]]; then
    echo "build.sh: TANDEM_VULKAN=on: $(tail -1 "$vulkan_log" | sed 's/^vulkan: //')" >&2
    rm -f "$vulkan_log"
    exit 1
  else
    echo "build.sh: no Vulkan backend in this package: $(tail -1 "$vulkan_log" | sed 's/^vulkan: //')" >&2
    echo "          (TANDEM_VULKAN=on makes that an error)" >&2
  fi
  rm -f "$vulkan_log"
fi
if [[ "${TANDEM_CPU_VARIANTS:-off}" == all && "$arch" == x86_64 ]]; then
  extra="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON${extra:+ $extra}"
fi
cmake_args="-DGGML_NATIVE=OFF $extra"
key=$(printf '%s %s %s' "$LLAMA_VERSION" "$cmake_args" "$(uname -sm)" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels/$key"

# --- build venv ---------------------------------------------------------------------------------
venv=build/venv
if [[ "$os" == windows ]]; then vpy=$venv/Scripts/python.exe; else vpy=$venv/bin/python; fi
[[ -x "$vpy" ]] || "$python" -m venv "$venv"
pip=("$vpy" -m pip -q --disable-pip-version-check)
niced=()
command -v nice >/dev/null 2>&1 && niced=(nice -n 10)  # a shared build machine stays usable

if ! compgen -G "$wheels/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; then
  minutes="10-40 minutes on 2 cores"
  [[ "$backend" == Vulkan* ]] && minutes="about 25 minutes more for Vulkan's shaders"
  echo "building llama-cpp-python $LLAMA_VERSION for $backend ($cmake_args); $minutes" >&2
  mkdir -p "$wheels"
  CMAKE_ARGS="$cmake_args" ${niced[@]+"${niced[@]}"} "${pip[@]}" wheel --no-deps --no-cache-dir -w "$wheels" \
    "llama-cpp-python==$LLAMA_VERSION"
fi
# non-editable: PyInstaller must see the app as ordinary packages (and no test extras in the bundle)
"${pip[@]}" install --find-links "$wheels" "llama-cpp-python==$LLAMA_VERSION" "$PYINSTALLER_SPEC" .
# the bundle takes the sources from the checkout (pathex); the installed copy only pins dependencies

# --- generated inputs: self-test models, icons -----------------------------------------------------
rm -rf build/selftest build/icons build/licenses
"$vpy" - <<'PY'
from app.tiny_gguf import write_tiny_pair
target, draft = write_tiny_pair("build/selftest")
print(f"self-test models: {target} {draft}")
PY
"$vpy" packaging/make_icons.py build/icons
"$vpy" packaging/collect_licenses.py build/licenses

# --- PyInstaller ----------------------------------------------------------------------------------
rm -rf dist/tandem dist/Tandem.app
t0=$(date +%s)
${niced[@]+"${niced[@]}"} "$vpy" -m PyInstaller --noconfirm --log-level WARN --distpath dist \
  --workpath build/pyinstaller packaging/tandem.spec
echo "PyInstaller: $(( $(date +%s) - t0 )) s" >&2

if [[ "$os" == macos ]]; then app_dir=dist/Tandem.app/Contents/Frameworks; else app_dir=dist/tandem/_internal; fi

# --- strip what is not needed (belt and braces after the spec's own filtering) ---------------------
rm -rf "$app_dir"/PySide6/Qt/translations "$app_dir"/PySide6/Qt/qml "$app_dir"/PySide6/typesystems \
  "$app_dir"/PySide6/include "$app_dir"/PySide6/glue "$app_dir"/numpy/_core/include \
  "$app_dir"/numpy/_core/lib "$app_dir"/numpy/f2py "$app_dir"/numpy/*/tests
find "$app_dir" \( -name '*.pyi' -o -name '*.h' \) -type f -delete
# llama_cpp/lib holds libX.so (opened by ctypes) and libX.so.0 (the soname others link to) as copies
# (wheels have no symlinks): make the soname a symlink again (not on Windows: no sonames there)
if [[ "$os" != windows ]]; then
  for f in "$app_dir"/llama_cpp/lib/*.so.[0-9]; do
    [[ -f "$f" && ! -L "$f" ]] || continue
    plain="${f%.so.*}.so"
    if [[ -f "$plain" ]] && cmp -s "$f" "$plain"; then ln -sf "$(basename "$plain")" "$f"; fi
  done
fi

# debug symbols of the interpreter and its extension modules (pyenv builds keep them: ~25 MB); not a
# blanket strip, which corrupts numpy's OpenBLAS (see packaging/README.md)
if [[ "$os" == linux ]] && command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$app_dir"/libpython3*.so* "$app_dir"/python3*/lib-dynload/*.so 2>/dev/null || true
fi

echo "bundle:" >&2
if [[ "$os" == macos ]]; then du -sh dist/Tandem.app >&2; else du -sh dist/tandem >&2; fi
du -sh "$app_dir"/* 2>/dev/null | sort -h | tail -12 >&2

# --- archive / installer ---------------------------------------------------------------------------
case "$os" in
  linux)
    cp packaging/linux/tandem.desktop dist/tandem/tandem.desktop
    cp resources/icon.svg dist/tandem/tandem.svg
    [[ -f build/icons/tandem-256.png ]] && cp build/icons/tandem-256.png dist/tandem/tandem.png
    cp packaging/linux/install-desktop-entry.sh dist/tandem/
    tarball="dist/tandem-$VERSION-linux-$arch.tar.gz"
    tar -C dist -czf "$tarball" tandem
    echo "archive: $tarball ($(du -h "$tarball" | cut -f1))" >&2
    if command -v appimagetool >/dev/null 2>&1; then
      bash packaging/linux/make-appimage.sh "$VERSION" "$arch"
    else
      echo "appimagetool not found: no AppImage (see packaging/README.md)" >&2
    fi
    ;;
  macos)
    bash packaging/macos/make-dmg.sh "$VERSION" "$arch"
    ;;
  windows)
    echo "installer: run ISCC /DAppVersion=$VERSION packaging/windows/tandem.iss" >&2
    ;;
esac

# --- the frozen self-test (scrubbed environment: no venv, no Python on PATH) -----------------------
if [[ "${TANDEM_SKIP_SELFTEST:-0}" != 1 ]]; then
  case "$os" in
    macos) exe=dist/Tandem.app/Contents/MacOS/tandem ;;
    windows) exe=dist/tandem/tandem.exe ;;
    *) exe=dist/tandem/tandem ;;
  esac
  if [[ "$os" == windows ]]; then
    "$exe" --self-test
  else
    env -i HOME="$HOME" PATH=/usr/bin:/bin QT_QPA_PLATFORM=offscreen "$exe" --self-test
  fi
fi
echo "done: tandem $VERSION ($os-$arch, llama.cpp for $backend, flags: $cmake_args)" >&2
