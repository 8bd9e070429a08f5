#!/usr/bin/env bash
# Builds ferry's agent image with podman on Debian 12, with no image registry: the Debian
# base is made here with mmdebstrap (once per machine) and tagged with the names
# deploy/Dockerfile uses.
#   tools/image.sh                 ferry/ferryd:<chart appVersion> from this tree's own
#                                  -c opt build (Dockerfile target `prebuilt`)
#   tools/image.sh --from-source   the same image built as users build it (target
#                                  `runtime`: Bazel runs inside the build stage, ~15 min)
# FERRY_IMAGE_FERRYD and FERRY_IMAGE_FERRYCTL, when set, are the prebuilt binaries to put
# in the image (a Bazel test's data); else this builds them. Prints the image's name last.
set -euo pipefail
cd "$(dirname "$0")/.."
target=prebuilt
for arg in "$@"; do
  case $arg in
    --from-source) target=runtime ;;
    *) echo "image.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# podman and its helpers (Debian's), set up for these VMs: podman asks for nofile and
# nproc limits above this machine's hard limits, and crun 1.8 refuses its hybrid cgroups.
need=()
for p in podman buildah mmdebstrap runc uidmap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -ne 0 ]; then
  echo "image: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
conf=/etc/containers/containers.conf
if ! grep -q '^runtime = "runc"' "$conf" 2>/dev/null; then
  mkdir -p /etc/containers
  cat >>"$conf" <<'EOF'
# ferry tools/image.sh: this machine's limits and cgroup layout.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
fi

if ! podman image exists docker.io/library/debian:bookworm; then
  echo "image: making the debian:bookworm base with mmdebstrap (once per machine, ~1-2 min)" >&2
  tar=$(mktemp /tmp/ferry-debian.XXXXXX.tar)
  mmdebstrap --quiet --variant=minbase --mode=root bookworm "$tar"
  podman import --quiet "$tar" docker.io/library/debian:bookworm >/dev/null
  podman tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim
  rm -f "$tar"
fi

version=$(awk -F'"' '/^appVersion:/ {print $2}' deploy/helm/ferry/Chart.yaml)
image=ferry/ferryd:$version
if [ "$target" = prebuilt ]; then
  ferryd=${FERRY_IMAGE_FERRYD:-} ferryctl=${FERRY_IMAGE_FERRYCTL:-}
  if [ -z "$ferryd" ]; then
    bash tools/setup.sh --roles=build
    bazel build -c opt //agent/main:ferryd //tools/ferryctl 2>&1 | tail -n 1 >&2
    bin=$(bazel info -c opt bazel-bin 2>/dev/null)
    ferryd=$bin/agent/main/ferryd ferryctl=$bin/tools/ferryctl/ferryctl
  fi
  rm -rf .image-bin && mkdir -p .image-bin
  cp "$ferryd" "$ferryctl" .image-bin/
fi
# The build stage fetches cuda.h from PyPI: behind a proxy that re-signs TLS it must trust
# the CAs this machine added (the stage's ca-certificates takes them from there when it is
# installed, so its cached layer is not reused).
extra_ca=()
if [ "$target" = runtime ] && [ -n "$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null)" ]; then
  extra_ca=(--no-cache --volume /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
fi
podman build --quiet --pull=never --network=host "${extra_ca[@]}" -f deploy/Dockerfile --target "$target" \
  -t "$image" . >&2
echo "$image"
