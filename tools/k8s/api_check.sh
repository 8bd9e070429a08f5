#!/usr/bin/env bash
# Every manifest ferry ships, checked by a real Kubernetes API server: etcd (Debian's
# etcd-server), kube-apiserver and kube-controller-manager (tools/k8s/binaries.sh) on
# loopback, with TLS and RBAC, and the ResourceQuota admission configured as GKE
# configures it (tools/k8s/lib.sh). Then, for each Helm profile, deploy/manifests and
# deploy/examples: `kubectl apply --dry-run=server --validate=strict` (the API server's own schema,
# defaulting and admission; PodMonitor against prometheus-operator's CRD), and the
# agent's pod, as the DaemonSet would create it, dry-run into the chart's namespace (its
# ResourceQuota admits the priority class) and into one without that quota (refused:
# the check can fail). The DRA profiles' ResourceClaimTemplate too (resource.k8s.io/v1):
# GKE's, which asks admin access to every GPU, is refused in a namespace without the
# admin-access label and accepted with it. Prints one line per check and `N passed, N failed`; exits non-zero
# on a failure. Needs root only to install etcd-server; everything else runs as the
# caller, under a scratch directory that is removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/setup.sh >&2
source tools/go_path.sh
bin=$(bash tools/k8s/binaries.sh kube-apiserver kube-controller-manager kubectl)
helm=$PWD/tools/go/bin/helm
crds=$(cd tests/deploy/k8s && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json \
  github.com/prometheus-operator/prometheus-operator@v0.62.0 | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
source tools/k8s/lib.sh
# The quota controller fills a ResourceQuota's status, which its admission needs.
start_control_plane resourcequota,namespace,serviceaccount

refused_for() {  # refused_for PATTERN COMMAND...: the command fails, saying PATTERN
  local pattern=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "accepted: $out"
    return 1
  fi
  grep -q "$pattern" <<<"$out" || { echo "refused, but not for \"$pattern\": $out"; return 1; }
}

check "prometheus-operator CRDs (v0.62.0) created" \
  kubectl create -f "$crds/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
  -f "$crds/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
kubectl wait --for=condition=Established --timeout=30s crd/podmonitors.monitoring.coreos.com \
  crd/servicemonitors.monitoring.coreos.com >/dev/null
kubectl create namespace ferry >/dev/null
kubectl create namespace no-quota >/dev/null
dry_run() { kubectl apply --dry-run=server --validate=strict "$@"; }

# The agent's pod as the DaemonSet makes it, from a rendered manifest's pod template.
agent_pod() {  # agent_pod RENDERED NAMESPACE
  python3 - "$1" "$2" <<'PY'
import json, sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "DaemonSet":
        t = doc["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "ferry-agent-check", "namespace": sys.argv[2],
                            "labels": t["metadata"].get("labels", {})},
               "spec": dict(t["spec"], nodeName="node-1")}
        print(json.dumps(pod))
PY
}

for profile in default gke-a3-ultra eks-p5 gke-dra eks-dra; do
  rendered=$work/$profile.yaml
  values=()
  [ "$profile" = default ] || values=(-f "deploy/helm/ferry/values-$profile.yaml")
  "$helm" template ferry deploy/helm/ferry --namespace ferry "${values[@]}" > "$rendered"
  if grep -q "adminAccess: true" "$rendered"; then
    kubectl label namespace ferry resource.kubernetes.io/admin-access- >/dev/null
    check "helm profile $profile: its admin-access GPU request refused in a namespace without the label" \
      refused_for "admin-access" dry_run -n ferry -f "$rendered"
    kubectl label namespace ferry resource.kubernetes.io/admin-access=true >/dev/null
  fi
  check "helm profile $profile: every object accepted by the API server (dry-run, strict)" dry_run -n ferry -f "$rendered"
  # Installed for real (no node: the DaemonSet makes no pod), so that the pod below
  # meets the chart's ServiceAccount and ResourceQuota.
  kubectl apply -n ferry -f "$rendered" >/dev/null
  for _ in $(seq 1 40); do
    [ -z "$(kubectl get resourcequota -n ferry -o name)" ] && break
    [ -n "$(kubectl get resourcequota -n ferry -o jsonpath='{.items[*].status.hard}')" ] && break
    sleep 0.25
  done
  sa=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["spec"].get("serviceAccountName", "default"))' \
    <(agent_pod "$rendered" ferry))
  [ "$sa" = default ] || kubectl create serviceaccount -n no-quota "$sa" >/dev/null
  agent_pod "$rendered" ferry > "$work/pod.json"
  check "helm profile $profile: the agent's pod admitted in namespace ferry (its quota covers the priority class)" \
    eventually 10 kubectl create --dry-run=server -f "$work/pod.json"
  agent_pod "$rendered" no-quota > "$work/pod-elsewhere.json"
  if grep -q '"priorityClassName": "system-node-critical"' "$work/pod.json"; then
    check "helm profile $profile: the same pod refused in a namespace without that quota (as GKE refuses it)" \
      refused_for "insufficient quota" kubectl create --dry-run=server -f "$work/pod-elsewhere.json"
  fi
  kubectl delete -n ferry -f "$rendered" --wait=true >/dev/null
  [ "$sa" = default ] || kubectl delete serviceaccount -n no-quota "$sa" >/dev/null
done
# With the CPU DRA driver: per NUMA node, a NIC request and a core request aligned by
# dra.net/numaNode (consumable capacity is alpha in 1.34: its fields are checked, not used).
"$helm" template ferry deploy/helm/ferry --namespace ferry -f deploy/helm/ferry/values-gke-dra.yaml \
  --set dra.cpuDeviceClassName=dra.cpu > "$work/gke-dra-cpu.yaml"
check "helm profile gke-dra with dra.cpu: every object accepted by the API server (dry-run, strict)" \
  dry_run -n ferry -f "$work/gke-dra-cpu.yaml"
for f in deploy/manifests/*.yaml; do
  check "$f (dry-run, strict)" dry_run -n ferry -f "$f"
done
for f in deploy/examples/*.yaml; do
  check "$f (dry-run, strict)" dry_run -n ferry -f "$f"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
