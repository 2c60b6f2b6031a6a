#!/bin/sh
# Build the PD add-on of the real-SGLang venv once per machine: Mooncake's transfer engine (TCP, no CUDA),
# its missing msgpack and sglang-router 0.3.2 in site/, and in lib/ the shared libraries mooncake's
# engine.so links that the test host's rootfs lacks: libibverbs.so.1 (linked even when only TCP is used),
# libnuma.so.1 and libcurl.so.4, with their own dependencies outside that rootfs (readelf -d, then
# apt-cache depends --recurse against its dpkg status). They are Debian bookworm's own packages, unpacked
# with dpkg-deb: nothing is installed system-wide; lib/ is bind-mounted with site/ and named by
# LD_LIBRARY_PATH.
# A folder of its own with its own stamp: the venv (build-venv.sh) and its stamp are left as they are.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${DEPLOYCTL_REAL_SGLANG_VENV:-$HOME/.cache/deployctl/real-sglang-0.5.23}
addon=${DEPLOYCTL_REAL_SGLANG_PD:-$HOME/.cache/deployctl/real-sglang-pd-0.5.23}
stamp="$addon/.pd-stamp"
want=$(cat "$here/pd-requirements.txt" "$here/build-pd.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x "$venv/bin/python" ] || { echo "real-sglang-pd: build the venv first ($venv)" >&2; exit 1; }
debs="libibverbs1 libnl-3-200 libnl-route-3-200 libnuma1 libcurl4 libbrotli1 libldap-2.5-0 libnghttp2-14
      libpsl5 librtmp1 libsasl2-2 libssh2-1"
echo "building the PD add-on of the real SGLang venv in $addon (once; about 235 MB)"
started=$(date +%s)
tmp="$addon.build-$$"
rm -rf "$tmp" && mkdir -p "$tmp/site" "$tmp/lib" "$tmp/debs"
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps --only-binary=:all: \
    --target "$tmp/site" -r "$here/pd-requirements.txt"
# apt-get download needs the package lists; a fresh machine (root) reads them once
if ! (cd "$tmp/debs" && apt-get download -q $debs >/dev/null 2>&1); then
    [ "$(id -u)" = 0 ] || { echo "real-sglang-pd: apt-get download $debs failed (not root)" >&2; exit 1; }
    apt-get update -qq
    (cd "$tmp/debs" && apt-get download -q $debs >/dev/null)
fi
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
find "$tmp/root" -regex '.*/lib/[^/]*-linux-gnu/[^/]*\.so[^/]*' \( -type f -o -type l \) \
    -exec mv {} "$tmp/lib/" \;
rm -rf "$tmp/root" "$tmp/debs"
# The import SGLang makes at the first transfer, and the router's, with the units' own paths.
LD_LIBRARY_PATH="$tmp/lib" PYTHONPATH="$here/site:$tmp/site" "$venv/bin/python" -c '
from mooncake.engine import TransferEngine
import msgpack, sglang_router.launch_router
print("real-sglang-pd: mooncake", TransferEngine.__module__, "and sglang_router import")'
rm -rf "$addon" && mv "$tmp" "$addon"
trap - EXIT
echo "$want" > "$stamp"
echo "real-sglang-pd: built in $(( $(date +%s) - started )) s, $(du -sh "$addon" | cut -f1)"
