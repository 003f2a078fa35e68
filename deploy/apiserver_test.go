package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestChartOnRealAPIServer applies every rendering of the chart with server-side dry-run to a
// real kube-apiserver (so every object is valid for the API, field by field), then installs the
// RBAC for real and checks, by SubjectAccessReview for the xds-server service account, that it
// may read exactly what xds-server reads and nothing else. Last it runs xds-server and extproc
// with exactly the arguments the chart gives them (paths and ports moved to the test's own),
// xds-server with the service account's token: both must become ready, which proves the flags
// exist, the certificate Secret's keys match the paths, and the RBAC suffices.
func TestChartOnRealAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 20*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{
		Log:     testutil.LogWriter(t),
		Servers: []controlplane.ServerSpec{{Name: "cp-a", Version: "v1.37.1"}},
	})
	srv := cp.Server("cp-a")
	client, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))

	apply := func(t *testing.T, m manifest, dryRun bool) {
		t.Helper()
		gvk := m.obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		js, err := m.obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		opts := metav1.PatchOptions{FieldManager: "kube-mvp-chart-test", Force: new(true), FieldValidation: "Strict"}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			ri = dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
		}
		if _, err := ri.Patch(ctx, m.obj.GetName(), types.ApplyPatchType, js, opts); err != nil {
			t.Errorf("apply %s %s/%s (dry run %v): %v", gvk.Kind, m.obj.GetNamespace(), m.obj.GetName(), dryRun, err)
		}
	}
	createNamespace := func(t *testing.T, ns string) {
		t.Helper()
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("dry-run", func(t *testing.T) {
		for _, c := range chartCases {
			t.Run(c.name, func(t *testing.T) {
				ns := "kube-mvp-" + c.name
				createNamespace(t, ns) // dry-run needs the namespace to exist
				r, err := render(c.values(cp.PKI), ns)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range r.objs {
					apply(t, m, true)
				}
			})
		}
	})

	// The monitoring objects against prometheus-operator's own CRDs (their OpenAPI schemas,
	// strict field validation), with the chart deciding "auto" from the API versions the
	// cluster then serves, as helm install does.
	t.Run("monitoring", func(t *testing.T) {
		for _, crd := range prometheusOperatorCRDs(t) {
			apply(t, crd, false)
		}
		if t.Failed() {
			t.FailNow()
		}
		err := testutil.Until(ctx, time.Minute, "the monitoring CRDs served", func() error {
			mapper.Reset()
			for _, api := range MonitoringAPIs {
				gv, kind := path.Split(api)
				if _, err := mapper.RESTMapping(schema.ParseGroupKind(kind+"."+strings.Split(gv, "/")[0]), strings.Split(gv, "/")[1]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		scraper := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}
		for name, vals := range map[string]map[string]any{
			"front": {"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true, "interval": "30s", "labels": map[string]any{"release": "kps"}, "scraperFrom": scraper},
				"dashboards": map[string]any{"enabled": true}}},
			"sidecar": {"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}, "monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}},
		} {
			t.Run(name, func(t *testing.T) {
				ns := "kube-mvp-monitoring-" + name
				createNamespace(t, ns)
				maps.Copy(vals, certificateValues(cp.PKI))
				r, err := render(vals, ns, MonitoringAPIs...)
				if err != nil {
					t.Fatal(err)
				}
				kinds := map[string]bool{}
				for _, m := range r.objs {
					kinds[m.obj.GetKind()] = true
					apply(t, m, true)
				}
				if !kinds["PrometheusRule"] || !kinds["PodMonitor"] {
					t.Errorf("rendered kinds %v: want a PrometheusRule (auto) and a PodMonitor", slices.Sorted(maps.Keys(kinds)))
				}
			})
		}
	})

	// From here on: the chart with every certificate, installed in namespace kube-mvp.
	const ns = "kube-mvp"
	createNamespace(t, ns)
	r, err := render(certificateValues(cp.PKI), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.objs {
		switch m.obj.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			apply(t, m, false)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	sa := fullname + "-xds-server"

	t.Run("rbac", func(t *testing.T) {
		type access struct {
			verb, group, resource, namespace, name, path string
		}
		// each is a once for each verb, the way an RBAC rule lists them.
		each := func(a access, verbs ...string) []access {
			out := make([]access, len(verbs))
			for i, v := range verbs {
				out[i] = a
				out[i].verb = v
			}
			return out
		}
		leases := access{group: "coordination.k8s.io", resource: "leases", namespace: "kube-system"}
		authentication := access{resource: "configmaps", namespace: "kube-system", name: "extension-apiserver-authentication"}
		storageVersions := access{group: "internal.apiserver.k8s.io", resource: "storageversions"}
		apiServices := access{group: "apiregistration.k8s.io", resource: "apiservices"}
		crds := access{group: "apiextensions.k8s.io", resource: "customresourcedefinitions"}
		allowed := slices.Concat(
			each(leases, "get", "list", "watch"),
			each(authentication, "get", "list", "watch"),
			each(storageVersions, "get", "list", "watch"),
			each(apiServices, "list", "watch"),
			each(crds, "list", "watch"),
			// Discovery, from the built-in system:discovery role, not from the chart.
			[]access{{verb: "get", path: "/api"}, {verb: "get", path: "/apis"}, {verb: "get", path: "/apis/batch/v1"}},
		)
		denied := slices.Concat(
			[]access{
				{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "default"},
				{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: ns},
				{verb: "list", group: "coordination.k8s.io", resource: "leases"}, // all namespaces
				{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"},
			},
			each(leases, "update", "create", "delete", "patch"),
			each(authentication, "update", "delete", "patch"),
			[]access{{verb: "get", resource: "configmaps", namespace: "kube-system", name: "kubeadm-config"}},
			each(storageVersions, "update", "delete"),
			each(apiServices, "update"),
			each(crds, "create"),
			[]access{
				{verb: "get", resource: "secrets", namespace: "kube-system"},
				{verb: "get", resource: "secrets", namespace: ns},
				{verb: "list", resource: "pods", namespace: "kube-system"},
				{verb: "list", resource: "configmaps", namespace: "kube-system"},
				{verb: "list", resource: "nodes"},
				{verb: "list", resource: "endpoints", namespace: "default"},
				{verb: "list", group: "discovery.k8s.io", resource: "endpointslices", namespace: "default"},
				{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
				{verb: "impersonate", resource: "users"},
				{verb: "get", path: "/metrics"},
			},
		)
		review := func(user string, groups []string, a access) (bool, error) {
			spec := authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups}
			if a.path != "" {
				spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Verb: a.verb, Path: a.path}
			} else {
				spec.ResourceAttributes = &authorizationv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace, Name: a.name}
			}
			res, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return res.Status.Allowed, nil
		}
		// The groups the apiserver gives a service account token.
		xdsUser := "system:serviceaccount:" + ns + ":" + sa
		saGroups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
		// RBAC reads Roles, RoleBindings, ClusterRoles and ClusterRoleBindings from informers
		// of their own: wait until every grant shows (bounded: a missing one fails here).
		testutil.WaitFor(t, ctx, 90*time.Second, "every grant of the chart's RBAC to take effect", func() error {
			var denied []string
			for _, a := range allowed {
				ok, err := review(xdsUser, saGroups, a)
				if err != nil {
					return err
				}
				if !ok {
					denied = append(denied, fmt.Sprintf("%s: %+v", xdsUser, a))
				}
			}
			if ok, err := review(contract.HealthCheckUser, nil, access{verb: "get", path: "/readyz"}); err != nil {
				return err
			} else if !ok {
				denied = append(denied, contract.HealthCheckUser+": GET /readyz")
			}
			if len(denied) > 0 {
				return fmt.Errorf("still denied: %v", denied)
			}
			return nil
		})
		for _, a := range denied {
			if ok, err := review(xdsUser, saGroups, a); err != nil || ok {
				t.Errorf("%s: %+v allowed (%v), want denied", xdsUser, a, err)
			}
		}
		// Envoy and extproc have no API access at all (and no token).
		envoyUser := "system:serviceaccount:" + ns + ":" + fullname + "-envoy"
		for _, a := range allowed[:8] {
			if ok, err := review(envoyUser, saGroups, a); err != nil || ok {
				t.Errorf("%s: %+v allowed (%v), want denied", envoyUser, a, err)
			}
		}
		// Envoy's health checks ask as contract.HealthCheckUser: the chart lets it GET /readyz
		// and nothing else (reviewed without groups, so that Kubernetes' own grants to every
		// authenticated user, such as system:public-info-viewer, do not count).
		if ok, err := review(contract.HealthCheckUser, nil, access{verb: "get", path: "/readyz"}); err != nil || !ok {
			t.Errorf("%s: GET /readyz denied (%v), want allowed", contract.HealthCheckUser, err)
		}
		for _, a := range []access{{verb: "get", path: "/metrics"}, {verb: "get", path: "/livez"}, {verb: "get", path: "/api"},
			{verb: "list", resource: "pods", namespace: "kube-system"}, {verb: "get", resource: "secrets", namespace: ns}} {
			if ok, err := review(contract.HealthCheckUser, nil, a); err != nil || ok {
				t.Errorf("%s: %+v allowed (%v), want denied", contract.HealthCheckUser, a, err)
			}
		}
	})

	t.Run("binaries-with-chart-args", func(t *testing.T) {
		root, err := controlplane.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		bin := t.TempDir()
		build := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "./cmd/xds-server", "./cmd/extproc")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}

		// The service account's credentials, as a pod would have them.
		tok, err := srv.ServiceAccountToken(ctx, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		kubeconfig := filepath.Join(dir, "kubeconfig")
		if err := srv.WriteTokenKubeconfig(kubeconfig, tok, ""); err != nil {
			t.Fatal(err)
		}

		// The control plane's certificates as the chart's certgen makes them, each role's in
		// the directory its container mounts at /etc/kube-mvp/xds-tls. (The Envoy
		// certificates are paths xds-server hands on without opening them.)
		xdsPod := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
		xdsC := container(t, xdsPod, "xds-server")
		cpTLS := filepath.Join(dir, "cp-tls")
		if out, err := exec.CommandContext(ctx, filepath.Join(bin, "xds-server"), "certgen", "--out-dir", cpTLS, "--dns-names", "localhost").CombinedOutput(); err != nil {
			t.Fatalf("certgen: %v\n%s", err, out)
		}
		sockDir, err := os.MkdirTemp("", "kmvp-sock-") // short: unix socket paths are limited
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(sockDir)

		xdsPort, xdsAdmin, extprocAdmin := freePort(t), freePort(t), freePort(t)
		// localArgs are a container's arguments from the chart with the role's certificate
		// directory and the socket directory moved to the test's, and the flags in local
		// (listening and upstream addresses) given the test's values.
		localArgs := func(role string, args []string, local map[string]string) []string {
			var out []string
			for _, a := range args {
				if flag, _, _ := strings.Cut(a, "="); local[flag] != "" {
					a = flag + "=" + local[flag]
				}
				a = strings.ReplaceAll(a, "/etc/kube-mvp/xds-tls", filepath.Join(cpTLS, role))
				out = append(out, strings.ReplaceAll(a, "/var/run/kube-mvp", sockDir))
			}
			return out
		}
		xdsArgs := append(localArgs("xds-server", xdsC.Args, map[string]string{
			"--xds-address":   "127.0.0.1:" + xdsPort,
			"--admin-address": "127.0.0.1:" + xdsAdmin,
		}), "--kubeconfig="+kubeconfig)
		stopXDS := startProcess(t, filepath.Join(bin, "xds-server"), xdsArgs...)
		defer stopXDS()

		// xds-server is ready once its informers synced (the RBAC suffices) and it built a
		// topology; discovery (fetched with the same token) adds subresources.
		testutil.WaitFor(t, ctx, 90*time.Second, "xds-server /readyz", func() error { return getOK("http://127.0.0.1:" + xdsAdmin + "/readyz") })
		testutil.WaitFor(t, ctx, 90*time.Second, "xds-server's topology from discovery", func() error {
			var view struct {
				APIServers []struct {
					Hostname string `json:"hostname"`
					Alive    bool   `json:"alive"`
				} `json:"apiservers"`
				GroupVersions []struct {
					GroupVersion string `json:"groupVersion"`
					Resources    []struct {
						Resource string `json:"resource"`
					} `json:"resources"`
				} `json:"groupVersions"`
			}
			if err := getJSON("http://127.0.0.1:"+xdsAdmin+"/debug/topology", &view); err != nil {
				return err
			}
			if len(view.APIServers) != 1 || view.APIServers[0].Hostname != "cp-a" || !view.APIServers[0].Alive {
				return fmt.Errorf("apiservers %+v, want cp-a alive", view.APIServers)
			}
			for _, gv := range view.GroupVersions {
				for _, res := range gv.Resources {
					if gv.GroupVersion == "batch/v1" && res.Resource == "jobs/status" {
						return nil
					}
				}
			}
			return fmt.Errorf("no batch/v1 jobs/status (a subresource only discovery knows) in %d group/versions", len(view.GroupVersions))
		})
		// The secrets made it into the configuration as the paths Envoy mounts them at.
		dump, err := getBody("http://127.0.0.1:" + xdsAdmin + "/debug/config_dump")
		if err != nil {
			t.Error(err)
		}
		if !strings.Contains(dump, `"filename": "/etc/kube-mvp/certificates/serving.crt"`) || strings.Contains(dump, "PRIVATE KEY") {
			t.Error("config_dump does not name the serving certificate's file, or holds a key")
		}

		// extproc's files of the certificates Secret (the proxy certificate check) are the
		// control plane's, under the Secret's key names, where the test's directory is.
		certDir := filepath.Join(dir, "certificates")
		if err := os.Mkdir(certDir, 0o700); err != nil {
			t.Fatal(err)
		}
		for key, from := range map[string]string{"proxy-client.crt": "proxy-client.crt", "proxy-client.key": "proxy-client.key", "peer-ca.crt": "server-ca.crt"} {
			b, err := os.ReadFile(cp.PKI.Path(from))
			if err == nil {
				err = os.WriteFile(filepath.Join(certDir, key), b, 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		envoyPod := podSpec(t, r.mustFind(t, "Deployment", fullname+"-envoy"))
		var extprocArgs []string
		for _, a := range localArgs("extproc", container(t, envoyPod, "extproc").Args, map[string]string{
			"--source":        "xds:127.0.0.1:" + xdsPort,
			"--admin-address": "127.0.0.1:" + extprocAdmin,
		}) {
			extprocArgs = append(extprocArgs, strings.ReplaceAll(a, "/etc/kube-mvp/certificates", certDir))
		}
		stopExtproc := startProcess(t, filepath.Join(bin, "extproc"), extprocArgs...)
		defer stopExtproc()
		testutil.WaitFor(t, ctx, 90*time.Second, "extproc /readyz (a routing table from xds-server)", func() error {
			return getOK("http://127.0.0.1:" + extprocAdmin + "/readyz")
		})
		// With the chart's flags extproc checked the apiserver with the proxy certificate,
		// which it accepts.
		testutil.WaitFor(t, ctx, 90*time.Second, "extproc's proxy certificate check", func() error {
			m, err := getBody("http://127.0.0.1:" + extprocAdmin + "/metrics")
			if err == nil && !strings.Contains(m, "kube_mvp_extproc_proxy_certificate_accepted{apiserver=") {
				err = errors.New("no kube_mvp_extproc_proxy_certificate_accepted yet")
			} else if err == nil && !regexp.MustCompile(`kube_mvp_extproc_proxy_certificate_accepted\{apiserver="[^"]+"\} 1\n`).MatchString(m) {
				err = fmt.Errorf("the apiserver refuses the proxy certificate: %s", m)
			}
			return err
		})
		if body, err := getBody("http://127.0.0.1:" + extprocAdmin + "/readyz"); err != nil || strings.Contains(body, "refuse") {
			t.Errorf("extproc /readyz: %v\n%s", err, body)
		}
		if _, err := os.Stat(filepath.Join(sockDir, "extproc.sock")); err != nil {
			t.Errorf("extproc's socket is not where xds-server tells Envoy to find it: %v", err)
		}
		// The preStop hooks with the chart's arguments: drain-envoy, with no Envoy to drain
		// (nothing listens on its admin port here), still writes the file where extproc's
		// /drained (the Envoy container's hook) looks, and exits 0; /drained then answers.
		hook := container(t, envoyPod, "extproc").Lifecycle.PreStop.Exec.Command
		if filepath.Base(hook[0]) != "extproc" {
			t.Fatalf("extproc's preStop hook %q does not run extproc", hook)
		}
		drainArgs := localArgs("extproc", hook[1:], map[string]string{"--envoy-admin": "127.0.0.1:" + freePort(t), "--delay": "0s"})
		if out, err := exec.CommandContext(ctx, filepath.Join(bin, "extproc"), drainArgs...).CombinedOutput(); err != nil {
			t.Errorf("extproc %q: %v\n%s", drainArgs, err, out)
		}
		if body, err := getBody("http://127.0.0.1:" + extprocAdmin + "/drained"); err != nil || body != "drained\n" {
			t.Errorf("extproc /drained after drain-envoy: %q %v", body, err)
		}

		// sidecar.kubeadmFrontProxyClient: the copier containers' commands, with the node's
		// two files (root's, 0600, as kubeadm writes them) and the emptyDir moved to the
		// test's, publish the pair where the rendering's xds-server and extproc name it; an
		// extproc with that rendering's arguments then checks the apiserver with it.
		t.Run("kubeadm-copier", func(t *testing.T) {
			var kc *chartCase
			for i := range chartCases {
				if chartCases[i].name == "sidecar-kubeadm-front-proxy" {
					kc = &chartCases[i]
				}
			}
			kr, err := render(kc.values(cp.PKI), ns)
			if err != nil {
				t.Fatal(err)
			}
			pod := podSpec(t, kr.mustFind(t, "DaemonSet", fullname+"-envoy"))
			host, nodePKI := filepath.Join(dir, "host"), filepath.Join(dir, "node-pki")
			for _, d := range []string{host, nodePKI} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for name, from := range map[string]string{"front-proxy-client.crt": "proxy-client.crt", "front-proxy-client.key": "proxy-client.key"} {
				b, err := os.ReadFile(cp.PKI.Path(from))
				if err == nil {
					err = os.WriteFile(filepath.Join(host, name), b, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			local := func(args []string) []string {
				var out []string
				for _, a := range args {
					a = strings.ReplaceAll(a, "/host", host)
					a = strings.ReplaceAll(a, "/var/run/kube-mvp/node-pki", nodePKI)
					if strings.HasPrefix(a, "--group=") && os.Geteuid() != 0 {
						a = fmt.Sprintf("--group=%d", os.Getgid()) // the pod's group, which only root may give here
					}
					out = append(out, a)
				}
				return out
			}
			extproc := filepath.Join(bin, "extproc")
			if out, err := exec.CommandContext(ctx, extproc, local(pod.InitContainers[0].Args)...).CombinedOutput(); err != nil {
				t.Fatalf("copy-node-pki's command: %v\n%s", err, out)
			}
			probe := container(t, pod, "node-pki").LivenessProbe.Exec.Command
			if filepath.Base(probe[0]) != "extproc" {
				t.Fatalf("node-pki's liveness probe runs %s", probe[0])
			}
			if out, err := exec.CommandContext(ctx, extproc, local(probe[1:])...).CombinedOutput(); err != nil {
				t.Errorf("node-pki's liveness probe: %v\n%s", err, out)
			}
			xf := flags(t, container(t, podSpec(t, kr.mustFind(t, "Deployment", fullname+"-xds-server")), "xds-server").Args[1:])
			for flag, from := range map[string]string{"proxy-client-cert": "proxy-client.crt", "proxy-client-key": "proxy-client.key"} {
				want, _ := os.ReadFile(cp.PKI.Path(from))
				if got, err := os.ReadFile(local([]string{xf[flag]})[0]); err != nil || !bytes.Equal(got, want) {
					t.Errorf("xds-server --%s=%s: not the node's file as copied (%v)", flag, xf[flag], err)
				}
			}
			admin := freePort(t)
			var args []string
			for _, a := range localArgs("extproc", local(container(t, pod, "extproc").Args), map[string]string{
				"--source":        "xds:127.0.0.1:" + xdsPort,
				"--admin-address": "127.0.0.1:" + admin,
				"--listen":        "unix:" + filepath.Join(sockDir, "kubeadm.sock"),
			}) {
				args = append(args, strings.ReplaceAll(a, "/etc/kube-mvp/certificates", certDir))
			}
			stop := startProcess(t, extproc, args...)
			defer stop()
			testutil.WaitFor(t, ctx, 90*time.Second, "extproc's proxy certificate check with the copied pair", func() error {
				m, err := getBody("http://127.0.0.1:" + admin + "/metrics")
				if err == nil && !regexp.MustCompile(`kube_mvp_extproc_proxy_certificate_accepted\{apiserver="[^"]+"\} 1\n`).MatchString(m) {
					err = errors.New("the apiserver has not accepted the copied proxy certificate yet")
				}
				return err
			})
		})
	})
}

// startProcess runs a binary until the returned stop is called; its output goes to the test
// log when the test fails.
func startProcess(t *testing.T, path string, args ...string) (stop func()) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	return func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s %s:\n%s", filepath.Base(path), strings.Join(args, " "), out.String())
		}
	}
}

// prometheusOperatorVersion is the prometheus-operator release whose CRDs the chart's
// PrometheusRule and PodMonitor are checked against (its Go module carries them).
const prometheusOperatorVersion = "v0.85.0"

// prometheusOperatorCRDs are the PrometheusRule and PodMonitor CRDs of
// prometheusOperatorVersion, read from its module (downloaded through the Go module proxy).
func prometheusOperatorCRDs(t *testing.T) []manifest {
	t.Helper()
	const module = "github.com/prometheus-operator/prometheus-operator"
	out, err := exec.Command("go", "mod", "download", "-json", module+"@"+prometheusOperatorVersion).Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v", module, prometheusOperatorVersion, err)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Dir == "" {
		t.Fatalf("go mod download %s@%s: %v %s", module, prometheusOperatorVersion, err, dl.Error)
	}
	var crds []manifest
	for _, kind := range []string{"prometheusrules", "podmonitors"} {
		file := filepath.Join(dl.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+kind+".yaml")
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		crds = append(crds, manifest{source: file, raw: raw, obj: u})
	}
	return crds
}

func freePort(t *testing.T) string {
	t.Helper()
	return strconv.Itoa(testutil.MustFreePort(t))
}

func getOK(url string) error {
	_, err := getBody(url)
	return err
}

// getBody is the body of a 200 answer; any other answer is an error.
func getBody(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return string(body), nil
}

func getJSON(url string, into any) error {
	body, err := getBody(url)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(body), into)
}
