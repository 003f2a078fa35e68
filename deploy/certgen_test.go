package deploy

import (
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// The flags of `xds-server certgen` (cmd/xds-server/certgen.go certgenFlags) the chart may use;
// TestCertgenChartOnRealAPIServer runs the binary with the rendered arguments, so a flag that
// does not exist fails there too.
var certgenFlags = []string{"kubeconfig", "namespace", "ca-secret", "secret", "labels", "dns-names", "ca-lifetime", "cert-lifetime", "propagation-delay"}

// The Secrets certgen keeps for release kmvp.
var certgenSecrets = []string{fullname + "-ca", fullname + "-xds-server-tls", fullname + "-envoy-tls", fullname + "-extproc-tls"}

// certgenObjects are the rendered certgen objects, checked for what both the Job and the
// CronJob must satisfy.
type certgenObjects struct {
	job      *batchv1.Job
	cron     *batchv1.CronJob
	jobPod   *corev1.PodSpec
	cronPod  *corev1.PodSpec
	jobArgs  map[string]string
	cronArgs map[string]string
}

func certgenRendered(t *testing.T, r *rendered) certgenObjects {
	t.Helper()
	var o certgenObjects
	o.job = r.mustFind(t, "Job", fullname+"-certgen").typed.(*batchv1.Job)
	o.cron = r.mustFind(t, "CronJob", fullname+"-certgen").typed.(*batchv1.CronJob)
	o.jobPod, o.cronPod = &o.job.Spec.Template.Spec, &o.cron.Spec.JobTemplate.Spec.Template.Spec
	for _, p := range []struct {
		spec *corev1.PodSpec
		into *map[string]string
	}{{o.jobPod, &o.jobArgs}, {o.cronPod, &o.cronArgs}} {
		c := container(t, p.spec, "certgen")
		if len(c.Args) == 0 || c.Args[0] != "certgen" {
			t.Fatalf("certgen args %v do not start with certgen", c.Args)
		}
		*p.into = flags(t, c.Args[1:])
		for name := range *p.into {
			if !slices.Contains(certgenFlags, name) {
				t.Errorf("xds-server certgen has no flag --%s", name)
			}
		}
	}
	return o
}

// TestCertgenRender checks what the chart renders for certgen: the hook Job and its hook RBAC
// (weights below the Job's, deleted after success), the CronJob and its ordinary RBAC, both
// running the xds-server image with the same certgen arguments naming the four Secrets, the
// Envoy role of the mode, every name of xds-server's Service, the lifetimes, and the pod
// security of the other workloads; and rules granting only create, get and update on Secrets.
func TestCertgenRender(t *testing.T) {
	const ns = "kube-mvp"
	for _, c := range []struct {
		name   string
		values map[string]any
		check  func(t *testing.T, r *rendered, o certgenObjects)
	}{
		{
			name:   "default",
			values: map[string]any{},
			check: func(t *testing.T, r *rendered, o certgenObjects) {
				want := map[string]string{
					"namespace":         ns,
					"ca-secret":         fullname + "-ca",
					"secret":            "xds-server=" + fullname + "-xds-server-tls,envoy-front=" + fullname + "-envoy-tls,extproc=" + fullname + "-extproc-tls",
					"dns-names":         strings.Join([]string{fullname + "-xds-server", fullname + "-xds-server." + ns, fullname + "-xds-server." + ns + ".svc", fullname + "-xds-server." + ns + ".svc.cluster.local"}, ","),
					"ca-lifetime":       "3650d",
					"cert-lifetime":     "365d",
					"propagation-delay": "24h",
					"labels":            "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/name=kube-mvp",
				}
				if !maps.Equal(o.jobArgs, want) {
					t.Errorf("Job args %v\nwant %v", o.jobArgs, want)
				}
				if o.cron.Spec.Schedule != "17 3 * * *" || o.cron.Spec.TimeZone != nil {
					t.Errorf("schedule %q time zone %v, want daily", o.cron.Spec.Schedule, o.cron.Spec.TimeZone)
				}
				if o.cron.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
					t.Errorf("concurrency %s: two runs at once only conflict", o.cron.Spec.ConcurrencyPolicy)
				}
				c := container(t, o.jobPod, "certgen")
				if c.Image != "ghcr.io/kube-mvp/xds-server:0.1.0" {
					t.Errorf("image %s", c.Image)
				}
			},
		},
		{
			name:   "sidecar",
			values: map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}},
			check: func(t *testing.T, r *rendered, o certgenObjects) {
				if !strings.Contains(o.jobArgs["secret"], ",envoy-sidecar="+fullname+"-envoy-tls,") {
					t.Errorf("--secret=%s: sidecar mode keeps the envoy-sidecar role", o.jobArgs["secret"])
				}
			},
		},
		{
			name: "tuned",
			values: map[string]any{
				"clusterDomain":    "k8s.example",
				"fullnameOverride": fullname,
				"commonLabels":     map[string]any{"team": "cp"},
				"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
				"image":            map[string]any{"xdsServer": map[string]any{"repository": "registry.example/xds-server", "tag": "v9", "pullPolicy": "Always"}},
				"certgen": map[string]any{"schedule": "0 */6 * * *", "timeZone": "Europe/Berlin", "caLifetime": "730d", "certLifetime": "2160h",
					"propagationDelay": "2h", "activeDeadlineSeconds": 120, "nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
					"resources": map[string]any{"requests": map[string]any{"cpu": "20m", "memory": "48Mi"}}},
			},
			check: func(t *testing.T, r *rendered, o certgenObjects) {
				if o.cron.Spec.Schedule != "0 */6 * * *" || o.cron.Spec.TimeZone == nil || *o.cron.Spec.TimeZone != "Europe/Berlin" {
					t.Errorf("schedule %q time zone %v", o.cron.Spec.Schedule, o.cron.Spec.TimeZone)
				}
				for k, v := range map[string]string{"ca-lifetime": "730d", "cert-lifetime": "2160h", "propagation-delay": "2h",
					"labels": "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/name=kube-mvp,team=cp"} {
					if o.jobArgs[k] != v {
						t.Errorf("--%s=%q, want %q", k, o.jobArgs[k], v)
					}
				}
				if !strings.HasSuffix(o.jobArgs["dns-names"], ".svc.k8s.example") {
					t.Errorf("--dns-names=%s, want the cluster domain's name last", o.jobArgs["dns-names"])
				}
				c := container(t, o.cronPod, "certgen")
				if c.Image != "registry.example/xds-server:v9" || c.ImagePullPolicy != corev1.PullAlways || c.Resources.Requests.Memory().String() != "48Mi" {
					t.Errorf("image %s %s resources %v", c.Image, c.ImagePullPolicy, c.Resources)
				}
				if o.cronPod.NodeSelector["kubernetes.io/os"] != "linux" || o.jobPod.ImagePullSecrets[0].Name != "regcred" {
					t.Errorf("pod %+v", o.cronPod)
				}
				if *o.job.Spec.ActiveDeadlineSeconds != 120 {
					t.Errorf("activeDeadlineSeconds %d", *o.job.Spec.ActiveDeadlineSeconds)
				}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := render(c.values, ns)
			if err != nil {
				t.Fatal(err)
			}
			if *dump {
				for _, o := range r.objs {
					if strings.HasSuffix(o.source, "certgen.yaml") {
						t.Logf("# %s\n%s", o.source, o.raw)
					}
				}
			}
			o := certgenRendered(t, r)
			checkCertgenCommon(t, r, o, ns)
			c.check(t, r, o)
		})
	}
}

// checkCertgenCommon checks what every rendering with certgen on must satisfy.
func checkCertgenCommon(t *testing.T, r *rendered, o certgenObjects, ns string) {
	t.Helper()
	// Job and CronJob: one command, one pod shape, different identities.
	if !maps.Equal(o.jobArgs, o.cronArgs) {
		t.Errorf("Job and CronJob differ:\n%v\n%v", o.jobArgs, o.cronArgs)
	}
	if o.jobPod.ServiceAccountName != fullname+"-certgen-hook" || o.cronPod.ServiceAccountName != fullname+"-certgen" {
		t.Errorf("service accounts: Job %s, CronJob %s", o.jobPod.ServiceAccountName, o.cronPod.ServiceAccountName)
	}
	for what, spec := range map[string]*corev1.PodSpec{"Job": o.jobPod, "CronJob": o.cronPod} {
		if spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("%s restartPolicy %s", what, spec.RestartPolicy)
		}
		if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
			t.Errorf("%s gets no API token", what)
		}
		c := container(t, spec, "certgen")
		// The pod security of the other workloads (values podSecurityContext, securityContext).
		xs := podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server"))
		if !reflect.DeepEqual(spec.SecurityContext, xs.SecurityContext) || !reflect.DeepEqual(c.SecurityContext, container(t, xs, "xds-server").SecurityContext) {
			t.Errorf("%s security context %+v / %+v differs from xds-server's", what, spec.SecurityContext, c.SecurityContext)
		}
		if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: security context %v", what, sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %v", what, c.Resources)
		}
		if xc := container(t, podSpec(t, r.mustFind(t, "Deployment", fullname+"-xds-server")), "xds-server"); c.Image != xc.Image {
			t.Errorf("%s image %s, xds-server's %s", what, c.Image, xc.Image)
		}
	}
	if !strings.HasSuffix(o.jobArgs["dns-names"], ","+fullname+"-xds-server."+ns+".svc."+clusterDomain(r)) {
		t.Errorf("--dns-names=%s does not end with the name Envoy and extproc dial", o.jobArgs["dns-names"])
	}

	// Hooks: the Job after its RBAC, all deleted once it succeeded; the CronJob and its RBAC
	// are release objects.
	hookWeight := func(kind, name string) (int, bool) {
		m := r.mustFind(t, kind, name)
		a := m.obj.GetAnnotations()
		if a["helm.sh/hook"] == "" {
			return 0, false
		}
		if a["helm.sh/hook"] != "pre-install,pre-upgrade" || a["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
			t.Errorf("%s %s hook annotations %v", kind, name, a)
		}
		var w int
		if _, err := fmt.Sscan(a["helm.sh/hook-weight"], &w); err != nil {
			t.Errorf("%s %s hook weight %q", kind, name, a["helm.sh/hook-weight"])
		}
		return w, true
	}
	jobWeight, ok := hookWeight("Job", fullname+"-certgen")
	if !ok {
		t.Error("the certgen Job is not a hook")
	}
	for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
		if w, ok := hookWeight(kind, fullname+"-certgen-hook"); !ok || w >= jobWeight {
			t.Errorf("%s %s-certgen-hook: hook %v weight %d, want a hook before the Job (%d)", kind, fullname, ok, w, jobWeight)
		}
		if _, ok := hookWeight(kind, fullname+"-certgen"); ok {
			t.Errorf("%s %s-certgen (the CronJob's) is a hook", kind, fullname)
		}
	}
	if _, ok := hookWeight("CronJob", fullname+"-certgen"); ok {
		t.Error("the CronJob is a hook: it would be deleted after install")
	}

	// RBAC: create on Secrets, get and update on the four named ones, nothing else.
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: certgenSecrets, Verbs: []string{"get", "update"}},
	}
	for _, name := range []string{fullname + "-certgen", fullname + "-certgen-hook"} {
		role := r.mustFind(t, "Role", name).typed.(*rbacv1.Role)
		if !reflect.DeepEqual(role.Rules, wantRules) {
			t.Errorf("Role %s rules %+v\nwant %+v", name, role.Rules, wantRules)
		}
		rb := r.mustFind(t, "RoleBinding", name).typed.(*rbacv1.RoleBinding)
		if rb.RoleRef.Name != name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != name || rb.Subjects[0].Namespace != ns {
			t.Errorf("RoleBinding %s: %+v %+v", name, rb.RoleRef, rb.Subjects)
		}
	}
	// The Secret names in --secret and --ca-secret are exactly the Role's.
	var named []string
	named = append(named, o.jobArgs["ca-secret"])
	for _, pair := range strings.Split(o.jobArgs["secret"], ",") {
		_, name, _ := strings.Cut(pair, "=")
		named = append(named, name)
	}
	if !slices.Equal(named, certgenSecrets) {
		t.Errorf("certgen keeps %v, the Role names %v", named, certgenSecrets)
	}
}

func clusterDomain(r *rendered) string {
	cm := r.find("ConfigMap", fullname+"-envoy")
	if cm != nil && strings.Contains(string(cm.raw), ".svc.k8s.example") {
		return "k8s.example"
	}
	return "cluster.local"
}

// TestCertgenRenderOff: certgen off renders none of its objects; with rbac.create=false its
// Roles are left to the user (the ServiceAccounts stay); existingSecrets require certgen off;
// the schema turns away malformed certgen values.
func TestCertgenRenderOff(t *testing.T) {
	r, err := render(map[string]any{"certgen": map[string]any{"enabled": false, "existingSecrets": map[string]any{"xdsServer": "mine", "envoy": "mine-envoy", "extproc": "mine-extproc"}}}, "kube-mvp")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.objs {
		if strings.HasSuffix(o.source, "certgen.yaml") {
			t.Errorf("certgen off renders %s %s", o.obj.GetKind(), o.obj.GetName())
		}
	}

	r, err = render(map[string]any{"rbac": map[string]any{"create": false}}, "kube-mvp")
	if err != nil {
		t.Fatal(err)
	}
	if r.find("Role", fullname+"-certgen") != nil || r.find("Role", fullname+"-certgen-hook") != nil || r.find("RoleBinding", fullname+"-certgen") != nil {
		t.Error("certgen Roles rendered with rbac.create=false")
	}
	if r.find("ServiceAccount", fullname+"-certgen") == nil || r.find("ServiceAccount", fullname+"-certgen-hook") == nil || r.find("Job", fullname+"-certgen") == nil {
		t.Error("rbac.create=false dropped more than the Roles")
	}

	for _, c := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"certgen": map[string]any{"existingSecrets": map[string]any{"extproc": "mine"}}}, "set certgen.enabled=false"},
		{map[string]any{"certgen": map[string]any{"caLifetime": "ten years"}}, "caLifetime"},
		{map[string]any{"certgen": map[string]any{"propagationDelay": "-1h"}}, "propagationDelay"},
		{map[string]any{"certgen": map[string]any{"schedule": 5}}, "schedule"},
		{map[string]any{"certgen": map[string]any{"existingSecrets": map[string]any{"ca": "mine"}}}, "ca"},
		{map[string]any{"certgen": map[string]any{"enable": true}}, "enable"},
	} {
		_, err := render(c.vals, "kube-mvp")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %v: error %v, want one naming %q", c.vals, err, c.want)
		}
	}
}

// TestCertgenChartOnRealAPIServer installs the chart's certgen ServiceAccounts and RBAC on a
// real kube-apiserver, checks by SubjectAccessReview that each ServiceAccount may do exactly
// get/update on the four Secrets and create on Secrets in the release namespace and nothing
// else, then runs the xds-server binary with exactly the Job's arguments under the hook
// ServiceAccount's token (the Secrets are made) and the CronJob's under its own (nothing
// changes; after the annotation kube-mvp.io/renew, the annotated Secret's certificates are
// renewed and the annotation removed).
func TestCertgenChartOnRealAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 15*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: []controlplane.ServerSpec{{Name: "cp-a", Version: "v1.37.1"}}})
	srv := cp.Server("cp-a")
	client, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kube-mvp"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := render(map[string]any{}, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.objs {
		if !strings.HasSuffix(m.source, "certgen.yaml") {
			continue
		}
		var err error
		switch o := m.typed.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(ns).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("%s %s: %v", m.obj.GetKind(), m.obj.GetName(), err)
		}
	}
	o := certgenRendered(t, r)

	type access struct{ verb, resource, namespace, name string }
	var allowed, denied []access
	for _, s := range certgenSecrets {
		allowed = append(allowed, access{"get", "secrets", ns, s}, access{"update", "secrets", ns, s})
		denied = append(denied, access{"delete", "secrets", ns, s}, access{"patch", "secrets", ns, s}, access{"get", "secrets", "default", s})
	}
	allowed = append(allowed, access{verb: "create", resource: "secrets", namespace: ns})
	denied = append(denied,
		access{verb: "get", resource: "secrets", namespace: ns, name: fullname + "-certificates"},
		access{verb: "get", resource: "secrets", namespace: ns, name: "some-other-secret"},
		access{verb: "update", resource: "secrets", namespace: ns, name: "some-other-secret"},
		access{verb: "get", resource: "secrets", namespace: ns}, // any name
		access{verb: "list", resource: "secrets", namespace: ns},
		access{verb: "watch", resource: "secrets", namespace: ns},
		access{verb: "deletecollection", resource: "secrets", namespace: ns},
		access{verb: "create", resource: "secrets", namespace: "default"},
		access{verb: "create", resource: "secrets", namespace: "kube-system"},
		access{verb: "list", resource: "secrets"},
		access{verb: "get", resource: "configmaps", namespace: ns},
		access{verb: "create", resource: "pods", namespace: ns},
		access{verb: "list", resource: "serviceaccounts", namespace: ns},
	)
	review := func(user string, a access) (bool, error) {
		spec := authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Resource: a.resource, Namespace: a.namespace, Name: a.name},
		}
		res, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	}
	for _, sa := range []string{fullname + "-certgen-hook", fullname + "-certgen"} {
		user := "system:serviceaccount:" + ns + ":" + sa
		testutil.WaitFor(t, ctx, 90*time.Second, "the RBAC of "+sa+" to take effect", func() error {
			if ok, err := review(user, allowed[0]); err != nil || !ok {
				return fmt.Errorf("%+v denied (%v)", allowed[0], err)
			}
			return nil
		})
		for _, a := range allowed {
			if ok, err := review(user, a); err != nil || !ok {
				t.Errorf("%s: %+v denied (%v), want allowed", sa, a, err)
			}
		}
		for _, a := range denied {
			if ok, err := review(user, a); err != nil || ok {
				t.Errorf("%s: %+v allowed (%v), want denied", sa, a, err)
			}
		}
	}
	// xds-server's own ServiceAccount reads no Secret.
	for _, s := range certgenSecrets {
		if ok, err := review("system:serviceaccount:"+ns+":"+fullname+"-xds-server", access{"get", "secrets", ns, s}); err != nil || ok {
			t.Errorf("xds-server may read Secret %s (%v)", s, err)
		}
	}

	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "./cmd/xds-server")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(sa string, pod *corev1.PodSpec) string {
		t.Helper()
		tok, err := srv.ServiceAccountToken(ctx, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := srv.WriteTokenKubeconfig(kubeconfig, tok, ""); err != nil {
			t.Fatal(err)
		}
		args := append(slices.Clone(container(t, pod, "certgen").Args), "--kubeconfig="+kubeconfig)
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "xds-server"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("xds-server %s as %s: %v\n%s", strings.Join(args, " "), sa, err, out)
		}
		return string(out)
	}
	out := run(fullname+"-certgen-hook", o.jobPod)
	if !strings.Contains(out, "4 created, 0 updated, 0 unchanged") {
		t.Errorf("the Job's run:\n%s", out)
	}
	if strings.Contains(out, "PRIVATE KEY") {
		t.Error("the Job's output shows a private key")
	}
	for _, name := range certgenSecrets {
		s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels["app.kubernetes.io/instance"] != release || s.Labels["app.kubernetes.io/managed-by"] != "kube-mvp-certgen" {
			t.Errorf("Secret %s labels %v", name, s.Labels)
		}
	}
	out = run(fullname+"-certgen", o.cronPod)
	if !strings.Contains(out, "0 created, 0 updated, 4 unchanged") {
		t.Errorf("the CronJob's run:\n%s", out)
	}
	// A renewal forced as docs/operating.md says (annotate, then a Job from the CronJob): the
	// CronJob's identity may carry it out with the rules above.
	for _, annotated := range []string{fullname + "-envoy-tls", fullname + "-ca"} {
		patch := []byte(`{"metadata":{"annotations":{"kube-mvp.io/renew":"now"}}}`)
		if _, err := client.CoreV1().Secrets(ns).Patch(ctx, annotated, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		want := "0 created, 1 updated, 3 unchanged"
		if annotated == fullname+"-ca" {
			want = "0 created, 4 updated, 0 unchanged"
		}
		if out := run(fullname+"-certgen", o.cronPod); !strings.Contains(out, want) || !strings.Contains(out, "renewal requested") {
			t.Errorf("the CronJob's run after annotating %s, want %q:\n%s", annotated, want, out)
		}
		for _, name := range certgenSecrets {
			s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := s.Annotations["kube-mvp.io/renew"]; ok {
				t.Errorf("after annotating %s: %s still carries kube-mvp.io/renew", annotated, name)
			}
		}
	}
	// The Secrets are what the workloads can mount: a kubernetes.io/tls Secret with ca.crt.
	s, err := client.CoreV1().Secrets(ns).Get(ctx, fullname+"-envoy-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != corev1.SecretTypeTLS || len(s.Data["ca.crt"]) == 0 {
		t.Errorf("envoy Secret type %s keys %v", s.Type, slices.Collect(maps.Keys(s.Data)))
	}
}
