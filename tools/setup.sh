#!/usr/bin/env bash
# Installs every system package ferry's build and tests need (Debian 12), cuda.h, for
# the deployment checks helm and the Go modules of tests/deploy/k8s, and grpcurl and
# grpc-health-probe for the test of the agent's standard gRPC services. Idempotent:
# returns in well under a second when everything is already there.
#   tools/setup.sh                  everything
#   tools/setup.sh --roles=build    only what building ferryd needs (deploy/Dockerfile)
#   tools/setup.sh --roles=build,runtime   what the demo needs (tools/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

roles="build runtime test"
for arg in "$@"; do
  case $arg in
    --roles=*) roles=${arg#--roles=}; roles=${roles//,/ } ;;
    *) echo "setup: unknown argument $arg" >&2; exit 2 ;;
  esac
done
mapfile -t pkgs < <(grep -v '^#' tools/packages.txt | awk -v roles=" $roles " 'NF && index(roles, " " $2 " ") {print $1}')
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

case " $roles " in *" test "*) ;; *) exit 0 ;; esac

# helm, pinned, built from the Go module proxy (Debian has no helm package), for
# tools/deploy_check.sh. Go 1.24 or newer: tests/deploy/k8s reads Kubernetes 1.34's API
# types. Where the machine's Go is older (Debian 12's golang-go is 1.19), the toolchain
# `go` itself would fetch, from the module proxy, into tools/go/toolchain (the scripts
# that run Go put it first on PATH: tools/go_path.sh).
HELM_VERSION=v3.11.3
GO_TOOLCHAIN=go1.24.13
if ! command -v go >/dev/null; then
  echo "setup: installing golang-go" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi
source tools/go_path.sh
if ! go_is_new_enough; then
  echo "setup: $(go env GOVERSION) is older than go1.24: fetching $GO_TOOLCHAIN from the module proxy" >&2
  proxy=$(go env GOPROXY | cut -d, -f1)
  [ "$proxy" != direct ] && [ "$proxy" != off ] || proxy=https://proxy.golang.org
  rm -rf tools/go/toolchain tools/go/toolchain.zip tools/go/toolchain.tmp
  curl -fsSL -o tools/go/toolchain.zip "$proxy/golang.org/toolchain/@v/v0.0.1-$GO_TOOLCHAIN.linux-amd64.zip"
  unzip -q tools/go/toolchain.zip -d tools/go/toolchain.tmp
  mv "tools/go/toolchain.tmp/golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-amd64" tools/go/toolchain
  chmod +x tools/go/toolchain/bin/* tools/go/toolchain/pkg/tool/*/* 2>/dev/null || true
  rm -rf tools/go/toolchain.zip tools/go/toolchain.tmp
  source tools/go_path.sh
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
if [ "$(tools/go/bin/helm version --short 2>/dev/null | cut -d+ -f1)" != "$HELM_VERSION" ]; then
  echo "setup: building helm $HELM_VERSION" >&2
  GOBIN="$PWD/tools/go/bin" go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
# grpcurl and grpc-health-probe, pinned, for the test that drives the local API through
# server reflection and checks grpc.health.v1 as a Kubernetes probe would.
GRPC_TOOLS="github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4 github.com/grpc-ecosystem/grpc-health-probe@v0.4.61"
if [ "$(cat tools/go/.grpc-tools 2>/dev/null)" != "$GRPC_TOOLS" ]; then
  echo "setup: building grpcurl and grpc-health-probe" >&2
  for m in $GRPC_TOOLS; do GOBIN="$PWD/tools/go/bin" go install "$m"; done
  echo "$GRPC_TOOLS" > tools/go/.grpc-tools
fi
# The modules of the manifest validation test (go.sum pins them), fetched once.
if [ ! -f tools/go/.k8s-modules ] || ! cmp -s tests/deploy/k8s/go.sum tools/go/.k8s-modules; then
  (cd tests/deploy/k8s && go mod download)
  cp tests/deploy/k8s/go.sum tools/go/.k8s-modules
fi
