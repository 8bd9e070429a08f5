#!/usr/bin/env bash
# Builds Debian's own Abseil (the exact source of the installed libabsl20220623) with
# -fsanitize=thread into tools/tsan/abseil/lib, for `tools/test.sh --config=tsan`.
#
# Why: ferry synchronizes with absl::Mutex. Debian's Abseil is not instrumented, so TSan
# cannot see its locks and reports every ABSL_GUARDED_BY access as a race. The
# instrumented libraries have the same sonames and symbols (inline namespace debian3),
# so tests load them through LD_LIBRARY_PATH in place of the system ones; gRPC, which
# also links Abseil, then takes its locks through them too. About a minute on 2 cores;
# does nothing when the build for this version is already there.
set -euo pipefail
cd "$(dirname "$0")"

VERSION=20220623.1-1+deb12u2
ORIG=abseil_20220623.1.orig.tar.gz
ORIG_SHA256=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
DEBIAN=abseil_${VERSION}.debian.tar.xz
DEBIAN_SHA256=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
POOL=http://deb.debian.org/debian/pool/main/a/abseil

installed=$(dpkg-query -W -f='${Version}' libabsl20220623 2>/dev/null || true)
if [ "$installed" != "$VERSION" ]; then
  echo "tsan: libabsl20220623 is '${installed:-not installed}', this script builds $VERSION;" \
       "update VERSION and the hashes in $0" >&2
  exit 1
fi
[ -f abseil/.version ] && [ "$(cat abseil/.version)" = "$VERSION" ] && exit 0

for tool in cmake patch curl; do
  command -v $tool >/dev/null || { echo "tsan: needs $tool (tools/setup.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/ferry-abseil.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "tsan: building Abseil $VERSION with -fsanitize=thread" >&2
curl -fsS -o "$work/$ORIG" "$POOL/$ORIG"
curl -fsS -o "$work/$DEBIAN" "$POOL/$DEBIAN"
printf '%s  %s\n' "$ORIG_SHA256" "$work/$ORIG" "$DEBIAN_SHA256" "$work/$DEBIAN" | sha256sum -c --quiet -
mkdir "$work/src"
tar -xzf "$work/$ORIG" -C "$work/src" --strip-components=1
tar -xJf "$work/$DEBIAN" -C "$work/src"
# Debian's patches (series order), as dpkg-source would apply them.
while read -r p; do
  case $p in ''|'#'*) continue ;; esac
  patch -s -d "$work/src" -p1 < "$work/src/debian/patches/$p"
done < "$work/src/debian/patches/series"
# The flags of debian/rules' shared build, plus TSan.
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_INSTALL_PREFIX="$PWD/abseil" >/dev/null 2>&1
cmake --build "$work/build" -j"$(nproc)" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
rm -rf abseil
cmake --install "$work/build" >/dev/null
echo "$VERSION" > abseil/.version
