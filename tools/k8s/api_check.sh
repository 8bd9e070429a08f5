#!/usr/bin/env bash
# Every manifest ferry ships, checked by a real Kubernetes API server: etcd (Debian's
# etcd-server), kube-apiserver and kube-controller-manager (tools/k8s/binaries.sh) on
# loopback, with TLS and RBAC, and the ResourceQuota admission configured as GKE
# configures it (pods of the critical priority classes only in namespaces whose quota
# covers them). Then, for each Helm profile and for deploy/manifests and deploy/examples:
# `kubectl apply --dry-run=server --validate=strict` (the API server's own schema,
# defaulting and admission; PodMonitor against prometheus-operator's CRD), and the
# agent's pod, as the DaemonSet would create it, dry-run into the chart's namespace (its
# ResourceQuota admits the priority class) and into one without that quota (refused:
# the check can fail). Prints one line per check and `N passed, N failed`; exits non-zero
# on a failure. Needs root only to install etcd-server; everything else runs as the
# caller, under a scratch directory that is removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/setup.sh >&2
command -v etcd >/dev/null || {
  echo "k8s/api_check: installing etcd-server" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
}
bin=$(bash tools/k8s/binaries.sh kube-apiserver kube-controller-manager kubectl)
helm=$PWD/tools/go/bin/helm
crds=$(cd tests/deploy/k8s && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json \
  github.com/prometheus-operator/prometheus-operator@v0.62.0 | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
work=$(mktemp -d /tmp/fy.k8s.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Certificates: a CA, the API server's serving certificate, an admin client, the
# service-account signing key.
cd "$work"
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj "/CN=ferry-test-ca"
openssl_quiet req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default.svc\n' > san.ext
openssl_quiet x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 1 \
  -extfile san.ext
openssl_quiet req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/CN=admin/O=system:masters"
openssl_quiet x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 1
openssl_quiet genrsa -out sa.key 2048
openssl_quiet rsa -in sa.key -pubout -out sa.pub

cat > admission.yaml <<'YAML'
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ResourceQuota
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: PriorityClass
        operator: In
        values: ["system-node-critical", "system-cluster-critical"]
YAML

etcd_port=$(free_port)
etcd_peer=$(free_port)
api_port=$(free_port)
etcd --name ferry-test --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "ferry-test=http://127.0.0.1:$etcd_peer" > etcd.log 2>&1 &
pids+=($!)
"$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port="$api_port" --tls-cert-file=apiserver.crt \
  --tls-private-key-file=apiserver.key --client-ca-file=ca.crt --service-account-key-file=sa.pub \
  --service-account-signing-key-file=sa.key --service-account-issuer=https://kubernetes.default.svc \
  --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC --allow-privileged=true \
  --admission-control-config-file=admission.yaml > apiserver.log 2>&1 &
pids+=($!)
cat > kubeconfig <<YAML
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: $work/ca.crt}
users:
- name: admin
  user: {client-certificate: $work/admin.crt, client-key: $work/admin.key}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
YAML
export KUBECONFIG=$work/kubeconfig
chmod 600 kubeconfig
kubectl() { "$bin/kubectl" "$@"; }
for _ in $(seq 1 120); do
  kubectl get --raw=/readyz >/dev/null 2>&1 && break
  sleep 0.5
done
kubectl get --raw=/readyz >/dev/null || { tail -20 apiserver.log >&2; echo "k8s/api_check: the API server did not become ready" >&2; exit 1; }
# The quota controller fills a ResourceQuota's status, which its admission needs.
"$bin/kube-controller-manager" --kubeconfig="$KUBECONFIG" --controllers=resourcequota,namespace,serviceaccount \
  --bind-address=127.0.0.1 --secure-port=0 --service-account-private-key-file=sa.key --root-ca-file=ca.crt \
  --leader-elect=false > controller-manager.log 2>&1 &
pids+=($!)
echo "k8s/api_check: Kubernetes $("$bin/kube-apiserver" --version | cut -d' ' -f2) API server ready on 127.0.0.1:$api_port"
cd - >/dev/null

passed=0
failed=0
check() {  # check NAME COMMAND...: one line, PASS or FAIL with the command's output
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "PASS  $name"
    passed=$((passed + 1))
  else
    echo "FAIL  $name"
    printf '%s\n' "$out" | sed 's/^/      /'
    failed=$((failed + 1))
  fi
}
eventually() {  # the command, again for up to 10 s while it fails (caches catching up)
  local i
  for i in $(seq 1 20); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  "$@"
}
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

for profile in default gke-a3-ultra eks-p5; do
  rendered=$work/$profile.yaml
  values=()
  [ "$profile" = default ] || values=(-f "deploy/helm/ferry/values-$profile.yaml")
  "$helm" template ferry deploy/helm/ferry --namespace ferry "${values[@]}" > "$rendered"
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
    eventually kubectl create --dry-run=server -f "$work/pod.json"
  agent_pod "$rendered" no-quota > "$work/pod-elsewhere.json"
  if grep -q '"priorityClassName": "system-node-critical"' "$work/pod.json"; then
    check "helm profile $profile: the same pod refused in a namespace without that quota (as GKE refuses it)" \
      refused_for "insufficient quota" kubectl create --dry-run=server -f "$work/pod-elsewhere.json"
  fi
  kubectl delete -n ferry -f "$rendered" --wait=true >/dev/null
  [ "$sa" = default ] || kubectl delete serviceaccount -n no-quota "$sa" >/dev/null
done
for f in deploy/manifests/*.yaml; do
  check "$f (dry-run, strict)" dry_run -f "$f"
done
for f in deploy/examples/*.yaml; do
  check "$f (dry-run, strict)" dry_run -f "$f"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
