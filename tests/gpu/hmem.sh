#!/usr/bin/env bash
# FI_HMEM on the GPU host: a libfabric built there with CUDA support, so that a provider
# offers FI_HMEM for GPU memory (shm here: the host has no RDMA NIC), and the GPU suite's
# FI_HMEM case run against it. The host's own libfabric (Ubuntu's 1.17) and Debian's have
# no CUDA support.
#   tests/gpu/hmem.sh fetch [bundle]   here: Debian's libfabric 2.1.0 source (pinned by
#                                      hash), autotools run, packed into <bundle>/src
#   tests/gpu/hmem.sh run [bundle]     on the GPU host: build it (nvcc's CUDA, providers
#                                      shm, tcp, rxm) into /tmp, then the FI_HMEM test case;
#                                      then the staged case over the bundle's own shm
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?usage: hmem.sh fetch|run [bundle]}
b=$(realpath "${2:-.gpu-bundle}")
VERSION=2.1.0
TARBALL=libfabric_$VERSION.orig.tar.xz
SHA256=1a66369772d5bb151737214af1c478993e969cf298e8f9ed369e7a2ab8d8c6df

case $mode in
  fetch)
    work=$(mktemp -d /tmp/ferry-lf.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    curl -fsS -o "$work/$TARBALL" "http://deb.debian.org/debian/pool/main/libf/libfabric/$TARBALL"
    echo "$SHA256  $work/$TARBALL" | sha256sum -c --quiet -
    command -v autoreconf >/dev/null || apt-get install -y -qq autoconf automake libtool >/dev/null
    tar -xJf "$work/$TARBALL" -C "$work"
    (cd "$work/libfabric-$VERSION" && ./autogen.sh >/dev/null 2>&1 && rm -rf fabtests)
    mkdir -p "$b/src"
    tar -cJf "$b/src/libfabric-$VERSION.tar.xz" -C "$work" "libfabric-$VERSION"
    echo "hmem: $b/src/libfabric-$VERSION.tar.xz"
    ;;
  run)
    lf=/tmp/ferry-libfabric-cuda
    if [ ! -f "$lf/lib/libfabric.so.1" ]; then
      rm -rf "$lf.src" && mkdir -p "$lf.src"
      tar -xJf "$b/src/libfabric-$VERSION.tar.xz" -C "$lf.src"
      (cd "$lf.src/libfabric-$VERSION" &&
        ./configure --prefix="$lf" --enable-only --enable-shm --enable-tcp --enable-rxm \
          --with-cuda=/usr/local/cuda --enable-cuda-dlopen >"$lf.src/configure.log" 2>&1 &&
        make -j"$(nproc)" install >"$lf.src/make.log" 2>&1) ||
        { tail -n 30 "$lf.src/configure.log" "$lf.src/make.log" 2>/dev/null; exit 1; }
    fi
    echo "hmem: libfabric $VERSION with CUDA in $lf"
    export FERRY_BIN_DIR="$b/bin"
    LD_LIBRARY_PATH="$lf/lib:$b/lib" FERRY_TEST_HMEM_PROVIDER=shm "$b/bin/gpu_test" --durations yes \
      "FI_HMEM cross-agent writes*"
    # The bundle's own libfabric (Debian's): its shm grants FI_HMEM for host memory only,
    # so registering GPU memory fails and the agents must fall back to staging.
    echo "hmem: shm from the bundle's libfabric (no CUDA): GPU memory must be staged"
    LD_LIBRARY_PATH="$b/lib" FERRY_TEST_STAGED_PROVIDER=shm "$b/bin/gpu_test" --durations yes \
      "staged cross-agent writes*"
    ;;
  *) echo "usage: hmem.sh fetch|run [bundle]" >&2; exit 2 ;;
esac
