package deploy

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"                     // resolve the bootstrap's typed configs
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3" // resolve the bootstrap's typed configs
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"                          // resolve the bootstrap's typed configs
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/envoyrelease"
	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

const (
	chartDir = "kube-mvp"
	release  = "kmvp"
	// fullname is the object-name prefix for release "kmvp" of chart "kube-mvp".
	fullname = "kmvp-kube-mvp"
)

// manifest is one rendered object, decoded twice: generically, and strictly into its Go type
// (an unknown or duplicate field is an error).
type manifest struct {
	source string
	raw    []byte
	obj    *unstructured.Unstructured
	typed  runtime.Object
}

type rendered struct {
	objs  []manifest
	notes string
}

// strict decodes YAML into the typed API objects, rejecting unknown and duplicate fields.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// render renders the chart as `helm template --namespace ns kmvp deploy/kube-mvp -f vals`
// would (the values checked against values.schema.json) and decodes every manifest.
func render(vals map[string]any, ns string, apiVersions ...string) (*rendered, error) {
	out, err := RenderChartFor(chartDir, release, ns, vals, apiVersions...)
	if err != nil {
		return nil, err
	}
	r := &rendered{}
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = out[name]
			continue
		}
		docs := releaseutil.SplitManifests(out[name])
		keys := slices.Collect(maps.Keys(docs))
		sort.Slice(keys, func(i, j int) bool { return docKey(keys[i]) < docKey(keys[j]) })
		for _, k := range keys {
			doc := []byte(docs[k])
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if string(bytes.TrimSpace(js)) == "null" {
				continue // only comments
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(js); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, doc)
			}
			var typed runtime.Object
			if u.GroupVersionKind().Group == monitoringGroup {
				err = decodeMonitoring(u.GetKind(), js) // prometheus-operator's kinds: not in client-go's scheme
			} else {
				typed, _, err = strict.Decode(doc, nil, nil)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %s %s: %w", name, u.GetKind(), u.GetName(), err)
			}
			r.objs = append(r.objs, manifest{source: name, raw: doc, obj: u, typed: typed})
		}
	}
	return r, nil
}

func docKey(k string) int {
	var n int
	fmt.Sscanf(k, "manifest-%d", &n)
	return n
}

func (r *rendered) find(kind, name string) *manifest {
	for i := range r.objs {
		if r.objs[i].obj.GetKind() == kind && r.objs[i].obj.GetName() == name {
			return &r.objs[i]
		}
	}
	return nil
}

func (r *rendered) mustFind(t *testing.T, kind, name string) *manifest {
	t.Helper()
	m := r.find(kind, name)
	if m == nil {
		var have []string
		for _, o := range r.objs {
			have = append(have, o.obj.GetKind()+"/"+o.obj.GetName())
		}
		t.Fatalf("no %s %s; rendered %v", kind, name, have)
	}
	return m
}

func (r *rendered) kinds() map[string]int {
	n := map[string]int{}
	for _, o := range r.objs {
		n[o.obj.GetKind()]++
	}
	return n
}

// podSpec returns the pod template of a Deployment or DaemonSet.
func podSpec(t *testing.T, m *manifest) *corev1.PodSpec {
	t.Helper()
	switch o := m.typed.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template.Spec
	case *appsv1.DaemonSet:
		return &o.Spec.Template.Spec
	}
	t.Fatalf("%s is a %T, not a workload", m.obj.GetName(), m.typed)
	return nil
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

// flags turns --name=value arguments into a map; every argument must have that form.
func flags(t *testing.T, args []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("argument %q is not --flag=value", a)
			continue
		}
		if _, dup := m[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		m[name] = value
	}
	return m
}

// The flags of `xds-server serve` (cmd/xds-server serveOptions.flagSet and envoyFlags) and of
// extproc (cmd/extproc): the chart may use no other. TestChartOnRealAPIServer runs both
// binaries with the rendered arguments, so a flag that does not exist fails there too.
var (
	xdsServerFlags = []string{"kubeconfig", "xds-address", "admin-address", "liveness-window", "discovery-interval",
		"apiserver-addresses", "listen-address", "listen-port", "extproc-address", "extproc-message-timeout",
		"upstream-server-name", "serving-cert", "serving-key", "client-ca", "proxy-client-cert", "proxy-client-key", "peer-ca",
		"xds-tls-dir", "max-nodes", "max-streams", "departed-apiserver-grace", "memory-configmap", "upstream-request-timeout", "shutdown-delay"}
	extprocFlags = []string{"source", "listen", "admin-address", "now", "poll-interval", "xds-tls-dir",
		"proxy-client-cert", "proxy-client-key", "peer-ca", "upstream-server-name", "drained-file", "drained-max-wait"}
	// extproc drain-envoy's (cmd/extproc/drainenvoy.go), the extproc container's preStop hook.
	drainEnvoyFlags = []string{"envoy-admin", "delay", "drain-time", "poll-interval", "exit-wait", "done-file"}
)

// decodeBootstrap decodes Envoy bootstrap YAML strictly (unknown fields are errors, as for
// Envoy), validates it with Envoy's proto rules, and checks that the oldest supported Envoy
// knows everything it uses (oldestenvoy.Check).
func decodeBootstrap(raw []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false, Resolver: protoregistry.GlobalTypes}).Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("not a Bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("invalid Bootstrap: %w", err)
	}
	if errs := oldestenvoy.Check(&b); len(errs) > 0 {
		return nil, fmt.Errorf("Bootstrap for the oldest supported Envoy: %w", errors.Join(errs...))
	}
	return &b, nil
}

// testPKI is certificates for the cases that configure TLS.
func testPKI(t *testing.T) *controlplane.PKI {
	t.Helper()
	p, err := controlplane.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// certificateValues puts all TLS parts of p into the chart values.
func certificateValues(p *controlplane.PKI) map[string]any {
	return map[string]any{"certificates": map[string]any{
		"servingCert":     string(p.Serving.CertPEM),
		"servingKey":      string(p.Serving.KeyPEM),
		"clientCA":        string(p.ClientCA.CertPEM),
		"proxyClientCert": string(p.ProxyClient.CertPEM),
		"proxyClientKey":  string(p.ProxyClient.KeyPEM),
		"peerCA":          string(p.ServerCA.CertPEM),
	}}
}

// chartCase is one documented way to install the chart.
type chartCase struct {
	name   string
	values func(*controlplane.PKI) map[string]any
	check  func(t *testing.T, r *rendered, ns string)
}

var chartCases = []chartCase{
	{
		name:   "default",
		values: func(*controlplane.PKI) map[string]any { return map[string]any{} },
		check: func(t *testing.T, r *rendered, ns string) {
			// certgen: a hook Job with its own ServiceAccount, Role and RoleBinding, and a
			// CronJob with another set (the hook's are deleted once it succeeded).
			// xds-server: a Role in kube-system (Leases) and one in the release namespace (its
			// memory ConfigMap).
			want := map[string]int{"ServiceAccount": 4, "Role": 4, "RoleBinding": 4, "ClusterRole": 2, "ClusterRoleBinding": 2,
				"ConfigMap": 1, "Deployment": 2, "Service": 2, "PodDisruptionBudget": 2, "NetworkPolicy": 1, "Job": 1, "CronJob": 1}
			if got := r.kinds(); !maps.Equal(got, want) {
				t.Errorf("kinds %v, want %v (no Secret without certificates)", got, want)
			}
			// The memory ConfigMap: that one object by name, and create.
			var memoryRules []rbacv1.PolicyRule
			for _, o := range r.objs {
				if role, ok := o.typed.(*rbacv1.Role); ok && role.Namespace == ns && role.Name == fullname+"-xds-server" {
					memoryRules = role.Rules
				}
			}
			wantRules := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{fullname + "-xds-server-memory"}, Verbs: []string{"get", "list", "watch", "update"}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
			}
			if !reflect.DeepEqual(memoryRules, wantRules) {
				t.Errorf("xds-server's Role in %s: %+v, want %+v", ns, memoryRules, wantRules)
			}
			d := r.mustFind(t, "Deployment", fullname+"-xds-server").typed.(*appsv1.Deployment)
			if *d.Spec.Replicas != 2 {
				t.Errorf("xds-server replicas %d, want 2", *d.Spec.Replicas)
			}
			c := container(t, &d.Spec.Template.Spec, "xds-server")
			if c.Image != "ghcr.io/kube-mvp/xds-server:0.1.0" {
				t.Errorf("xds-server image %s", c.Image)
			}
			f := flags(t, c.Args[1:])
			for _, cert := range []string{"serving-cert", "serving-key", "client-ca", "proxy-client-cert", "proxy-client-key", "peer-ca"} {
				if _, ok := f[cert]; ok {
					t.Errorf("--%s without certificates", cert)
				}
			}
			if f["listen-port"] != "6443" || f["extproc-address"] != "unix:/var/run/kube-mvp/extproc.sock" {
				t.Errorf("xds-server flags %v", f)
			}
			e := podSpec(t, r.mustFind(t, "Deployment", fullname+"-envoy"))
			checkSupportedEnvoy(t, container(t, e, "envoy").Image)
			for _, w := range []string{"plain HTTP", "NOT verify", "anonymous"} {
				if !strings.Contains(r.notes, w) {
					t.Errorf("NOTES do not warn %q:\n%s", w, r.notes)
				}
			}
		},
	},
	{
		name: "certificates",
		values: func(p *controlplane.PKI) map[string]any {
			return certificateValues(p)
		},
		check: func(t *testing.T, r *rendered, ns string) {
			s := r.mustFind(t, "Secret", fullname+"-certificates").typed.(*corev1.Secret)
			xs := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
			c := container(t, xs, "xds-server")
			f := flags(t, c.Args[1:])
			// Key custody: the Secret is mounted into Envoy's container only; xds-server
			// names its files (paths in Envoy's file system) and mounts nothing of it.
			for _, v := range xs.Volumes {
				if v.Secret != nil && v.Secret.SecretName == s.Name {
					t.Errorf("xds-server mounts the certificates Secret")
				}
			}
			es := podSpec(t, r.mustFind(t, "Deployment", fullname+"-envoy"))
			mount := ""
			for _, v := range es.Volumes {
				if v.Secret == nil || v.Secret.SecretName != s.Name {
					continue
				}
				for _, c := range es.Containers {
					for _, m := range c.VolumeMounts {
						if m.Name != v.Name {
							continue
						}
						// extproc mounts some of its files (checkCommon checks which).
						if c.Name != "envoy" && (c.Name != "extproc" || len(v.Secret.Items) == 0) {
							t.Errorf("container %s mounts the certificates Secret", c.Name)
						}
						mount = m.MountPath
					}
				}
			}
			for flag, key := range map[string]string{"serving-cert": "serving.crt", "serving-key": "serving.key", "client-ca": "client-ca.crt",
				"proxy-client-cert": "proxy-client.crt", "proxy-client-key": "proxy-client.key", "peer-ca": "peer-ca.crt"} {
				if f[flag] != mount+"/"+key {
					t.Errorf("--%s=%q, want %s/%s", flag, f[flag], mount, key)
				}
				if len(s.Data[key]) == 0 {
					t.Errorf("Secret has no %s", key)
				}
			}
			if strings.Contains(r.notes, "WARNING") {
				t.Errorf("NOTES warn with every certificate given:\n%s", r.notes)
			}
		},
	},
	{
		name: "existing-secret",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"certificates": map[string]any{"existingSecret": "my-certificates", "existingSecretParts": []any{"serving", "peerCA"}}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			if r.kinds()["Secret"] != 0 {
				t.Error("a Secret is rendered although existingSecret is set")
			}
			es := podSpec(t, r.mustFind(t, "Deployment", fullname+"-envoy"))
			if !slices.ContainsFunc(es.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "my-certificates" }) {
				t.Errorf("Envoy's volumes %v lack my-certificates", es.Volumes)
			}
			spec := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
			f := flags(t, container(t, spec, "xds-server").Args[1:])
			if f["serving-cert"] == "" || f["peer-ca"] == "" || f["client-ca"] != "" || f["proxy-client-cert"] != "" {
				t.Errorf("flags %v, want serving and peer CA only", f)
			}
		},
	},
	{
		// kubeadm nodes: each sidecar Envoy presents its node's own front-proxy pair, so
		// kubeadm's renewals reach it; the chart holds no proxy key.
		name: "sidecar-kubeadm-front-proxy",
		values: func(p *controlplane.PKI) map[string]any {
			return map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false},
				"sidecar": map[string]any{"kubeadmFrontProxyClient": true},
				// extproc verifies the apiservers with Envoy's name too (checkCommon).
				"xdsServer":    map[string]any{"upstreamServerName": "kubernetes.default.svc.cluster.local"},
				"certificates": map[string]any{"servingCert": string(p.Serving.CertPEM), "servingKey": string(p.Serving.KeyPEM), "peerCA": string(p.ServerCA.CertPEM)}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			spec := podSpec(t, r.mustFind(t, "DaemonSet", fullname+"-envoy"))
			const dir = "/var/run/kube-mvp/node-pki"
			volumes := map[string]corev1.Volume{}
			for _, v := range spec.Volumes {
				volumes[v.Name] = v
			}
			// The node's two files, type File, and nothing else of the node.
			hostFiles := map[string]string{} // volume -> node path
			for _, v := range spec.Volumes {
				if v.HostPath == nil {
					continue
				}
				var typ corev1.HostPathType
				if v.HostPath.Type != nil {
					typ = *v.HostPath.Type
				}
				if typ != corev1.HostPathFile || (v.HostPath.Path != "/etc/kubernetes/pki/front-proxy-client.crt" && v.HostPath.Path != "/etc/kubernetes/pki/front-proxy-client.key") {
					t.Errorf("hostPath volume %s: %s type %q, want one of the node's two front-proxy-client files, type File", v.Name, v.HostPath.Path, typ)
				}
				hostFiles[v.Name] = v.HostPath.Path
			}
			if len(hostFiles) != 2 {
				t.Errorf("hostPath volumes %v, want the node's two files", hostFiles)
			}
			if v, ok := volumes["node-pki"]; !ok || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "1Mi" {
				t.Errorf("volume node-pki %+v, want an emptyDir in memory of at most 1Mi", v.VolumeSource)
			}

			// The copiers: an init container (Envoy starts only after the first copy) and a
			// container that follows renewals, each mounting the two files read-only where
			// its --file flags name them, and the emptyDir writable where --to names it.
			if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "copy-node-pki" {
				t.Fatalf("init containers %v, want copy-node-pki", spec.InitContainers)
			}
			group := fmt.Sprint(*es(spec).RunAsGroup)
			common := []string{"--file=/host/front-proxy-client.crt", "--file=/host/front-proxy-client.key", "--to=" + dir}
			for _, c := range []struct {
				c    *corev1.Container
				args []string
			}{
				{&spec.InitContainers[0], slices.Concat([]string{"copy-files"}, common, []string{"--group=" + group, "--once", "--wait"})},
				{container(t, spec, "node-pki"), slices.Concat([]string{"copy-files"}, common, []string{"--group=" + group, "--interval=10s"})},
			} {
				if !slices.Equal(c.c.Args, c.args) || len(c.c.Command) != 0 || !strings.HasPrefix(c.c.Image, "ghcr.io/kube-mvp/extproc:") {
					t.Errorf("%s: image %s command %q args %q, want the extproc image with %q", c.c.Name, c.c.Image, c.c.Command, c.c.Args, c.args)
				}
				mounts := map[string]corev1.VolumeMount{}
				for _, m := range c.c.VolumeMounts {
					mounts[m.Name] = m
				}
				want := map[string]corev1.VolumeMount{"node-pki": {Name: "node-pki", MountPath: dir}}
				for name, path := range hostFiles {
					want[name] = corev1.VolumeMount{Name: name, MountPath: "/host/" + filepath.Base(path), ReadOnly: true}
				}
				if !maps.EqualFunc(mounts, want, func(a, b corev1.VolumeMount) bool { return reflect.DeepEqual(a, b) }) {
					t.Errorf("%s mounts %v, want %v", c.c.Name, mounts, want)
				}
				if c.c.ReadinessProbe != nil || c.c.Resources.Limits.Memory().IsZero() {
					t.Errorf("%s: a readiness probe %v, or no memory limit", c.c.Name, c.c.ReadinessProbe)
				}
			}
			probe := container(t, spec, "node-pki").LivenessProbe
			if want := slices.Concat([]string{"/usr/local/bin/extproc", "copy-files", "--check"}, common); probe == nil || probe.Exec == nil || !slices.Equal(probe.Exec.Command, want) {
				t.Errorf("node-pki liveness %v, want exec %q", probe, want)
			} else if probe.PeriodSeconds*probe.FailureThreshold < 30 {
				t.Errorf("node-pki liveness fails after %ds: within a few copy intervals", probe.PeriodSeconds*probe.FailureThreshold)
			}

			// Envoy (through xds-server's SDS paths) and extproc read the pair from the
			// emptyDir, read-only, and mount nothing of the node.
			f := flags(t, container(t, podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server")), "xds-server").Args[1:])
			if f["proxy-client-cert"] != dir+"/front-proxy-client.crt" || f["proxy-client-key"] != dir+"/front-proxy-client.key" {
				t.Errorf("xds-server proxy client flags %q %q, want the files in %s", f["proxy-client-cert"], f["proxy-client-key"], dir)
			}
			// SDS watches the files' directory (internal/snapshot/secrets.go): the emptyDir's
			// root, where ..data is swapped.
			for _, name := range []string{"envoy", "extproc"} {
				c := container(t, spec, name)
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "node-pki" && m.ReadOnly && m.MountPath == filepath.Dir(f["proxy-client-cert"])
				}) {
					t.Errorf("%s does not mount node-pki read-only at %s: %v", name, filepath.Dir(f["proxy-client-cert"]), c.VolumeMounts)
				}
				for _, m := range c.VolumeMounts {
					if _, ok := hostFiles[m.Name]; ok {
						t.Errorf("%s mounts the node's %s", name, hostFiles[m.Name])
					}
				}
			}
			if s := r.find("Secret", fullname+"-certificates"); s != nil && len(s.typed.(*corev1.Secret).Data["proxy-client.key"]) > 0 {
				t.Error("the chart keeps a proxy key although the node's is used")
			}
			if strings.Contains(r.notes, "no front-proxy client certificate") || !strings.Contains(r.notes, "-c copy-node-pki") {
				t.Errorf("NOTES say there is no proxy certificate, or not where the node's is copied:\n%s", r.notes)
			}
		},
	},
	{
		name: "sidecar",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"xdsFrom": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/24"}}}}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			if r.find("Deployment", fullname+"-envoy") != nil || r.find("Service", fullname+"-envoy") != nil || r.find("PodDisruptionBudget", fullname+"-envoy") != nil {
				t.Error("sidecar mode renders an Envoy Deployment, Service or PDB")
			}
			spec := podSpec(t, r.mustFind(t, "DaemonSet", fullname+"-envoy"))
			// Without sidecar.kubeadmFrontProxyClient: nothing of the node, no copier.
			if len(spec.InitContainers) != 0 || len(spec.Containers) != 2 || slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil }) {
				t.Errorf("init containers %v, %d containers, volumes %v: want envoy and extproc and no hostPath", spec.InitContainers, len(spec.Containers), spec.Volumes)
			}
			if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				t.Errorf("hostNetwork %v dnsPolicy %s", spec.HostNetwork, spec.DNSPolicy)
			}
			if _, ok := spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
				t.Errorf("nodeSelector %v", spec.NodeSelector)
			}
			envoy := container(t, spec, "envoy")
			i := slices.Index(envoy.Args, "--config-yaml")
			if i < 0 {
				t.Fatalf("envoy args %v: no --config-yaml", envoy.Args)
			}
			// The override Envoy merges into its bootstrap names the local apiserver (the node
			// name, which Kubernetes substitutes for $(NODE_NAME)) in the field xds-server reads.
			b, err := decodeBootstrap([]byte(envoy.Args[i+1]))
			if err != nil {
				t.Fatal(err)
			}
			if got := b.GetNode().GetMetadata().GetFields()[xds.LocalAPIServerMetadataKey].GetStringValue(); got != "$(NODE_NAME)" {
				t.Errorf("node metadata %s = %q", xds.LocalAPIServerMetadataKey, got)
			}
			if !slices.ContainsFunc(envoy.Env, func(e corev1.EnvVar) bool {
				return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			}) {
				t.Errorf("envoy env %v has no NODE_NAME from spec.nodeName", envoy.Env)
			}
			// The local apiserver is configured once, on the Envoy node: extproc learns it
			// from the sidecar's routes (ext_proc gRPC metadata), not from a flag.
			if ext := container(t, spec, "extproc"); len(ext.Env) != 0 || slices.ContainsFunc(ext.Args, func(a string) bool { return strings.Contains(a, "NODE_NAME") }) {
				t.Errorf("extproc is told the node: args %v env %v", ext.Args, ext.Env)
			}
			if f := flags(t, container(t, podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server")), "xds-server").Args[1:]); f["listen-port"] != "6444" {
				t.Errorf("xds-server --listen-port %s, want the sidecar port 6444", f["listen-port"])
			}
		},
	},
	{
		name: "sidecar-pod-network",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"mode": "sidecar", "sidecar": map[string]any{"hostNetwork": false}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			if spec := podSpec(t, r.mustFind(t, "DaemonSet", fullname+"-envoy")); spec.HostNetwork {
				t.Error("hostNetwork although sidecar.hostNetwork=false")
			}
		},
	},
	{
		name: "load-balancer",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"envoy": map[string]any{"replicas": 3, "service": map[string]any{
				"type": "LoadBalancer", "port": 6443, "nodePort": 30443, "externalTrafficPolicy": "Local",
				"annotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}}}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			s := r.mustFind(t, "Service", fullname+"-envoy").typed.(*corev1.Service)
			if s.Spec.Type != corev1.ServiceTypeLoadBalancer || s.Spec.Ports[0].NodePort != 30443 || s.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
				t.Errorf("service spec %+v", s.Spec)
			}
			if d := r.mustFind(t, "Deployment", fullname+"-envoy").typed.(*appsv1.Deployment); *d.Spec.Replicas != 3 {
				t.Errorf("envoy replicas %d", *d.Spec.Replicas)
			}
		},
	},
	{
		name: "tuning",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{
				"xdsServer": map[string]any{"replicas": 3, "port": 18001, "adminPort": 9101, "livenessWindow": "45s", "discoveryInterval": "2m",
					"departedAPIServerGrace": "5m", "upstreamServerName": "apiserver.example.com",
					"apiserverAddresses": map[string]any{"cp-b": "10.0.0.2:6443", "cp-a": "10.0.0.1:6443"}},
				"envoy": map[string]any{"listenAddress": "::", "listenPort": 8443, "adminPort": 19901, "healthPort": 19902, "logLevel": "debug", "upstreamRequestTimeout": "95s",
					// The shortest grace period the chart accepts for this delay and drain.
					"shutdown": map[string]any{"delaySeconds": 10, "drainSeconds": 100}, "terminationGracePeriodSeconds": 120},
				"extproc":       map[string]any{"adminPort": 9003, "messageTimeout": "500ms"},
				"clusterDomain": "k8s.example",
			}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			f := flags(t, container(t, podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server")), "xds-server").Args[1:])
			want := map[string]string{"xds-address": ":18001", "admin-address": ":9101", "liveness-window": "45s", "discovery-interval": "2m",
				"upstream-server-name": "apiserver.example.com", "apiserver-addresses": "cp-a=10.0.0.1:6443,cp-b=10.0.0.2:6443",
				"listen-address": "::", "listen-port": "8443", "extproc-message-timeout": "500ms", "upstream-request-timeout": "95s",
				"departed-apiserver-grace": "5m", "memory-configmap": ns + "/" + fullname + "-xds-server-memory"}
			for k, v := range want {
				if f[k] != v {
					t.Errorf("--%s=%q, want %q", k, f[k], v)
				}
			}
			spec := podSpec(t, r.mustFind(t, "Deployment", fullname+"-envoy"))
			ef := flags(t, container(t, spec, "extproc").Args)
			if ef["source"] != "xds:"+fullname+"-xds-server."+ns+".svc.k8s.example:18001" || ef["admin-address"] != ":9003" || ef["drained-max-wait"] != "125s" {
				t.Errorf("extproc flags %v", ef)
			}
			envoy, extproc := container(t, spec, "envoy"), container(t, spec, "extproc")
			wantHook := []string{"/usr/local/bin/extproc", "drain-envoy", "--envoy-admin=127.0.0.1:19901", "--delay=10s", "--drain-time=100s", "--done-file=/var/run/kube-mvp/envoy-drained"}
			if got := extproc.Lifecycle.PreStop.Exec.Command; !slices.Equal(got, wantHook) {
				t.Errorf("extproc preStop %q, want %q", got, wantHook)
			}
			if a := r.mustFind(t, "Deployment", fullname+"-envoy").typed.(*appsv1.Deployment).Spec.Template.Annotations[contract.AnnotationEnvoyAdminPort]; a != "19901" {
				t.Errorf("Envoy pods' %s %q, want the admin port 19901 (kubectl mvp config-dump reads it)", contract.AnnotationEnvoyAdminPort, a)
			}
			if p := envoy.Lifecycle.PreStop.HTTPGet.Port; p.IntVal != 9003 {
				t.Errorf("envoy preStop port %s, want 9003", p.String())
			}
			if !slices.Contains(envoy.Args, "100") || *spec.TerminationGracePeriodSeconds != 120 {
				t.Errorf("envoy args %q, grace %d: want --drain-time-s 100, 120", envoy.Args, *spec.TerminationGracePeriodSeconds)
			}
		},
	},
	{
		name: "operators",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"rbac": map[string]any{"operators": []any{map[string]any{"kind": "Group", "name": "sre", "apiGroup": "rbac.authorization.k8s.io"}}}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			// kubectl mvp reads the admin ports through the pod proxy: list pods, get
			// pods/proxy, and (config-dump: Envoy's admin is on the pod's loopback) create
			// pods/portforward, in the release namespace only.
			role := r.mustFind(t, "Role", fullname+"-operators").typed.(*rbacv1.Role)
			wantRules := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
				{APIGroups: []string{""}, Resources: []string{"pods/proxy"}, Verbs: []string{"get"}},
				{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}},
			}
			if role.Namespace != ns || !reflect.DeepEqual(role.Rules, wantRules) {
				t.Errorf("operators' Role in %s: %+v, want %+v in %s", role.Namespace, role.Rules, wantRules, ns)
			}
			b := r.mustFind(t, "RoleBinding", fullname+"-operators").typed.(*rbacv1.RoleBinding)
			if want := []rbacv1.Subject{{Kind: "Group", Name: "sre", APIGroup: "rbac.authorization.k8s.io"}}; !reflect.DeepEqual(b.Subjects, want) || b.RoleRef.Name != role.Name {
				t.Errorf("operators' RoleBinding: %+v to %s, want %+v to %s", b.Subjects, b.RoleRef.Name, want, role.Name)
			}
		},
	},
	{
		name: "minimal-objects",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{"rbac": map[string]any{"create": false}, "networkPolicy": map[string]any{"enabled": false},
				"xdsServer": map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}},
				"envoy":     map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}}}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			k := r.kinds()
			for _, kind := range []string{"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "PodDisruptionBudget"} {
				if k[kind] != 0 {
					t.Errorf("%d %s rendered although disabled", k[kind], kind)
				}
			}
			if !strings.Contains(r.notes, "networkPolicy.enabled=false") {
				t.Errorf("NOTES do not warn about the open ports:\n%s", r.notes)
			}
		},
	},
	{
		name: "customised",
		values: func(*controlplane.PKI) map[string]any {
			return map[string]any{
				"fullnameOverride": fullname, // the same names, so the shared checks apply
				"image": map[string]any{
					"xdsServer": map[string]any{"repository": "registry.example/kube-mvp/xds-server", "tag": "v9.9.9", "pullPolicy": "Always"},
					"extproc":   map[string]any{"repository": "registry.example/kube-mvp/extproc", "tag": "v9.9.9"},
					"envoy":     map[string]any{"repository": "envoyproxy/envoy-distroless", "tag": "v1.40.0"},
				},
				"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
				"serviceAccount":   map[string]any{"name": "kube-mvp-reader", "annotations": map[string]any{"example.com/role": "reader"}},
				"commonLabels":     map[string]any{"team": "control-plane"},
				"networkPolicy":    map[string]any{"adminFrom": []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}},
				"xdsServer": map[string]any{
					"nodeSelector":   map[string]any{"kubernetes.io/os": "linux"},
					"tolerations":    []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}},
					"podAnnotations": map[string]any{"prometheus.io/scrape": "true"},
					"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
						"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "kubernetes.io/arch", "operator": "In", "values": []any{"amd64", "arm64"}}}}}}}},
					"resources": map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "128Mi"}, "limits": map[string]any{"memory": "1Gi"}},
				},
			}
		},
		check: func(t *testing.T, r *rendered, ns string) {
			spec := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
			if spec.ServiceAccountName != "kube-mvp-reader" || spec.ImagePullSecrets[0].Name != "regcred" || spec.Affinity.NodeAffinity == nil {
				t.Errorf("xds-server pod spec %+v", spec)
			}
			if c := container(t, spec, "xds-server"); c.Image != "registry.example/kube-mvp/xds-server:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("image %s %s", c.Image, c.ImagePullPolicy)
			}
			rb := r.mustFind(t, "RoleBinding", fullname+"-xds-server").obj
			subjects, _, _ := unstructured.NestedSlice(rb.Object, "subjects")
			if subjects[0].(map[string]any)["name"] != "kube-mvp-reader" {
				t.Errorf("RoleBinding subjects %v", subjects)
			}
			for _, o := range r.objs {
				if o.obj.GetLabels()["team"] != "control-plane" {
					t.Errorf("%s %s lacks commonLabels", o.obj.GetKind(), o.obj.GetName())
				}
			}
		},
	},
}

// checkCommon checks what every rendering must satisfy.
func checkCommon(t *testing.T, r *rendered, ns string) {
	for _, o := range r.objs {
		clusterScoped := o.obj.GetKind() == "ClusterRole" || o.obj.GetKind() == "ClusterRoleBinding"
		switch {
		case clusterScoped && o.obj.GetNamespace() != "":
			t.Errorf("%s %s has a namespace", o.obj.GetKind(), o.obj.GetName())
		case !clusterScoped && o.obj.GetNamespace() != ns && !(o.obj.GetNamespace() == "kube-system" && strings.HasPrefix(o.obj.GetKind(), "Role")):
			t.Errorf("%s %s is in namespace %q, want %q", o.obj.GetKind(), o.obj.GetName(), o.obj.GetNamespace(), ns)
		}
		if o.obj.GetLabels()["app.kubernetes.io/instance"] != release {
			t.Errorf("%s %s lacks the instance label", o.obj.GetKind(), o.obj.GetName())
		}
	}

	// Workloads: probes, resource requests, locked-down containers.
	for _, o := range r.objs {
		if o.obj.GetKind() != "Deployment" && o.obj.GetKind() != "DaemonSet" {
			continue
		}
		spec := podSpec(t, &o)
		for _, c := range spec.Containers {
			// Envoy refuses configuration with fields it does not know rather than dropping
			// them (some are about identity).
			if c.Name == "envoy" && !slices.Contains(c.Args, "--reject-unknown-dynamic-fields") {
				t.Errorf("%s/envoy: args %q lack --reject-unknown-dynamic-fields", o.obj.GetName(), c.Args)
			}
			// The node-pki copier serves nothing: no readiness of its own.
			if (c.ReadinessProbe == nil && c.Name != "node-pki") || c.LivenessProbe == nil {
				t.Errorf("%s/%s: missing probes", o.obj.GetName(), c.Name)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s/%s: no resource requests", o.obj.GetName(), c.Name)
			}
		}
		checkPrivileges(t, o.obj.GetName(), spec)
	}

	// xds-server: only real flags; probes on its admin port.
	xs := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
	x := container(t, xs, "xds-server")
	if x.Args[0] != "serve" {
		t.Errorf("xds-server args %v do not start with serve", x.Args)
	}
	xf := flags(t, x.Args[1:])
	for name := range xf {
		if !slices.Contains(xdsServerFlags, name) {
			t.Errorf("xds-server serve has no flag --%s", name)
		}
	}
	// A stopping replica serves on for --shutdown-delay, within its grace period.
	if d, err := time.ParseDuration(xf["shutdown-delay"]); err != nil {
		t.Errorf("xds-server --shutdown-delay=%q: %v", xf["shutdown-delay"], err)
	} else if g := xs.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < d+5*time.Second {
		t.Errorf("xds-server terminationGracePeriodSeconds %v: want at least --shutdown-delay %s + 5 s", g, d)
	}
	if x.ReadinessProbe.HTTPGet.Path != "/readyz" || x.LivenessProbe.HTTPGet.Path != "/healthz" || x.ReadinessProbe.HTTPGet.Port.StrVal != "admin" {
		t.Errorf("xds-server probes %v %v", x.ReadinessProbe, x.LivenessProbe)
	}
	if !slices.ContainsFunc(x.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "admin" && ":"+fmt.Sprint(p.ContainerPort) == xf["admin-address"]
	}) {
		t.Errorf("xds-server port admin does not match --admin-address=%s", xf["admin-address"])
	}
	if xs.AutomountServiceAccountToken != nil && !*xs.AutomountServiceAccountToken {
		t.Error("xds-server gets no API token")
	}

	// Envoy and extproc share the socket directory xds-server names; extproc uses real flags
	// and the xds source; Envoy's ServiceAccount has no token.
	var ew *manifest
	if ew = r.find("Deployment", fullname+"-envoy"); ew == nil {
		ew = r.mustFind(t, "DaemonSet", fullname+"-envoy")
	}
	es := podSpec(t, ew)
	if es.AutomountServiceAccountToken == nil || *es.AutomountServiceAccountToken {
		t.Error("Envoy pods mount an API token they do not need")
	}
	envoy, extproc := container(t, es, "envoy"), container(t, es, "extproc")
	pf := flags(t, extproc.Args)
	for name := range pf {
		if !slices.Contains(extprocFlags, name) {
			t.Errorf("extproc has no flag --%s", name)
		}
	}
	xdsHost := fmt.Sprintf("%s-xds-server.%s.svc.", fullname, ns)
	if !strings.HasPrefix(pf["source"], "xds:"+xdsHost) || !strings.HasSuffix(pf["source"], ":"+strings.TrimPrefix(xf["xds-address"], ":")) {
		t.Errorf("extproc --source=%s, want xds:%s...:<xds-server port>", pf["source"], xdsHost)
	}
	if "unix:"+strings.TrimPrefix(pf["listen"], "unix:") != xf["extproc-address"] || !strings.HasPrefix(pf["listen"], "unix:") {
		t.Errorf("extproc --listen=%s, xds-server --extproc-address=%s", pf["listen"], xf["extproc-address"])
	}
	sockDir := strings.TrimSuffix(strings.TrimPrefix(pf["listen"], "unix:"), "/extproc.sock")
	for _, c := range []*corev1.Container{envoy, extproc} {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "extproc-socket" && m.MountPath == sockDir }) {
			t.Errorf("%s does not mount the socket directory %s: %v", c.Name, sockDir, c.VolumeMounts)
		}
	}
	if !slices.ContainsFunc(es.Volumes, func(v corev1.Volume) bool { return v.Name == "extproc-socket" && v.EmptyDir != nil }) {
		t.Error("the socket directory is not an emptyDir")
	}
	checkProxyCheckFiles(t, es, extproc, xf)
	if extproc.ReadinessProbe.HTTPGet.Path != "/readyz" || extproc.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("extproc probes %v %v", extproc.ReadinessProbe, extproc.LivenessProbe)
	}
	if envoy.ReadinessProbe.HTTPGet.Path != "/ready" {
		t.Errorf("envoy readiness %v", envoy.ReadinessProbe)
	}
	if es.SecurityContext == nil || es.SecurityContext.RunAsUser == nil {
		t.Error("Envoy and extproc need one pod-wide user: the socket is owner-writable")
	}

	// The bootstrap ConfigMap is a valid Envoy Bootstrap pointing at the xds-server Service.
	cm := r.mustFind(t, "ConfigMap", fullname+"-envoy").typed.(*corev1.ConfigMap)
	b, err := decodeBootstrap([]byte(cm.Data["envoy.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	ads := b.GetDynamicResources().GetAdsConfig()
	if ads.GetApiType() != corev3.ApiConfigSource_GRPC || len(ads.GetGrpcServices()) != 1 || ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "xds-server" {
		t.Errorf("ads_config %v", ads)
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" {
		t.Errorf("Envoy admin on %s, want 127.0.0.1", a.GetAddress())
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "xds-server" {
			continue
		}
		sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if !strings.HasPrefix(sa.GetAddress(), xdsHost) || ":"+fmt.Sprint(sa.GetPortValue()) != xf["xds-address"] {
			t.Errorf("Envoy dials xds-server at %s:%d; xds-server listens on %s", sa.GetAddress(), sa.GetPortValue(), xf["xds-address"])
		}
	}
	if b.GetNode().GetCluster() != "kube-mvp" {
		t.Errorf("node cluster %q", b.GetNode().GetCluster())
	}
	// The SDS files the bootstrap's xds-server TLS reads are envoy/sds's, beside it.
	if !strings.Contains(cm.Data["envoy.yaml"], `matcher: {exact: "spiffe://kube-mvp/role/xds-server"}`) {
		t.Error("the bootstrap does not require xds-server's role of xds-server's certificate")
	}
	for _, f := range []string{"xds-client-cert.yaml", "xds-ca.yaml"} {
		want, err := os.ReadFile(filepath.Join("..", "envoy", "sds", f))
		if err != nil {
			t.Fatal(err)
		}
		wj, err1 := yaml.YAMLToJSON(want)
		gj, err2 := yaml.YAMLToJSON([]byte(cm.Data[f]))
		if err1 != nil || err2 != nil || string(wj) != string(gj) || !strings.Contains(cm.Data["envoy.yaml"], "/etc/kube-mvp/bootstrap/"+f) {
			t.Errorf("bootstrap ConfigMap %s differs from envoy/sds/%s or is not referenced (%v %v)", f, f, err1, err2)
		}
	}
	if _, ok := b.GetNode().GetMetadata().GetFields()[xds.LocalAPIServerMetadataKey]; ok {
		t.Error("the shared bootstrap names a local apiserver; it is per node (--config-yaml)")
	}
	checkDrainHooks(t, es, envoy, extproc, b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue())
}

// checkDrainHooks: a stopping Envoy pod drains first. extproc's preStop hook is drain-envoy
// (real flags) on Envoy's admin port (the bootstrap's), for Envoy's own --drain-time-s with
// --drain-strategy immediate, writing the file extproc's --drained-file names, in the
// directory both containers mount; Envoy's preStop hook is GET /drained on extproc's admin
// port, by number (the kubelet looks a hook's named port up in the hook's own container,
// which is Envoy's); /drained gives up only after drain-envoy would have written the file; the
// grace period covers the delay, the drain and 10 s for the exits.
func checkDrainHooks(t *testing.T, spec *corev1.PodSpec, envoy, extproc *corev1.Container, adminPort uint32) {
	t.Helper()
	pf := flags(t, extproc.Args)
	var extprocAdmin int32
	for _, p := range extproc.Ports {
		if p.Name == "extproc-admin" {
			extprocAdmin = p.ContainerPort
		}
	}
	if ":"+fmt.Sprint(extprocAdmin) != pf["admin-address"] {
		t.Errorf("extproc port extproc-admin %d, --admin-address=%s", extprocAdmin, pf["admin-address"])
	}
	if h := envoy.Lifecycle; h == nil || h.PreStop == nil || h.PreStop.HTTPGet == nil {
		t.Errorf("envoy's lifecycle %+v: no preStop httpGet", h)
	} else if g := h.PreStop.HTTPGet; g.Path != "/drained" || g.Port.Type != intstr.Int || g.Port.IntVal != extprocAdmin || g.Host != "" {
		t.Errorf("envoy's preStop GET %s:%s%s, want /drained on the pod's address, port %d by number", g.Host, g.Port.String(), g.Path, extprocAdmin)
	}
	if h := extproc.Lifecycle; h == nil || h.PreStop == nil || h.PreStop.Exec == nil || len(h.PreStop.Exec.Command) < 2 ||
		!slices.Equal(h.PreStop.Exec.Command[:2], []string{"/usr/local/bin/extproc", "drain-envoy"}) {
		t.Fatalf("extproc's lifecycle %+v: want a preStop exec of /usr/local/bin/extproc drain-envoy", h)
	}
	df := flags(t, extproc.Lifecycle.PreStop.Exec.Command[2:])
	for name := range df {
		if !slices.Contains(drainEnvoyFlags, name) {
			t.Errorf("extproc drain-envoy has no flag --%s", name)
		}
	}
	if df["envoy-admin"] != fmt.Sprintf("127.0.0.1:%d", adminPort) {
		t.Errorf("drain-envoy --envoy-admin=%s; Envoy's admin is on 127.0.0.1:%d", df["envoy-admin"], adminPort)
	}
	if df["done-file"] == "" || df["done-file"] != pf["drained-file"] {
		t.Errorf("drain-envoy --done-file=%q, extproc --drained-file=%q", df["done-file"], pf["drained-file"])
	}
	for _, c := range []*corev1.Container{envoy, extproc} {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "extproc-socket" && m.MountPath == filepath.Dir(df["done-file"]) && !m.ReadOnly
		}) {
			t.Errorf("%s does not mount the emptyDir at %s, where the done file is", c.Name, filepath.Dir(df["done-file"]))
		}
	}
	delay, err1 := time.ParseDuration(df["delay"])
	drain, err2 := time.ParseDuration(df["drain-time"])
	maxWait, err3 := time.ParseDuration(pf["drained-max-wait"])
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatalf("drain-envoy --delay=%s --drain-time=%s, extproc --drained-max-wait=%s: %v", df["delay"], df["drain-time"], pf["drained-max-wait"], err)
	}
	if i := slices.Index(envoy.Args, "--drain-time-s"); i < 0 || i+1 >= len(envoy.Args) || envoy.Args[i+1] != fmt.Sprint(int(drain.Seconds())) {
		t.Errorf("envoy args %q: want --drain-time-s %d, drain-envoy's --drain-time", envoy.Args, int(drain.Seconds()))
	}
	if i := slices.Index(envoy.Args, "--drain-strategy"); i < 0 || i+1 >= len(envoy.Args) || envoy.Args[i+1] != "immediate" {
		t.Errorf("envoy args %q: want --drain-strategy immediate", envoy.Args)
	}
	// drain-envoy writes the file by delay + drain + its retries of an unreachable Envoy (2 s)
	// and one poll.
	if maxWait < delay+drain+5*time.Second {
		t.Errorf("--drained-max-wait=%s gives up before drain-envoy (--delay=%s, --drain-time=%s) is done", maxWait, delay, drain)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < delay+drain+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: want at least %s", g, delay+drain+10*time.Second)
	}
}

// copiers are the containers that copy the node's kubeadm front-proxy-client pair: the only
// ones that run as root.
var copiers = []string{"copy-node-pki", "node-pki"}

// es is the pod's security context, never nil.
func es(spec *corev1.PodSpec) *corev1.PodSecurityContext {
	if spec.SecurityContext == nil {
		return &corev1.PodSecurityContext{}
	}
	return spec.SecurityContext
}

// checkPrivileges: every container (init containers too) has a read-only root file system,
// no privilege escalation and drops every capability, adding none; only the copiers run as
// uid 0 (their own runAsUser 0 and runAsNonRoot false overriding the pod's), every other one
// as the pod's non-root user; and no container mounts a directory of the node (hostPath
// other than type File), so none sees /etc/kubernetes/pki whole.
func checkPrivileges(t *testing.T, workload string, spec *corev1.PodSpec) {
	t.Helper()
	psc := es(spec)
	hostDirs := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathFile) {
			hostDirs[v.Name] = v.HostPath.Path
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		name := workload + "/" + c.Name
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("%s: security context %v, want a read-only root, no privilege escalation, every capability dropped", name, sc)
			continue
		}
		uid, nonRoot := psc.RunAsUser, psc.RunAsNonRoot
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		switch root := uid == nil || *uid == 0; {
		case slices.Contains(copiers, c.Name):
			if sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot {
				t.Errorf("%s: runAsUser %v runAsNonRoot %v, want 0 and false of its own (it reads the node's root-owned key)", name, sc.RunAsUser, sc.RunAsNonRoot)
			}
		case root || nonRoot == nil || !*nonRoot:
			t.Errorf("%s: runs as user %v (runAsNonRoot %v): only %v run as root", name, uid, nonRoot, copiers)
		}
		for _, m := range c.VolumeMounts {
			if p, ok := hostDirs[m.Name]; ok {
				t.Errorf("%s mounts the node's directory %s", name, p)
			}
			if strings.HasPrefix(m.MountPath, "/etc/kubernetes") {
				t.Errorf("%s mounts something at %s", name, m.MountPath)
			}
		}
	}
}

// checkProxyCheckFiles: with a proxy client certificate (xds-server's --proxy-client-cert),
// extproc checks the apiservers with exactly the files Envoy presents and verifies them with
// (the same paths as xds-server names, the same server name), and its container mounts those
// three files read-only and nothing else of the certificates (no serving key, no whole
// Secret, nothing of the node: the kubeadm pair comes from the node-pki emptyDir); without one
// it has neither the flags nor the mounts.
func checkProxyCheckFiles(t *testing.T, spec *corev1.PodSpec, extproc *corev1.Container, xf map[string]string) {
	t.Helper()
	pf := flags(t, extproc.Args)
	names := []string{"proxy-client-cert", "proxy-client-key", "peer-ca", "upstream-server-name"}
	own := func(m corev1.VolumeMount) bool { return m.Name == "extproc-socket" || m.Name == "extproc-tls" }
	if xf["proxy-client-cert"] == "" {
		for _, n := range names {
			if v, ok := pf[n]; ok {
				t.Errorf("extproc --%s=%s without a proxy client certificate", n, v)
			}
		}
		for _, m := range extproc.VolumeMounts {
			if !own(m) {
				t.Errorf("extproc mounts %s at %s without a proxy client certificate", m.Name, m.MountPath)
			}
		}
		return
	}
	for _, n := range names {
		if pf[n] == "" || pf[n] != xf[n] {
			t.Errorf("extproc --%s=%q, xds-server (Envoy's file) %q", n, pf[n], xf[n])
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	provided := map[string]bool{}
	for _, m := range extproc.VolumeMounts {
		if own(m) {
			continue
		}
		v, ok := volumes[m.Name]
		switch {
		case !ok:
			t.Errorf("extproc mounts %s, which is no volume", m.Name)
		case !m.ReadOnly || m.SubPath != "":
			t.Errorf("extproc mounts %s read-only %v, subPath %q", m.Name, m.ReadOnly, m.SubPath)
		case v.Secret != nil && len(v.Secret.Items) > 0:
			for _, it := range v.Secret.Items {
				if it.Key != it.Path {
					t.Errorf("extproc's %s: key %s at %s", m.Name, it.Key, it.Path)
				}
				provided[m.MountPath+"/"+it.Path] = true
			}
		case v.EmptyDir != nil && v.Name == "node-pki":
			// The node's kubeadm pair, as the copier containers publish it.
			provided[m.MountPath+"/front-proxy-client.crt"] = true
			provided[m.MountPath+"/front-proxy-client.key"] = true
		default:
			t.Errorf("extproc mounts %s at %s: %+v, want a Secret's items or the node-pki emptyDir", m.Name, m.MountPath, v.VolumeSource)
		}
	}
	want := map[string]bool{xf["proxy-client-cert"]: true, xf["proxy-client-key"]: true, xf["peer-ca"]: true}
	if !maps.Equal(provided, want) {
		t.Errorf("extproc's mounts provide %v, want exactly %v", slices.Sorted(maps.Keys(provided)), slices.Sorted(maps.Keys(want)))
	}
}

// dump prints what each case renders: go test ./deploy -run TestRender/sidecar -dump -v
var dump = flag.Bool("dump", false, "log the rendered manifests and NOTES of each case")

// TestRender renders the chart for the default values and every documented option.
func TestRender(t *testing.T) {
	p := testPKI(t)
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			ns := "kube-mvp"
			r, err := render(c.values(p), ns)
			if err != nil {
				t.Fatal(err)
			}
			if *dump {
				for _, o := range r.objs {
					t.Logf("# %s\n%s", o.source, o.raw)
				}
				t.Logf("NOTES:\n%s", r.notes)
			}
			checkCommon(t, r, ns)
			c.check(t, r, ns)
		})
	}
}

// TestSchemaRejects: values.schema.json turns away values of the wrong type or shape, naming
// the key, before anything renders.
func TestSchemaRejects(t *testing.T) {
	for _, c := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"xdsServer": map[string]any{"replicas": "two"}}, "replicas"},
		{map[string]any{"xdsServer": map[string]any{"replicas": 0}}, "replicas"},
		{map[string]any{"mode": "mesh"}, "mode"},
		{map[string]any{"xdsServer": map[string]any{"livenessWindow": "30 seconds"}}, "livenessWindow"},
		{map[string]any{"xdsServer": map[string]any{"apiserverAddresses": map[string]any{"cp-a": "10.0.0.1"}}}, "apiserverAddresses"},
		{map[string]any{"envoy": map[string]any{"listenPort": 70000}}, "listenPort"},
		{map[string]any{"envoy": map[string]any{"listenAddress": "localhost"}}, "listenAddress"},
		{map[string]any{"envoy": map[string]any{"service": map[string]any{"type": "ExternalName"}}}, "type"},
		{map[string]any{"certificates": map[string]any{"existingSecretParts": []any{"serving", "bogus"}}}, "existingSecretParts"},
		{map[string]any{"replicas": 2}, "replicas"}, // misplaced key: additional properties are not allowed
		{map[string]any{"xdsServer": map[string]any{"replica": 2}}, "replica"},
		{map[string]any{"envoy": map[string]any{"shutdown": map[string]any{"drainSeconds": 0}}}, "drainSeconds"},
		{map[string]any{"envoy": map[string]any{"shutdown": map[string]any{"delaySeconds": "5s"}}}, "delaySeconds"},
		{map[string]any{"envoy": map[string]any{"shutdown": map[string]any{"drain": 30}}}, "drain"},
		{map[string]any{"envoy": map[string]any{"terminationGracePeriodSeconds": 0}}, "terminationGracePeriodSeconds"},
		{map[string]any{"rbac": map[string]any{"operators": []any{map[string]any{"kind": "Group"}}}}, "name"},
		{map[string]any{"monitoring": map[string]any{"prometheusRule": map[string]any{"enabled": "yes"}}}, "enabled"},
		{map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"interval": "30 seconds"}}}, "interval"},
		{map[string]any{"monitoring": map[string]any{"dashboards": map[string]any{"label": map[string]any{}}}}, "label"},
	} {
		t.Run(fmt.Sprint(c.vals), func(t *testing.T) {
			_, err := render(c.vals, "kube-mvp")
			if err == nil {
				t.Fatalf("values %v accepted", c.vals)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error does not name %q: %v", c.want, err)
			}
		})
	}
}

// TestTemplateRejects: combinations the schema cannot express fail with a message saying
// what to change.
func TestTemplateRejects(t *testing.T) {
	p := testPKI(t)
	for _, c := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"cert-without-key", map[string]any{"certificates": map[string]any{"servingCert": string(p.Serving.CertPEM)}}, "servingCert and certificates.servingKey go together"},
		{"proxy-key-without-cert", map[string]any{"certificates": map[string]any{"proxyClientKey": string(p.ProxyClient.KeyPEM)}}, "proxyClientCert and certificates.proxyClientKey go together"},
		{"client-ca-without-serving", map[string]any{"certificates": map[string]any{"clientCA": string(p.ClientCA.CertPEM)}}, "client CA needs a serving certificate"},
		{"client-ca-without-proxy-cert", map[string]any{"certificates": map[string]any{"clientCA": string(p.ClientCA.CertPEM),
			"servingCert": string(p.Serving.CertPEM), "servingKey": string(p.Serving.KeyPEM)}}, "client CA needs the front-proxy client certificate"},
		{"sidecar-on-apiserver-port", map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}, "sidecar": map[string]any{"listenPort": 6443}}, "apiserver's own port"},
		{"sidecar-host-network-policy", map[string]any{"mode": "sidecar"}, "networkPolicy.xdsFrom"},
		{"proxy-cert-without-peer-ca", map[string]any{"certificates": map[string]any{"proxyClientCert": string(p.ProxyClient.CertPEM), "proxyClientKey": string(p.ProxyClient.KeyPEM)}},
			"a proxy client certificate needs a peer CA"},
		{"kubeadm-front-proxy-without-peer-ca", map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}, "sidecar": map[string]any{"kubeadmFrontProxyClient": true}},
			"kubeadmFrontProxyClient needs certificates.peerCA"},
		{"no-control-plane-certificates", map[string]any{"certgen": map[string]any{"enabled": false}}, "needs the control plane's certificates"},
		{"grace-shorter-than-drain", map[string]any{"envoy": map[string]any{"shutdown": map[string]any{"drainSeconds": 60}}},
			"envoy.terminationGracePeriodSeconds (60) must be at least envoy.shutdown.delaySeconds (5) + envoy.shutdown.drainSeconds (60) + 10 (for Envoy and extproc to exit): raise it to 75, or shorten the delay or the drain"},
		{"sidecar-grace", map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}, "envoy": map[string]any{"terminationGracePeriodSeconds": 30}},
			"envoy.terminationGracePeriodSeconds (30) must be at least"},
		{"pod-monitor-without-scraper", map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}},
			"name Prometheus' pods in monitoring.podMonitor.scraperFrom"},
		{"xds-server-grace", map[string]any{"xdsServer": map[string]any{"shutdownDelaySeconds": 60}},
			"xdsServer.terminationGracePeriodSeconds (45) must be at least xdsServer.shutdownDelaySeconds (60) + 5 (to close its streams and exit): raise it to 65, or shorten the delay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(c.vals, "kube-mvp")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// TestRenderWithAnOlderChartsDefaults: `helm upgrade --reuse-values` renders the new templates
// with the values of the release being upgraded, the old chart's defaults included, so values
// the old chart did not have are absent (not at their new defaults). The stop-time values
// came with the drain, the monitoring values with the alerts; without them the templates use
// the same defaults as values.yaml.
func TestRenderWithAnOlderChartsDefaults(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kube-mvp")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		t.Fatal(err)
	}
	x, e := vals["xdsServer"].(map[string]any), vals["envoy"].(map[string]any)
	delete(x, "shutdownDelaySeconds")
	delete(x, "terminationGracePeriodSeconds")
	delete(e, "shutdown")
	delete(e, "terminationGracePeriodSeconds")
	delete(vals, "monitoring")
	if raw, err = yaml.Marshal(vals); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "values.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := RenderChartFor(dir, release, "kube-mvp", certificateValues(testPKI(t)), MonitoringAPIs...)
	if err != nil {
		t.Fatalf("the chart does not render without the stop-time and monitoring values: %v", err)
	}
	var all string
	for _, m := range out {
		all += m
	}
	for _, want := range []string{
		"terminationGracePeriodSeconds: 45", `- "--shutdown-delay=35s"`,
		"terminationGracePeriodSeconds: 60", "- --drain-time-s\n            - \"45\"", `- "--delay=5s"`,
		// monitoring.prometheusRule.enabled: auto, with its default thresholds.
		"kind: PrometheusRule", "86400 < 14\n", "86400 < 3\n", "> 0.05\n",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("rendered without the stop-time values, the manifests lack %q", want)
		}
	}
}

// checkSupportedEnvoy: the chart's default Envoy is a release Envoy supports today (a year from
// its .0), of the newest line kube-mvp knows: when this fails, move the default and the window
// (internal/envoyrelease).
func checkSupportedEnvoy(t *testing.T, image string) {
	t.Helper()
	var major, minor, patch uint32
	if _, err := fmt.Sscanf(image, "envoyproxy/envoy:v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("envoy image %s: not envoyproxy/envoy:vX.Y.Z: %v", image, err)
	}
	if why := envoyrelease.Support(major, minor, patch, time.Now()); why != "" {
		t.Errorf("envoy image %s: %s", image, why)
	}
	if newest := envoyrelease.Newest().Minor; major != 1 || minor != newest {
		t.Errorf("envoy image %s: not of the newest line kube-mvp supports, 1.%d", image, newest)
	}
}
