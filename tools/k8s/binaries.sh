#!/usr/bin/env bash
# Prints the directory of the Kubernetes binaries ferry's cluster test runs on: the
# control plane (kube-apiserver, kube-controller-manager, kube-scheduler), kubelet,
# kubectl and Kubernetes' own DRA test driver (test/e2e/dra/test-driver, which publishes
# ResourceSlices of made-up devices with the attributes a test gives it). Built once per
# machine from the Go module proxy, under nice, into a cache outside the repository
# ($FERRY_CACHE, default ~/.cache/ferry/k8s-$K8S_VERSION): k8s.io/kubernetes is not meant
# to be required as a module, so a wrapper module pins each of its staging modules
# (k8s.io/api, client-go, ...) to the matching v0 release, the replacements its own go.mod
# makes with local paths. 1.34 is the last release that still runs on cgroup v1 with
# Debian 12's containerd 1.6.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.34.4}
out=${FERRY_CACHE:-$HOME/.cache/ferry}/k8s-$K8S_VERSION
commands=(cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl
          test/e2e/dra/test-driver)
if [ -f "$out/.complete" ]; then
  echo "$out/bin"
  exit 0
fi
echo "k8s/binaries: building Kubernetes $K8S_VERSION into $out (once per machine, ~30-45 minutes on 2 cores)" >&2
rm -rf "$out"
mkdir -p "$out/src" "$out/bin"
cd "$out/src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "k8s/binaries: could not download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
staging_version=v0.${K8S_VERSION#v1.}
{
  echo "module ferry.dev/k8sbuild"
  echo
  echo "go $(sed -n 's/^go //p' "$dir/go.mod")"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  sed -n 's|^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*|replace \1 => \1 '"$staging_version"'|p' "$dir/go.mod"
} > go.mod
printf 'package tools\n\nimport (\n' > tools.go
for c in "${commands[@]}"; do printf '\t_ "k8s.io/kubernetes/%s"\n' "$c" >> tools.go; done
printf ')\n' >> tools.go
sed -i '1i //go:build tools\n' tools.go
nice -n 19 go mod tidy >&2
for c in "${commands[@]}"; do
  name=$(basename "$c")
  [ "$name" = test-driver ] && name=dra-test-driver
  echo "k8s/binaries: $name" >&2
  CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION" \
    -o "$out/bin/$name" "k8s.io/kubernetes/$c" >&2
done
touch "$out/.complete"
echo "$out/bin"
