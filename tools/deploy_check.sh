#!/usr/bin/env bash
# The deployment checks, offline: helm lint of the chart
# with each profile, then tests/deploy/k8s (go test): every object the chart renders, and
# every example, decoded strictly into the Kubernetes API types (an unknown or misspelled
# field fails), deploy/manifests equal to the chart's rendering, and the invariants
# between the agent, the chart and the example pods. Needs a built ferryd (its --helpfull
# lists the flags the ConfigMap may use): FERRYD=path, default bazel-bin/agent/main/ferryd.
# `bazel test //deploy:k8s_check` runs it with ferryd as the test's data.
set -euo pipefail
ferryd=$(realpath "${FERRYD:-$(dirname "$0")/../bazel-bin/agent/main/ferryd}")
cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, also from Bazel's runfiles
bash tools/setup.sh
source tools/go_path.sh
helm=$PWD/tools/go/bin/helm
for values in "" values-gke-a3-ultra.yaml values-eks-p5.yaml values-gke-dra.yaml values-eks-dra.yaml; do
  echo "== helm lint deploy/helm/ferry ${values}"
  "$helm" lint --strict deploy/helm/ferry ${values:+-f deploy/helm/ferry/$values}
done
echo "== go test ./tests/deploy/k8s"
cd tests/deploy/k8s
HELM=$helm FERRYD=$ferryd GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPROXY=off go test -count=1 -v ./... 2>&1 |
  grep -vE '^=== (RUN|PAUSE|CONT)'
exit "${PIPESTATUS[0]}"
