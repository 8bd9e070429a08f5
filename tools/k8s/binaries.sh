#!/usr/bin/env bash
# Prints the directory of the Kubernetes binaries ferry's cluster checks run: those named
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
# dra-test-driver; all when none is named), each built once per machine from the Go
# module proxy, under nice, into a cache outside the repository ($FERRY_CACHE, default
# ~/.cache/ferry/k8s-$K8S_VERSION; all six took 7 minutes on the 2-core VM).
# k8s.io/kubernetes is not meant to be required as a module, so a wrapper module pins each
# of its staging modules (k8s.io/api, client-go, ...) to the matching v0 release, the
# replacements its own go.mod makes with local paths. dra-test-driver is Kubernetes' own
# test DRA driver (test/e2e/dra/test-driver): it publishes ResourceSlices of made-up
# devices with the attributes it is given. 1.34 is the last release that still runs on
# cgroup v1 with Debian 12's containerd 1.6.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.34.4}
out=${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-$K8S_VERSION
declare -A package=(
  [kube-apiserver]=cmd/kube-apiserver [kube-controller-manager]=cmd/kube-controller-manager
  [kube-scheduler]=cmd/kube-scheduler [kubelet]=cmd/kubelet [kubectl]=cmd/kubectl
  [dra-test-driver]=test/e2e/dra/test-driver
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl dra-test-driver)
missing=()
for n in "${names[@]}"; do
  [ -n "${package[$n]:-}" ] || { echo "k8s/binaries: no binary named $n" >&2; exit 2; }
  [ -x "$out/bin/$n" ] || missing+=("$n")
done
if [ ${#missing[@]} -gt 0 ]; then
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local
  mkdir -p "$out/bin" "$out/src"
  cd "$out/src"
  if [ ! -f go.sum ]; then
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
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for n in "${!package[@]}"; do printf '\t_ "k8s.io/kubernetes/%s"\n' "${package[$n]}"; done
      printf ')\n'
    } > tools.go
    nice -n 19 go mod tidy >&2
  fi
  for n in "${missing[@]}"; do
    echo "k8s/binaries: building $n $K8S_VERSION" >&2
    CGO_ENABLED=0 nice -n 19 go build -trimpath \
      -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION" \
      -o "$out/bin/$n.tmp" "k8s.io/kubernetes/${package[$n]}" >&2
    mv "$out/bin/$n.tmp" "$out/bin/$n"
  done
fi
echo "$out/bin"
