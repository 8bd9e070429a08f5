// dra-nic-driver: a DRA kubelet plugin for ferry's node test (tools/k8s/node_e2e.sh).
//
// It publishes, in its node's ResourceSlice, the devices of a JSON file: names and
// attributes as GKE's managed DRANet publishes RDMA NICs (dra.net/ifName,
// dra.net/rdmaDevice, dra.net/numaNode, resource.kubernetes.io/pcieRoot, ...). The
// scheduler allocates them to claims like any driver's devices; kubelet asks this plugin
// to prepare them before the pod's containers start. Preparing changes nothing in the
// container (no CDI edits): the test's "NICs" are interfaces the pod already has, and
// what is tested is that the claim is allocated and that ferry reads its attributes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

type nicDriver struct{ name string }

func (d nicDriver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		if c.Status.Allocation != nil {
			for _, res := range c.Status.Allocation.Devices.Results {
				if res.Driver == d.name {
					r.Devices = append(r.Devices, kubeletplugin.Device{PoolName: res.Pool, DeviceName: res.Device, Requests: []string{res.Request}})
				}
			}
		}
		log.Printf("prepared claim %s/%s: %d devices", c.Namespace, c.Name, len(r.Devices))
		out[c.UID] = r
	}
	return out, nil
}

func (d nicDriver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		log.Printf("unprepared claim %s", c.NamespacedName)
		out[c.UID] = nil
	}
	return out, nil
}

func (d nicDriver) HandleError(ctx context.Context, err error, msg string) { log.Printf("%s: %v", msg, err) }

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the API server's kubeconfig")
	nodeName := flag.String("node-name", "", "the node whose devices these are")
	driverName := flag.String("driver", "dra.net", "the driver's name (the devices' attribute domain)")
	devicesFile := flag.String("devices", "", "JSON list of resource.k8s.io/v1 Device objects to publish")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "kubelet's plugin registration directory")
	pluginsDir := flag.String("plugins-dir", kubeletplugin.KubeletPluginsDir, "kubelet's plugin data directory")
	flag.Parse()

	var devices []resourceapi.Device
	raw, err := os.ReadFile(*devicesFile)
	if err == nil {
		err = json.Unmarshal(raw, &devices)
	}
	if err != nil {
		log.Fatalf("--devices: %v", err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("--kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(config)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dataDir := filepath.Join(*pluginsDir, *driverName)
	if err := os.MkdirAll(dataDir, 0750); err != nil {
		log.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, nicDriver{*driverName},
		kubeletplugin.DriverName(*driverName), kubeletplugin.NodeName(*nodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(dataDir), kubeletplugin.RegistrarDirectoryPath(*registryDir))
	if err != nil {
		log.Fatalf("start: %v", err)
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*nodeName: pool}}); err != nil {
		log.Fatalf("publish: %v", err)
	}
	log.Printf("%s on node %s: %d devices published", *driverName, *nodeName, len(devices))
	<-ctx.Done()
}
