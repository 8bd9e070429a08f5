#!/usr/bin/env bash
# Installs every system package ferry's build and tests need (Debian 12). Idempotent:
# returns in well under a second when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t pkgs < <(grep -v '^#' tools/packages.txt | awk 'NF {print $1}')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done" >&2
fi

# cuda.h for the driver API, which ferryd loads with dlopen at run time (no CUDA toolkit
# needed to build). NVIDIA publishes the header in this PyPI wheel; pinned by hash.
CUDA_WHEEL=nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
CUDA_WHEEL_SHA256=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
if [ ! -f tools/cuda/include/cuda.h ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "setup: fetching cuda.h (${CUDA_WHEEL%%-py3*})" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.11 -d "$tmp" "nvidia-cuda-runtime-cu12==12.9.79"
  echo "$CUDA_WHEEL_SHA256  $tmp/$CUDA_WHEEL" | sha256sum -c --quiet -
  mkdir -p tools/cuda/include
  unzip -q -j -o "$tmp/$CUDA_WHEEL" nvidia/cuda_runtime/include/cuda.h -d tools/cuda/include
fi
