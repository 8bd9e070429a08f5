#!/usr/bin/env bash
# ferry on one real Kubernetes node: the control plane of tools/k8s/lib.sh with every
# controller and kube-scheduler, Debian's containerd 1.6 (CRI, runc, cgroupfs,
# restrict_oom_score_adj) and kubelet v1.34 (cgroup v1), the agent's image
# (tools/image.sh) imported with `ctr images import`. Then, per Helm profile given
# (default: the chart's defaults):
#   - `helm install`; the DaemonSet's pod becomes Ready through its own probes;
#   - two serving pods, run as deploy/examples tells users to run them (non-root, the
#     socket group, the hostPath socket directory), move bytes through the agent
#     (tests/deploy/container/pod_workload: every byte checked);
#   - `helm upgrade` changing a flag rolls the agent while a pod writes through it: the
#     pod's call fails with UNAVAILABLE, it reconnects and writes on, every byte checked;
#   - `helm uninstall` leaves no pod, and no socket in the node's socket directory.
# The DRA profile (gke-dra) runs beside a DRA driver of the test's (tools/k8s/dra_nic_driver)
# that publishes NIC-like devices with GKE DRANet's attributes, one RDMA-capable and
# one not, under DeviceClass mrdma.google.com as GKE defines it (RDMA devices of dra.net):
# the agent's claim must be allocated the RDMA one, its init container must read it
# through the API server (reached at the kubernetes Service's address, as in any pod),
# and `ferryctl topology` must show the claim's PCIe root and NUMA node on the agent's NIC.
# Runs as root on a machine that may run containers (podman's setup, tools/image.sh);
# nothing outside its scratch directory is left behind except the kubelet's cgroups.
#   tools/k8s/node_e2e.sh [PROFILE...]      default, gke-a3-ultra, eks-p5, gke-dra (all when none)
# Prints a line per check and `N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/../.."
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(default gke-a3-ultra eks-p5 gke-dra)
bash tools/setup.sh >&2
command -v containerd >/dev/null || {
  echo "k8s: installing containerd" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd >/dev/null
}
image=$(bash tools/image.sh | tail -n 1)
bazel build //tests/deploy/container:pod_workload //tools/ferryctl 2>&1 | tail -n 1 >&2
workload=$(realpath bazel-bin/tests/deploy/container/pod_workload)
ferryctl=$(realpath bazel-bin/tools/ferryctl/ferryctl)
bin=$(bash tools/k8s/binaries.sh kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl dra-nic-driver)
helm=$PWD/tools/go/bin/helm
source tools/k8s/lib.sh
start_control_plane '*'
"$bin/kube-scheduler" --kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
  > "$work/scheduler.log" 2>&1 &
pids+=($!)

# The node's container runtime, all its state in $work.
node=$work/node
mkdir -p "$node/cni" "$node/exchange" "$node/run-ferry"
chmod 1777 "$node/exchange"
cat > "$node/cni/10-bridge.conflist" <<'JSON'
{"cniVersion": "0.4.0", "name": "ferry-test", "plugins": [
  {"type": "bridge", "bridge": "fytest0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "10.96.0.0/24"}]}},
  {"type": "loopback"}]}
JSON
cat > "$node/containerd.toml" <<TOML
version = 2
root = "$node/containerd/root"
state = "$node/containerd/state"
[grpc]
  address = "$node/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/ferry-test/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node/cni"
TOML
containerd --config "$node/containerd.toml" > "$work/containerd.log" 2>&1 &
pids+=($!)
ctr() { command ctr --address "$node/containerd.sock" -n k8s.io "$@"; }
for _ in $(seq 1 40); do ctr version >/dev/null 2>&1 && break; sleep 0.25; done
# The pod sandbox's image: no registry is reachable, so a process that waits, on the
# Debian base tools/image.sh made.
printf 'FROM docker.io/library/debian:bookworm-slim\nENTRYPOINT ["sleep", "infinity"]\n' |
  podman build --quiet --pull=never -t localhost/ferry-test/pause:1 -f - "$node" >/dev/null
for i in localhost/ferry-test/pause:1 "$image"; do
  podman save --quiet "$i" | ctr images import --all-platforms - >/dev/null
done
ctr images tag "localhost/$image" "docker.io/$image" >/dev/null 2>&1 || true

# The node's address: kubelet refuses a loopback one, so one end of a veth pair of the
# test's (deleting one end deletes both).
node_ip=10.250.0.1
ip link add fy-node0 type veth peer name fy-node1
ip addr add "$node_ip/32" dev fy-node0
ip link set fy-node0 up
ip link set fy-node1 up
sign kubelet "/CN=system:node:node-1/O=system:nodes"
kubelet_port=$(free_port)
write_kubeconfig "$node/kubelet.kubeconfig" kubelet
cat > "$node/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $work/ca.crt}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$node/containerd.sock
resolvConf: ""
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
localStorageCapacityIsolation: false
YAML
"$bin/kubelet" --kubeconfig="$node/kubelet.kubeconfig" --config="$node/kubelet.yaml" --root-dir="$node/kubelet" \
  --hostname-override=node-1 --node-ip="$node_ip" > "$work/kubelet.log" 2>&1 &
pids+=($!)
cleanup_extra() {
  cleanup_node_fakes
  # The containers outlive containerd and kubelet: kill them and their shims first.
  local t
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  sleep 1
  pkill -f "containerd-shim-runc-v2 .*-address $node/containerd.sock" 2>/dev/null || true
  ip link delete fytest0 2>/dev/null || true
  ip link delete fy-node0 2>/dev/null || true
  [ -z "${service_nat:-}" ] || iptables -t nat -D PREROUTING $service_nat 2>/dev/null || true
}

eventually 60 kubectl get node/node-1 || true
check "node-1 Ready (kubelet $("$bin/kubelet" --version | cut -d' ' -f2), containerd $(containerd --version | cut -d' ' -f3))" \
  kubectl wait --for=condition=Ready node/node-1 --timeout=90s

serving_pod() {  # serving_pod NAME ROLE EXCHANGE [ARGS]: a pod as deploy/examples' decode pod runs, playing ROLE
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, supplementalGroups: [2000]}
  containers:
  - name: $2
    image: docker.io/$image
    imagePullPolicy: Never
    command: [/opt/ferry-test/pod_workload]
    args: [--role=$2, ${4:---bytes=33554432, --rounds=4, --wait_seconds=60}]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: ferry, mountPath: /run/ferry}
    - {name: exchange, mountPath: /exchange}
    - {name: workload, mountPath: /opt/ferry-test/pod_workload, readOnly: true}
  volumes:
  - {name: ferry, hostPath: {path: $node/run-ferry, type: Directory}}
  - {name: exchange, hostPath: {path: $3, type: Directory}}
  - {name: workload, hostPath: {path: $workload, type: File}}
YAML
}

# What a profile's node has and this one lacks, made up as little as possible: the GKE and
# EKS nodes' labels, EKS's EFA devices as the extended resource the device plugin would
# advertise, and for every NIC they name this node's address (no RDMA NIC here); their
# CPU and huge-page requests are lowered to what 2 cores without huge pages can give.
made_dev_infiniband=""
cleanup_node_fakes() { [ -z "$made_dev_infiniband" ] || rmdir /dev/infiniband 2>/dev/null || true; }
# What GKE's managed DRANet would publish and define, for gke-dra: a DRA driver on the
# node (its NICs are the pod's own eth0, and an eth1 without RDMA the class must not
# select), the mrdma.google.com DeviceClass, and the kubernetes Service's address routed
# to the API server as kube-proxy would (DNAT from the pods' bridge to loopback).
dra_driver_started=""
start_dra_driver() {
  [ -z "$dra_driver_started" ] || return 0
  dra_driver_started=1
  cat > "$node/nics.json" <<'JSON'
[{"name": "pci-0000-91-00-0", "attributes": {
   "dra.net/ifName": {"string": "eth0"}, "dra.net/rdma": {"bool": true}, "dra.net/rdmaDevice": {"string": "mlx5_0"},
   "dra.net/pciAddress": {"string": "0000:91:00.0"}, "dra.net/numaNode": {"int": 0},
   "resource.kubernetes.io/pcieRoot": {"string": "pci0000:8c"}}},
 {"name": "pci-0000-05-00-0", "attributes": {
   "dra.net/ifName": {"string": "eth1"}, "dra.net/rdma": {"bool": false}, "dra.net/numaNode": {"int": 1},
   "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"}}}]
JSON
  "$bin/dra-nic-driver" --kubeconfig="$KUBECONFIG" --node-name=node-1 --driver=dra.net --devices="$node/nics.json" \
    --registry-dir="$node/kubelet/plugins_registry" --plugins-dir="$node/kubelet/plugins" \
    > "$work/dra-nic-driver.log" 2>&1 &
  pids+=($!)
  kubectl apply -f - >/dev/null <<'YAML'
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mrdma.google.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "dra.net" && device.attributes["dra.net"].rdma'}
YAML
  ip link show fytest0 >/dev/null 2>&1 || ip link add fytest0 type bridge  # the CNI plugin takes it over
  sysctl -qw net.ipv4.conf.fytest0.route_localnet=1
  service_nat="-i fytest0 -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 127.0.0.1:${api_server##*:}"
  iptables -t nat -A PREROUTING $service_nat
  check "gke-dra: the DRA driver's devices published (ResourceSlice of node-1)" eventually 30 bash -c \
    "$(declare -f kubectl); bin=$bin; kubectl get resourceslices -o jsonpath='{.items[*].spec.devices[*].name}' | grep -q pci-0000-91-00-0"
}
node_like() {  # node_like PROFILE: makes the node like PROFILE's and adds the flags it needs to $values
  case $1 in
    default) return ;;
    gke-a3-ultra)
      kubectl label node node-1 --overwrite cloud.google.com/gke-accelerator=nvidia-h200-141gb >/dev/null
      if [ ! -e /dev/infiniband ]; then mkdir /dev/infiniband && made_dev_infiniband=1; fi
      mkdir -p "$node/nvidia"
      values+=(--set "gpu.driverHostPath=$node/nvidia") ;;
    eks-p5)
      kubectl label node node-1 --overwrite node.kubernetes.io/instance-type=p5.48xlarge >/dev/null
      kubectl patch node node-1 --subresource=status --type=json \
        -p '[{"op": "add", "path": "/status/capacity/vpc.amazonaws.com~1efa", "value": "32"}]' >/dev/null
      values+=(--set resources.requests.hugepages-2Mi=null --set resources.limits.hugepages-2Mi=null) ;;
    gke-dra)
      kubectl label node node-1 --overwrite cloud.google.com/gke-accelerator=nvidia-h200-141gb >/dev/null
      mkdir -p "$node/nvidia"
      start_dra_driver
      # No GPU DRA driver here: no admin-access GPU request (api_check.sh checks it).
      values+=(--set "gpu.driverHostPath=$node/nvidia" --set dra.gpuDeviceClassName=
               --set fabric.provider=auto --set resources.requests.cpu=500m --set resources.requests.memory=1Gi)
      return ;;
  esac
  values+=(--set fabric.provider=auto --set "fabric.ifaces={$node_ip}" --set fabric.discoverRdmaDevices=false
           --set resources.requests.cpu=500m --set resources.requests.memory=1Gi)
}

for profile in "${profiles[@]}"; do
  values=()
  [ "$profile" = default ] || values=(-f "deploy/helm/ferry/values-$profile.yaml")
  node_like "$profile"
  check "$profile: helm install" "$helm" install ferry deploy/helm/ferry --namespace ferry --create-namespace \
    "${values[@]}" --set socketDir="$node/run-ferry" --set podMonitor.enabled=false --wait=false
  check "$profile: the agent's pod Ready through its probes" bash -c "
    $(declare -f eventually kubectl); bin=$bin
    eventually 60 test -n \"\$(kubectl -n ferry get pods -o name)\" &&
    kubectl -n ferry wait --for=condition=Ready pod --all --timeout=120s"
  if [ "$(kubectl -n ferry get pods -o jsonpath='{.items[0].status.phase}' 2>/dev/null)" != Running ]; then
    kubectl -n ferry describe pods | tail -n 30 | sed 's/^/      /'
  fi
  if [ "$profile" = gke-dra ]; then
    check "gke-dra: the agent's claim allocated the RDMA NIC alone (allocationMode All, the class's selector)" \
      test "$(kubectl -n ferry get resourceclaims -o jsonpath='{.items[*].status.allocation.devices.results[*].device}')" \
      = pci-0000-91-00-0
    kubectl -n ferry logs -l app.kubernetes.io/name=ferry -c claimed-devices 2>&1 | sed 's/^/      claimed-devices: /'
    "$ferryctl" --socket="$node/run-ferry/ferry.sock" topology > "$work/topology.txt" 2>&1 || true
    check "gke-dra: ferryctl topology shows the claimed NIC with the claim's PCIe root and NUMA node" \
      grep -Eq "^nic0 +mlx5_0 +eth0 +0000:91:00.0 +pci0000:8c +0 +fi_sockaddr_in://10.244." "$work/topology.txt"
    check "gke-dra: ... and names the device it was claimed as" \
      grep -Eq "^  nic0 +<- dra.net/node-1/pci-0000-91-00-0$" "$work/topology.txt"
    sed 's/^/      topology: /' "$work/topology.txt"
  fi
  exchange=$node/exchange/$profile
  mkdir -p "$exchange" && chmod 1777 "$exchange"
  serving_pod "receiver-$profile" receiver "$exchange" | kubectl apply -f - >/dev/null
  serving_pod "sender-$profile" sender "$exchange" | kubectl apply -f - >/dev/null
  check "$profile: two serving pods moved 32 MiB x 4 through the agent, every byte checked" \
    bash -c "kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/sender-$profile pod/receiver-$profile \
      --timeout=120s && kubectl logs receiver-$profile"
  kubectl logs "receiver-$profile" 2>/dev/null | tail -n 3 | sed 's/^/      receiver: /'
  kubectl logs "sender-$profile" 2>/dev/null | tail -n 3 | sed 's/^/      sender: /'
  kubectl delete pod "receiver-$profile" "sender-$profile" --wait=true >/dev/null 2>&1 || true
  # A flag changed by `helm upgrade` rolls the agent (the ConfigMap's checksum) while a
  # pod writes through it: the pod's call in flight fails with UNAVAILABLE, it
  # reconnects to the new agent, registers again and writes on, every byte checked.
  serving_pod writer writer "$exchange" "--bytes=8388608, --rounds_after_restart=10, --wait_seconds=240" |
    kubectl apply -f - >/dev/null
  eventually 60 bash -c "$(declare -f kubectl); bin=$bin; kubectl logs writer | grep -q 'first round done'" || true
  old_agent=$(kubectl -n ferry get pods -o name)
  check "$profile: helm upgrade rolls the agent while a pod writes" bash -c "
    $(declare -f kubectl); bin=$bin
    $helm upgrade ferry deploy/helm/ferry --namespace ferry ${values[*]} --set socketDir=$node/run-ferry \
      --set podMonitor.enabled=false --set 'extraFlags={--transfer_timeout_ms=31000}' --wait=false &&
    kubectl -n ferry rollout status ds/ferry --timeout=180s &&
    test \"\$(kubectl -n ferry get pods -o name)\" != $old_agent"
  if [ "$(kubectl -n ferry get pods -o name)" = "$old_agent" ] || ! kubectl -n ferry wait --for=condition=Ready pod --all \
    --timeout=1s >/dev/null 2>&1; then
    kubectl -n ferry describe pods | grep -A12 "^Events:" | sed 's/^/      /'
  fi
  check "$profile: the writing pod's call failed with UNAVAILABLE, it reconnected and wrote on, every byte checked" \
    bash -c "$(declare -f kubectl); bin=$bin
      kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/writer --timeout=240s &&
      kubectl logs writer | grep -q 'failed: UNAVAILABLE'"
  kubectl logs writer 2>&1 | tail -n 4 | sed 's/^/      writer: /'
  kubectl delete pod writer --wait=true >/dev/null 2>&1 || true
  check "$profile: helm uninstall" "$helm" uninstall ferry --namespace ferry --wait
  check "$profile: the agent's pod gone and its sockets removed" bash -c \
    "kubectl -n ferry wait --for=delete pod --all --timeout=60s && test -z \"\$(ls -A $node/run-ferry)\""
  if [ "$profile" = gke-dra ]; then
    check "gke-dra: the pod's claim deleted with it" eventually 30 test -z "$(kubectl -n ferry get resourceclaims -o name)"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
