#!/usr/bin/env bash
# Prints the directory of the Kubernetes binaries ferry's cluster checks run: those named
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
# dra-nic-driver; all when none is named), each built once per machine from the Go
# module proxy, under nice, into a cache outside the repository ($FERRY_CACHE, default
# ~/.cache/ferry/k8s-$K8S_VERSION; all six took 7 minutes on the 2-core VM).
# k8s.io/kubernetes is not meant to be required as a module, so a wrapper module pins each
# of its staging modules (k8s.io/api, client-go, ...) to the matching v0 release, the
# replacements its own go.mod makes with local paths. dra-nic-driver is ferry's DRA
# kubelet plugin for the node test (tools/k8s/dra_nic_driver), built in the same module:
# it publishes NIC-like devices with the attributes it is given. 1.34 is the last
# release that still runs on cgroup v1 with Debian 12's containerd 1.6.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.34.4}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../go_path.sh"
out=${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-$K8S_VERSION
declare -A package=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kubectl]=k8s.io/kubernetes/cmd/kubectl [dra-nic-driver]=ferry.dev/k8sbuild/dra-nic-driver
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl dra-nic-driver)
missing=()
for n in "${names[@]}"; do
  [ -n "${package[$n]:-}" ] || { echo "k8s/binaries: no binary named $n" >&2; exit 2; }
  [ -x "$out/bin/$n" ] || missing+=("$n")
done
# The driver is rebuilt when its source changes.
if [ -x "$out/bin/dra-nic-driver" ] && ! cmp -s "$here/dra_nic_driver/main.go" "$out/src/dra-nic-driver/main.go"; then
  [[ " ${names[*]} " == *" dra-nic-driver "* ]] && missing+=(dra-nic-driver)
fi
if [ ${#missing[@]} -gt 0 ]; then
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local
  mkdir -p "$out/bin" "$out/src/dra-nic-driver"
  cp "$here/dra_nic_driver/main.go" "$out/src/dra-nic-driver/main.go"
  cd "$out/src"
  if [ ! -f go.mod ]; then
    echo "k8s/binaries: a module for Kubernetes $K8S_VERSION in $out/src (once per machine)" >&2
    dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir" ] || { echo "k8s/binaries: could not download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
    {
      echo "module ferry.dev/k8sbuild"
      echo
      echo "go $(sed -n 's/^go //p' "$dir/go.mod")"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      sed -n 's|^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*|replace \1 => \1 v0.'"${K8S_VERSION#v1.}"'|p' "$dir/go.mod"
    } > go.mod
  fi
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for n in "${!package[@]}"; do
      [[ ${package[$n]} == k8s.io/* ]] && printf '\t_ "%s"\n' "${package[$n]}"
    done
    printf ')\n'
  } > tools.go
  nice -n 19 go mod tidy >&2
  for n in "${missing[@]}"; do
    echo "k8s/binaries: building $n $K8S_VERSION" >&2
    CGO_ENABLED=0 nice -n 19 go build -trimpath \
      -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION" \
      -o "$out/bin/$n.tmp" "${package[$n]}" >&2
    mv "$out/bin/$n.tmp" "$out/bin/$n"
  done
fi
echo "$out/bin"
