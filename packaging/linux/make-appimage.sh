#!/usr/bin/env bash
# Wrap dist/tandem/ into dist/tandem-<version>-<arch>.AppImage with appimagetool (called by build.sh
# when appimagetool is on PATH; it is in neither Debian nor PyPI: get it from
# https://github.com/AppImage/appimagetool/releases, as the release workflow does).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$1 arch=$2
appdir=build/Tandem.AppDir
rm -rf "$appdir"
mkdir -p "$appdir/usr/lib"
cp -a dist/tandem "$appdir/usr/lib/tandem"
cp packaging/linux/tandem.desktop "$appdir/tandem.desktop"
cp resources/icon.svg "$appdir/tandem.svg"
cat > "$appdir/AppRun" <<'RUN'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
exec "$here/usr/lib/tandem/tandem" "$@"
RUN
chmod +x "$appdir/AppRun"
ARCH=$arch appimagetool --no-appstream "$appdir" "dist/tandem-$version-$arch.AppImage"
echo "AppImage: dist/tandem-$version-$arch.AppImage" >&2
