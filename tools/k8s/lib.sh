# A Kubernetes control plane on loopback for ferry's cluster checks (source it, from the
# repository root, with $bin holding tools/k8s/binaries.sh's directory):
#
#   bin=$(bash tools/k8s/binaries.sh kube-apiserver kube-controller-manager kubectl)
#   source tools/k8s/lib.sh
#   start_control_plane resourcequota,namespace,serviceaccount   # controllers to run
#   check "the chart renders objects the server accepts" kubectl apply --dry-run=server -f x.yaml
#   eventually 30 kubectl get node/node-1
#   echo "$passed passed, $failed failed"
#
# Debian's etcd (installed when missing; root), kube-apiserver with TLS, RBAC, privileged
# containers allowed (as GKE and EKS allow them) and the ResourceQuota admission
# configured as GKE configures it (pods of the critical priority classes only in
# namespaces whose quota covers them), and kube-controller-manager. Everything lives in
# $work (a short /tmp/fy.k8s.* directory) and its processes in $pids; both go on exit
# (KEEP_WORK=1 keeps the directory and its logs). cleanup_extra runs first at exit.

command -v etcd >/dev/null || {
  echo "k8s: installing etcd-server" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
}
work=$(mktemp -d /tmp/fy.k8s.XXXXXX)
pids=()
cleanup_extra() { :; }
cleanup() {
  cleanup_extra
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # What a kubelet mounted under $work (its root directory, pods' volumes).
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kubectl() { "$bin/kubectl" "$@"; }
export KUBECONFIG=$work/kubeconfig

# sign NAME SUBJECT [EXTFILE]: a key and a certificate signed by the test's CA, in $work.
sign() {
  openssl req -newkey rsa:2048 -nodes -keyout "$work/$1.key" -out "$work/$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -out "$work/$1.crt" -days 1 ${3:+-extfile "$3"} 2>/dev/null
}

# write_kubeconfig FILE USER: a kubeconfig for the API server at $api_server, as USER
# (the certificate sign made under that name).
write_kubeconfig() {
  cat > "$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$api_server", certificate-authority: $work/ca.crt}
users:
- name: $2
  user: {client-certificate: $work/$2.crt, client-key: $work/$2.key}
contexts:
- name: test
  context: {cluster: test, user: $2}
current-context: test
YAML
  chmod 600 "$1"
}

# check NAME COMMAND...: runs a check; one line, PASS, or FAIL with the end of its output.
passed=0
failed=0
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "PASS  $name"
    passed=$((passed + 1))
  else
    echo "FAIL  $name"
    printf '%s\n' "$out" | tail -n 30 | sed 's/^/      /'
    failed=$((failed + 1))
  fi
}

# eventually SECONDS COMMAND...: the command, again every half second while it fails
# (caches and controllers catching up); its last failure's output if it never succeeds.
eventually() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { "$@"; return 1; }
    sleep 0.5
  done
}

start_control_plane() {  # start_control_plane CONTROLLERS
  local etcd_port etcd_peer api_port i
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/ca.key" -out "$work/ca.crt" -days 1 \
    -subj "/CN=ferry-test-ca" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default.svc\n' > "$work/san.ext"
  sign apiserver "/CN=kube-apiserver" "$work/san.ext"
  sign admin "/CN=admin/O=system:masters"
  openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
  openssl rsa -in "$work/sa.key" -pubout -out "$work/sa.pub" 2>/dev/null
  cat > "$work/admission.yaml" <<'YAML'
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
    --initial-cluster "ferry-test=http://127.0.0.1:$etcd_peer" > "$work/etcd.log" 2>&1 &
  pids+=($!)
  "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 --secure-port="$api_port" --tls-cert-file="$work/apiserver.crt" \
    --tls-private-key-file="$work/apiserver.key" --client-ca-file="$work/ca.crt" \
    --kubelet-client-certificate="$work/admin.crt" --kubelet-client-key="$work/admin.key" \
    --service-account-key-file="$work/sa.pub" --service-account-signing-key-file="$work/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.96.0.0/24 \
    --authorization-mode=Node,RBAC --allow-privileged=true --kubelet-preferred-address-types=InternalIP \
    --admission-control-config-file="$work/admission.yaml" > "$work/apiserver.log" 2>&1 &
  pids+=($!)
  api_server=https://127.0.0.1:$api_port
  write_kubeconfig "$KUBECONFIG" admin
  for i in $(seq 1 120); do
    kubectl get --raw=/readyz >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! kubectl get --raw=/readyz >/dev/null; then
    tail -20 "$work/apiserver.log" >&2
    echo "k8s: the API server did not become ready" >&2
    return 1
  fi
  "$bin/kube-controller-manager" --kubeconfig="$KUBECONFIG" --controllers="$1" --bind-address=127.0.0.1 \
    --secure-port=0 --service-account-private-key-file="$work/sa.key" --root-ca-file="$work/ca.crt" \
    --use-service-account-credentials=false --leader-elect=false > "$work/controller-manager.log" 2>&1 &
  pids+=($!)
  echo "k8s: Kubernetes $("$bin/kube-apiserver" --version | cut -d' ' -f2) API server ready on 127.0.0.1:$api_port"
}
