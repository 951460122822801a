#!/usr/bin/env bash
# dist/Tandem.app -> dist/tandem-<version>-macos-<arch>.dmg (called by packaging/build.sh on macOS).
# Signs ad hoc unless TANDEM_CODESIGN_IDENTITY names a "Developer ID Application" identity; with
# TANDEM_NOTARY_PROFILE (a `xcrun notarytool store-credentials` profile) the dmg is also notarized.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$1 arch=$2
app=dist/Tandem.app
dmg="dist/tandem-$version-macos-$arch.dmg"
identity=${TANDEM_CODESIGN_IDENTITY:--}
entitlements=packaging/macos/entitlements.plist
codesign --force --deep --options runtime --timestamp=none --entitlements "$entitlements" \
  --sign "$identity" "$app"
codesign --verify --deep --strict "$app"
staging=build/dmg
rm -rf "$staging" "$dmg"
mkdir -p "$staging"
cp -R "$app" "$staging/"
ln -s /Applications "$staging/Applications"
hdiutil create -volname "Tandem $version" -srcfolder "$staging" -fs HFS+ -format UDZO -ov "$dmg"
if [[ -n "${TANDEM_NOTARY_PROFILE:-}" ]]; then
  xcrun notarytool submit "$dmg" --keychain-profile "$TANDEM_NOTARY_PROFILE" --wait
  xcrun stapler staple "$dmg"
fi
echo "dmg: $dmg ($(du -h "$dmg" | cut -f1))" >&2
