// Package k8s checks the Helm chart and the examples offline: every rendered object is
// decoded strictly into the Kubernetes API types (unknown fields rejected), the committed
// plain manifests equal the chart's rendering, and the agent, the chart and the example
// pods agree on the socket path, the metrics port, the flags and where EFA appears.
// Run by tools/deploy_check.sh (HELM and FERRYD name the binaries).
package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

var root = func() string { r, _ := filepath.Abs("../../.."); return r }()

// The chart's profiles; "" is the chart's defaults.
var profiles = []string{"", "values-gke-a3-ultra.yaml", "values-eks-p5.yaml", "values-gke-dra.yaml", "values-eks-dra.yaml"}

func newObject(apiVersion, kind string) (interface{}, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/ResourceQuota":
		return &corev1.ResourceQuota{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/Pod":
		return &corev1.Pod{}, nil
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "resource.k8s.io/v1/ResourceClaimTemplate":
		return &resourcev1.ResourceClaimTemplate{}, nil
	case "monitoring.coreos.com/v1/PodMonitor":
		return &monitoringv1.PodMonitor{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("no API type known for %s %s", apiVersion, kind)
}

// decodeStrict turns one YAML document into its API type; any field the type does not
// have is an error.
func decodeStrict(doc []byte) (interface{}, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, err
	}
	// As the API server decodes with fieldValidation=Strict: field names match case
	// sensitively (encoding/json would take "mountpath" for "mountPath"), unknown and
	// duplicate fields are errors.
	strict, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %v", tm.Kind, strict)
	}
	return obj, nil
}

// docs splits a multi-document YAML stream, dropping documents with no content.
func docs(stream []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(stream), -1) {
		content := false
		for _, line := range strings.Split(d, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				content = true
			}
		}
		if content {
			out = append(out, []byte(d))
		}
	}
	return out
}

func decodeAll(t *testing.T, stream []byte) []interface{} {
	t.Helper()
	var objs []interface{}
	for _, d := range docs(stream) {
		o, err := decodeStrict(d)
		if err != nil {
			t.Fatalf("invalid object: %v\n%s", err, d)
		}
		objs = append(objs, o)
	}
	return objs
}

func render(t *testing.T, values string, set ...string) []byte {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set (run tools/deploy_check.sh)")
	}
	args := []string{"template", "ferry", filepath.Join(root, "deploy/helm/ferry"), "--namespace", "ferry"}
	if values != "" {
		args = append(args, "-f", filepath.Join(root, "deploy/helm/ferry", values))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

type rendering struct {
	configMap  *corev1.ConfigMap
	daemonSet  *appsv1.DaemonSet
	podMonitor *monitoringv1.PodMonitor
	objects    []interface{}
}

func renderProfile(t *testing.T, values string, set ...string) rendering {
	t.Helper()
	r := rendering{objects: decodeAll(t, render(t, values, set...))}
	for _, o := range r.objects {
		switch v := o.(type) {
		case *corev1.ConfigMap:
			r.configMap = v
		case *appsv1.DaemonSet:
			r.daemonSet = v
		case *monitoringv1.PodMonitor:
			r.podMonitor = v
		}
	}
	if r.configMap == nil || r.daemonSet == nil {
		t.Fatalf("%q: the chart rendered no ConfigMap or DaemonSet", values)
	}
	return r
}

// flags of the ConfigMap's flagfile: name -> value.
func (r rendering) flags(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(r.configMap.Data["ferryd.flags"], "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		m := regexp.MustCompile(`^--([a-z_0-9]+)=(.*)$`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("ConfigMap flag line %q is not --name=value", line)
		}
		out[m[1]] = m[2]
	}
	return out
}

func (r rendering) agent(t *testing.T) corev1.Container {
	t.Helper()
	for _, c := range r.daemonSet.Spec.Template.Spec.Containers {
		if c.Name == "ferryd" {
			return c
		}
	}
	t.Fatal("no ferryd container")
	return corev1.Container{}
}

func TestChartRendersValidObjects(t *testing.T) {
	for _, values := range profiles {
		renderProfile(t, values)
	}
	// Every optional part switched on.
	r := renderProfile(t, "values-eks-p5.yaml", "serviceMonitor.enabled=true", "peerTls.enabled=true",
		"extraFlags={--transfer_timeout_ms=60000}", "allowedUids={1000,1001}")
	kinds := map[string]bool{}
	for _, o := range r.objects {
		kinds[fmt.Sprintf("%T", o)] = true
	}
	for _, k := range []string{"*v1.Service", "*v1.ServiceMonitor", "*v1.PodMonitor", "*v1.ServiceAccount"} {
		if !kinds[k] {
			t.Errorf("no %s rendered with everything on (got %v)", k, kinds)
		}
	}
}

// An API server that limits the system-*-critical classes to namespaces with a quota
// covering them (GKE's) admits the agent's pods only with one: the chart ships it for the
// class its DaemonSet uses, and none for another class.
func TestCriticalPriorityClassHasItsQuota(t *testing.T) {
	quotas := func(r rendering) []*corev1.ResourceQuota {
		var out []*corev1.ResourceQuota
		for _, o := range r.objects {
			if q, ok := o.(*corev1.ResourceQuota); ok {
				out = append(out, q)
			}
		}
		return out
	}
	for _, values := range profiles {
		r := renderProfile(t, values)
		class := r.daemonSet.Spec.Template.Spec.PriorityClassName
		qs := quotas(r)
		if len(qs) != 1 || qs[0].Spec.ScopeSelector == nil || len(qs[0].Spec.ScopeSelector.MatchExpressions) != 1 {
			t.Fatalf("%s: want one ResourceQuota with one scope expression for class %q, got %+v", values, class, qs)
		}
		e := qs[0].Spec.ScopeSelector.MatchExpressions[0]
		if e.ScopeName != corev1.ResourceQuotaScopePriorityClass || e.Operator != corev1.ScopeSelectorOpIn ||
			len(e.Values) != 1 || e.Values[0] != class {
			t.Errorf("%s: the quota's scope %+v does not cover the DaemonSet's class %q", values, e, class)
		}
	}
	if qs := quotas(renderProfile(t, "", "priorityClassName=ferry-agents")); len(qs) != 0 {
		t.Errorf("a quota rendered for a class of the user's own: %+v", qs)
	}
	if qs := quotas(renderProfile(t, "", "criticalPodQuota.create=false")); len(qs) != 0 {
		t.Errorf("a quota rendered with criticalPodQuota.create=false: %+v", qs)
	}
}

func TestPlainManifestsMatchTheChart(t *testing.T) {
	for _, profile := range []string{"gke-a3-ultra", "eks-p5", "gke-dra", "eks-dra"} {
		path := filepath.Join(root, "deploy/manifests", "ferry-"+profile+".yaml")
		committed, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := render(t, "values-"+profile+".yaml")
		// The committed file starts with two comment lines saying how it was made.
		if body := bytes.SplitN(committed, []byte("\n"), 3); len(body) != 3 || !bytes.Equal(body[2], want) {
			t.Errorf("%s differs from the chart's rendering: run tools/render_manifests.sh", path)
		}
		decodeAll(t, committed)
	}
}

func TestExamplesAreValid(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root, "deploy/examples/*.yaml"))
	if len(files) == 0 {
		t.Fatal("no examples in deploy/examples")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeAll(t, b) {
			// The example programs shipped in ConfigMaps must at least compile.
			if cm, ok := o.(*corev1.ConfigMap); ok {
				for name, text := range cm.Data {
					if !strings.HasSuffix(name, ".py") {
						continue
					}
					py := filepath.Join(t.TempDir(), name)
					if err := os.WriteFile(py, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
					if out, err := exec.Command("python3", "-m", "py_compile", py).CombinedOutput(); err != nil {
						t.Errorf("%s: %s in ConfigMap %s does not compile: %s", f, name, cm.Name, out)
					}
				}
			}
		}
	}
}

func TestMisspelledFieldsAreRejected(t *testing.T) {
	good := docs(render(t, "values-gke-a3-ultra.yaml"))
	var ds []byte
	for _, d := range good {
		if bytes.Contains(d, []byte("kind: DaemonSet")) {
			ds = d
		}
	}
	if _, err := decodeStrict(ds); err != nil {
		t.Fatalf("the DaemonSet itself should decode: %v", err)
	}
	for _, typo := range [][2]string{
		{"hostNetwork: true", "hostNetwrok: true"},
		{"readinessProbe:", "readynessProbe:"},
		{"mountPath: /run/ferry", "mountpath: /run/ferry"},
		{"priorityClassName:", "priorityClass:"},
	} {
		bad := bytes.Replace(ds, []byte(typo[0]), []byte(typo[1]), 1)
		if bytes.Equal(bad, ds) {
			t.Fatalf("%q not found in the DaemonSet", typo[0])
		}
		if _, err := decodeStrict(bad); err == nil {
			t.Errorf("%q was accepted", typo[1])
		}
	}
	if _, err := decodeStrict([]byte("apiVersion: v1\nkind: Pod\nspec:\n  containers: []\n  hostPID: yes-please\n")); err == nil {
		t.Error("a string in a boolean field was accepted")
	}
}

func TestSocketPathIsTheSameEverywhere(t *testing.T) {
	for _, values := range profiles {
		r := renderProfile(t, values)
		flags := r.flags(t)
		socket := flags["socket"]
		dir := filepath.Dir(socket)
		found := false
		for _, v := range r.daemonSet.Spec.Template.Spec.Volumes {
			if v.Name == "sockets" {
				found = v.HostPath != nil && v.HostPath.Path == dir
			}
		}
		mounted := false
		for _, m := range r.agent(t).VolumeMounts {
			mounted = mounted || (m.Name == "sockets" && m.MountPath == dir)
		}
		if !found || !mounted {
			t.Errorf("%q: --socket=%s but the sockets hostPath / mount is not %s", values, socket, dir)
		}
		checkExamplePods(t, socket, flags["socket_group"])
	}
}

// Every example pod mounts the agent's socket directory from the host at the same path,
// points FERRY_SOCKET at the socket and carries the socket's group.
func checkExamplePods(t *testing.T, socket, group string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "deploy/examples/*.yaml"))
	pods := 0
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, o := range decodeAll(t, b) {
			pod, ok := o.(*corev1.Pod)
			if !ok {
				continue
			}
			pods++
			hostDirs := map[string]string{}
			for _, v := range pod.Spec.Volumes {
				if v.HostPath != nil {
					hostDirs[v.Name] = v.HostPath.Path
				}
			}
			for _, c := range pod.Spec.Containers {
				env := ""
				for _, e := range c.Env {
					if e.Name == "FERRY_SOCKET" {
						env = e.Value
					}
				}
				if env != socket {
					t.Errorf("%s: FERRY_SOCKET=%q, the agent's socket is %q", pod.Name, env, socket)
				}
				mounted := false
				for _, m := range c.VolumeMounts {
					mounted = mounted || (hostDirs[m.Name] == filepath.Dir(socket) && m.MountPath == filepath.Dir(socket))
				}
				if !mounted {
					t.Errorf("%s: does not mount %s from the host at the same path", pod.Name, filepath.Dir(socket))
				}
				if sc := c.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s: a workload pod needs no privileges", pod.Name)
				}
			}
			if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
				t.Errorf("%s: a workload pod needs no host namespaces", pod.Name)
			}
			if group != "" {
				ok := false
				if sc := pod.Spec.SecurityContext; sc != nil {
					for _, g := range sc.SupplementalGroups {
						ok = ok || fmt.Sprint(g) == group
					}
				}
				if !ok {
					t.Errorf("%s: not in the socket's group %s (supplementalGroups)", pod.Name, group)
				}
			}
		}
	}
	if pods == 0 {
		t.Error("no example pods")
	}
}

func TestMetricsPortMatchesProbesAndMonitors(t *testing.T) {
	for _, values := range profiles {
		r := renderProfile(t, values, "serviceMonitor.enabled=true")
		_, port, err := net.SplitHostPort(r.flags(t)["metrics_address"])
		if err != nil {
			t.Fatal(err)
		}
		c := r.agent(t)
		named := ""
		for _, p := range c.Ports {
			if fmt.Sprint(p.ContainerPort) == port {
				named = p.Name
			}
		}
		if named == "" {
			t.Fatalf("%q: no container port %s (--metrics_address)", values, port)
		}
		for what, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if probe == nil || probe.HTTPGet == nil {
				t.Errorf("%q: no HTTP %s probe", values, what)
				continue
			}
			if p := probe.HTTPGet.Port.String(); p != named && p != port {
				t.Errorf("%q: %s probe on port %s, metrics on %s (%s)", values, what, p, port, named)
			}
		}
		if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("%q: probes should be /healthz (liveness) and /readyz (readiness)", values)
		}
		if r.podMonitor == nil || len(r.podMonitor.Spec.PodMetricsEndpoints) != 1 ||
			r.podMonitor.Spec.PodMetricsEndpoints[0].Port != named {
			t.Errorf("%q: the PodMonitor does not scrape port %q", values, named)
		}
		for _, o := range r.objects {
			if svc, ok := o.(*corev1.Service); ok {
				if svc.Spec.Ports[0].TargetPort.String() != named || fmt.Sprint(svc.Spec.Ports[0].Port) != port {
					t.Errorf("%q: metrics Service ports %+v", values, svc.Spec.Ports[0])
				}
			}
			if sm, ok := o.(*monitoringv1.ServiceMonitor); ok && sm.Spec.Endpoints[0].Port != named {
				t.Errorf("%q: the ServiceMonitor scrapes port %q", values, sm.Spec.Endpoints[0].Port)
			}
		}
	}
}

func TestEfaOnlyInTheEksProfile(t *testing.T) {
	for _, values := range profiles {
		r := renderProfile(t, values)
		c := r.agent(t)
		_, limit := c.Resources.Limits["vpc.amazonaws.com/efa"]
		_, request := c.Resources.Requests["vpc.amazonaws.com/efa"]
		want := values == "values-eks-p5.yaml"
		if limit != want || request {
			t.Errorf("%q: EFA limit %v (want %v), request %v", values, limit, want, request)
		}
		if q := c.Resources.Limits["vpc.amazonaws.com/efa"]; want && q.Value() != 32 {
			t.Errorf("EKS p5: %s EFA devices, want 32", q.String())
		}
	}
}

func TestFlagsAreFlagsFerrydKnows(t *testing.T) {
	ferryd := os.Getenv("FERRYD")
	if ferryd == "" {
		t.Fatal("FERRYD is not set (run tools/deploy_check.sh)")
	}
	help, _ := exec.Command(ferryd, "--helpfull").CombinedOutput()
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z_0-9]+) \(`).FindAllStringSubmatch(string(help), -1) {
		known[m[1]] = true
	}
	if !known["socket"] || !known["flagfile"] {
		t.Fatalf("%s --helpfull lists no --socket or --flagfile:\n%s", ferryd, help)
	}
	for _, values := range profiles {
		r := renderProfile(t, values, "peerTls.enabled=true", "allowedUids={1000}")
		for name := range r.flags(t) {
			if !known[name] {
				t.Errorf("%q: the ConfigMap sets --%s, which ferryd does not know", values, name)
			}
		}
		for _, a := range r.agent(t).Args {
			m := regexp.MustCompile(`^--([a-z_0-9]+)=`).FindStringSubmatch(a)
			if m == nil || !known[m[1]] {
				t.Errorf("%q: container argument %q is not a ferryd flag", values, a)
			}
		}
		for _, c := range r.daemonSet.Spec.Template.Spec.InitContainers {
			if c.Command[0] == "ferryctl" {
				continue // ferryctl's own flags (TestDraProfiles)
			}
			for _, m := range regexp.MustCompile(`--([a-z_0-9]+)=`).FindAllStringSubmatch(strings.Join(c.Command, " "), -1) {
				if !known[m[1]] {
					t.Errorf("%q: init container %s writes --%s, which ferryd does not know", values, c.Name, m[1])
				}
			}
		}
	}
}

// With dra.enabled the agent claims its NICs: no host network and no privilege, every NIC
// of the profile's DeviceClass, the init container's file is the one ferryd reads, and
// only that container holds an API token.
func TestDraProfiles(t *testing.T) {
	for values, class := range map[string]string{
		"values-gke-dra.yaml": "mrdma.google.com", "values-eks-dra.yaml": "efa.networking.k8s.aws"} {
		r := renderProfile(t, values)
		pod := r.daemonSet.Spec.Template.Spec
		c := r.agent(t)
		if pod.HostNetwork || (c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged) {
			t.Errorf("%s: hostNetwork %v, privileged %v: a DRANet claim needs neither (and refuses hostNetwork)",
				values, pod.HostNetwork, *c.SecurityContext.Privileged)
		}
		if len(pod.ResourceClaims) != 1 || pod.ResourceClaims[0].ResourceClaimTemplateName == nil ||
			len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != pod.ResourceClaims[0].Name {
			t.Fatalf("%s: the agent's claim %+v, its container's %+v", values, pod.ResourceClaims, c.Resources.Claims)
		}
		var template *resourcev1.ResourceClaimTemplate
		for _, o := range r.objects {
			if rct, ok := o.(*resourcev1.ResourceClaimTemplate); ok {
				template = rct
			}
		}
		if template == nil || template.Name != *pod.ResourceClaims[0].ResourceClaimTemplateName {
			t.Fatalf("%s: no ResourceClaimTemplate named %s", values, *pod.ResourceClaims[0].ResourceClaimTemplateName)
		}
		request := template.Spec.Spec.Devices.Requests[0]
		if request.Name != "nics" || request.Exactly == nil || request.Exactly.DeviceClassName != class ||
			request.Exactly.AllocationMode != resourcev1.DeviceAllocationModeAll {
			t.Errorf("%s: the NIC request %+v, want every device of %s", values, request, class)
		}
		if len(pod.InitContainers) != 1 {
			t.Fatalf("%s: want one init container, got %d", values, len(pod.InitContainers))
		}
		init := pod.InitContainers[0]
		out := regexp.MustCompile(`^--out=(.*)$`)
		var file string
		for _, a := range init.Command {
			if m := out.FindStringSubmatch(a); m != nil {
				file = m[1]
			}
		}
		if file == "" || !contains(c.Args, "--claimed_devices="+file) {
			t.Errorf("%s: the init container writes %q, ferryd's args %v", values, file, c.Args)
		}
		for _, v := range pod.Volumes {
			if v.Projected == nil {
				continue
			}
			for _, ct := range append([]corev1.Container{c}, pod.InitContainers...) {
				mounted := false
				for _, m := range ct.VolumeMounts {
					mounted = mounted || m.Name == v.Name
				}
				if mounted != (ct.Name == init.Name) {
					t.Errorf("%s: container %s mounts the API token: %v", values, ct.Name, mounted)
				}
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
