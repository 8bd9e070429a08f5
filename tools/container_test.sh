#!/usr/bin/env bash
# The agent's image run as the chart's rendered DaemonSet runs it (podman, as root):
# tools/image.sh builds the image, then tests/deploy/container/pod_test.py plays each
# profile's rendered pod with two workload containers. ~1 minute per profile after the
# image (the first run on a machine also makes the Debian base, ~2 minutes).
#   tools/container_test.sh [--profile=default|gke-a3-ultra|eks-p5|gke-dra|eks-dra ...]
#   bazel test //deploy:container_test   as tools/test.sh runs it: the binaries are its data
#                                        (FERRYD, FERRYCTL, FERRY_POD_WORKLOAD)
set -euo pipefail
if [ -n "${FERRYD:-}" ]; then
  FERRY_IMAGE_FERRYD=$(realpath "$FERRYD") FERRY_IMAGE_FERRYCTL=$(realpath "$FERRYCTL")
  workload=$(realpath "$FERRY_POD_WORKLOAD")
  export FERRY_IMAGE_FERRYD FERRY_IMAGE_FERRYCTL  # tools/image.sh puts them in the image
  cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, from Bazel's runfiles
else
  cd "$(dirname "$0")/.."
fi
profiles=()
for arg in "$@"; do
  case $arg in
    --profile=*) profiles+=(--profile "${arg#--profile=}") ;;
    *) echo "container_test: unknown argument $arg" >&2; exit 2 ;;
  esac
done
bash tools/setup.sh
image=$(bash tools/image.sh | tail -n 1)
if [ -z "${workload:-}" ]; then
  bazel build //tests/deploy/container:pod_workload 2>&1 | tail -n 1
  workload=$(bazel info bazel-bin 2>/dev/null)/tests/deploy/container/pod_workload
fi
python3 tests/deploy/container/pod_test.py --image "$image" --workload "$workload" \
  --helm "$PWD/tools/go/bin/helm" --health_probe "$PWD/tools/go/bin/grpc-health-probe" "${profiles[@]}"
