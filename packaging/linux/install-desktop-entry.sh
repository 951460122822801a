#!/usr/bin/env bash
# Add Tandem to the desktop's application menu (per user, no root): run from the unpacked folder.
#     ./install-desktop-entry.sh            install   ./install-desktop-entry.sh --remove   remove
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor"
if [[ "${1:-}" == --remove ]]; then
  rm -f "$apps/tandem.desktop" "$icons/scalable/apps/tandem.svg" "$icons/256x256/apps/tandem.png"
  echo "removed the Tandem menu entry"
  exit 0
fi
mkdir -p "$apps" "$icons/scalable/apps" "$icons/256x256/apps"
cp "$here/tandem.svg" "$icons/scalable/apps/tandem.svg"
[[ -f "$here/tandem.png" ]] && cp "$here/tandem.png" "$icons/256x256/apps/tandem.png"
sed "s|^Exec=.*|Exec=\"$here/tandem\"|" "$here/tandem.desktop" > "$apps/tandem.desktop"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$apps" || true
echo "installed $apps/tandem.desktop (Exec=$here/tandem)"
