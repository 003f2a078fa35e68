//go:build node

package node_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/node"
)

// The release's certgen objects (templates/certgen.yaml).
const (
	caSecret     = node.Release + "-ca"
	certgenName  = node.Release + "-certgen"
	xdsPort      = 18000 // xdsServer.port
	xdsAdminPort = 9100  // xdsServer.adminPort
	extprocAdmin = 9002  // extproc.adminPort
)

var roleSecrets = map[string]string{
	"xds-server": node.Release + "-xds-server-tls",
	"envoy":      node.Release + "-envoy-tls",
	"extproc":    node.Release + "-extproc-tls",
}

// checkRenewal forces a certgen renewal as docs/operating.md says (the CA Secret annotated
// kube-mvp.io/renew, a Job from the CronJob) under continuous requests through kube-mvp, and
// checks that every component uses its new certificate, picked up through the kubelet's
// Secret-volume update: xds-server serves its new one; extproc's next connection presents its
// new one (its metric re-reads the files); Envoy presents its new one when it connects again,
// which the test makes happen by a rollout restart of xds-server (its ADS stream would
// otherwise keep its handshake). No Envoy or extproc restarts and no request fails.
func (in *installation) checkRenewal(t *testing.T, ctx context.Context) {
	t.Helper()
	envoyPods := in.podRestarts(t, ctx, "envoy")
	load := in.startLoad(t, ctx)
	old := in.roleCerts(t, ctx)

	patch := []byte(`{"metadata":{"annotations":{"kube-mvp.io/renew":"now"}}}`)
	if _, err := in.admin.CoreV1().Secrets(node.Namespace).Patch(ctx, caSecret, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	in.runCronJobNow(t, ctx, "renew-now")

	renewed := in.roleCerts(t, ctx)
	for role, c := range renewed {
		if c.SerialNumber.Cmp(old[role].SerialNumber) == 0 {
			t.Fatalf("%s: certificate not renewed (serial %x)", role, c.SerialNumber)
		}
	}
	ca, err := in.admin.CoreV1().Secrets(node.Namespace).Get(ctx, caSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ca.Annotations["kube-mvp.io/renew"]; ok {
		t.Errorf("the CA Secret still asks for a renewal")
	}

	// xds-server serves its renewed certificate: the kubelet updated its Secret volume.
	xdsPods := in.pods(t, ctx, "xds-server")
	extprocCert, extprocKeyAndCA := in.secretPair(t, ctx, roleSecrets["extproc"])
	testutil.WaitFor(t, ctx, 3*time.Minute, "every xds-server serving its renewed certificate", func() error {
		for _, p := range xdsPods {
			c, err := servedCert(net.JoinHostPort(p.Status.PodIP, strconv.Itoa(xdsPort)), extprocCert, extprocKeyAndCA)
			if err != nil {
				return fmt.Errorf("%s: %w", p.Name, err)
			}
			if c.SerialNumber.Cmp(renewed["xds-server"].SerialNumber) != 0 {
				return fmt.Errorf("%s serves serial %x, want %x", p.Name, c.SerialNumber, renewed["xds-server"].SerialNumber)
			}
		}
		return nil
	})
	// extproc would present its renewed certificate on its next connection.
	want := fmt.Sprintf("kube_mvp_certificate_expiry_timestamp_seconds{certificate=\"control-plane\",role=\"extproc\"} %s\n",
		strconv.FormatFloat(float64(renewed["extproc"].NotAfter.Unix()), 'g', -1, 64))
	testutil.WaitFor(t, ctx, 3*time.Minute, "every extproc holding its renewed certificate", func() error {
		for _, p := range in.pods(t, ctx, "envoy") {
			body, err := httpGet(fmt.Sprintf("http://%s/metrics", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(extprocAdmin))))
			if err != nil {
				return err
			}
			if !strings.Contains(body, want) {
				return fmt.Errorf("%s: extproc's metrics lack %q", p.Name, strings.TrimSpace(want))
			}
		}
		return nil
	})
	// Envoy presents its renewed certificate once it connects again.
	in.rolloutRestart(t, ctx, node.Release+"-xds-server")
	wantSerial := hex.EncodeToString(renewed["envoy"].SerialNumber.Bytes())
	testutil.WaitFor(t, ctx, 3*time.Minute, "every Envoy connected with its renewed certificate", func() error {
		for _, p := range in.pods(t, ctx, "xds-server") {
			body, err := httpGet(fmt.Sprintf("http://%s/debug/syncz", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(xdsAdminPort))))
			if err != nil {
				return err
			}
			var nodes []struct {
				NodeID      string `json:"nodeID"`
				Certificate struct {
					Serial string `json:"serial"`
				} `json:"certificate"`
			}
			if err := json.Unmarshal([]byte(body), &nodes); err != nil {
				return err
			}
			for _, n := range nodes {
				if n.Certificate.Serial != wantSerial {
					return fmt.Errorf("%s: Envoy %s connected with serial %s, want %s", p.Name, n.NodeID, n.Certificate.Serial, wantSerial)
				}
			}
		}
		return nil
	})

	ok, failed, errs := load()
	if failed > 0 || ok < 50 {
		t.Errorf("requests through kube-mvp during the renewal: %d ok, %d failed: %v", ok, failed, errs)
	} else {
		t.Logf("renewal: %d requests through kube-mvp, none failed", ok)
	}
	for uid, restarts := range in.podRestarts(t, ctx, "envoy") {
		if before, ok := envoyPods[uid]; !ok || before != restarts {
			t.Errorf("an Envoy pod was replaced or restarted during the renewal (%s: %d restarts, before %d)", uid, restarts, before)
		}
	}
}

// startLoad lists Jobs (only cp-a serves batch/v1) and ConfigMaps through kube-mvp until
// stopped; stop reports how many succeeded and failed, and the first errors.
func (in *installation) startLoad(t *testing.T, ctx context.Context) (stop func() (ok, failed int, errs []string)) {
	client := in.client(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: in.node.CP.PKI.Admin.CertPEM, KeyData: in.node.CP.PKI.Admin.KeyPEM}}, true)
	ctx, cancel := context.WithCancel(ctx)
	var okN, failN atomic.Int64
	var mu sync.Mutex
	var errs []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			var err error
			if i%2 == 0 {
				_, err = client.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
			} else {
				_, err = client.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
			}
			switch {
			case ctx.Err() != nil:
			case err != nil:
				failN.Add(1)
				mu.Lock()
				if len(errs) < 5 {
					errs = append(errs, err.Error())
				}
				mu.Unlock()
			default:
				okN.Add(1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() (int, int, []string) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return int(okN.Load()), int(failN.Load()), errs
	}
}

// runCronJobNow runs the certgen CronJob's Job now, as `kubectl create job --from=cronjob/`
// does, and waits for it to succeed.
func (in *installation) runCronJobNow(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	cj, err := in.admin.BatchV1().CronJobs(node.Namespace).Get(ctx, certgenName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: node.Namespace,
			Labels:          cj.Spec.JobTemplate.Labels,
			Annotations:     map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: cj.Spec.JobTemplate.Spec,
	}
	if _, err := in.admin.BatchV1().Jobs(node.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ctx, 3*time.Minute, "the certgen Job "+name+" to succeed", func() error {
		j, err := in.admin.BatchV1().Jobs(node.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				t.Fatalf("the certgen Job failed: %s\n%s", c.Message, in.node.PodReport(ctx, node.Namespace))
			}
		}
		if j.Status.Succeeded < 1 {
			return fmt.Errorf("%d succeeded, %d active, %d failed", j.Status.Succeeded, j.Status.Active, j.Status.Failed)
		}
		return nil
	})
}

// rolloutRestart is `kubectl rollout restart deployment/name`, then waits for the rollout.
func (in *installation) rolloutRestart(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := in.admin.AppsV1().Deployments(node.Namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ctx, 3*time.Minute, "the rollout of "+name, func() error {
		d, err := in.admin.AppsV1().Deployments(node.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != *d.Spec.Replicas || d.Status.ReadyReplicas != *d.Spec.Replicas || d.Status.Replicas != *d.Spec.Replicas {
			return fmt.Errorf("%d updated, %d ready, %d in all, want %d", d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.Replicas, *d.Spec.Replicas)
		}
		return nil
	})
}

// roleCerts are the certificates in the role Secrets.
func (in *installation) roleCerts(t *testing.T, ctx context.Context) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for role, name := range roleSecrets {
		crt, _ := in.secretPair(t, ctx, name)
		out[role] = parseCert(t, crt)
	}
	return out
}

// secretPair is a kubernetes.io/tls Secret's certificate and key, with its ca.crt appended
// to the certificate's PEM as the trust for servedCert.
func (in *installation) secretPair(t *testing.T, ctx context.Context, name string) (crt, key []byte) {
	t.Helper()
	s, err := in.admin.CoreV1().Secrets(node.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data["tls.crt"], bytes.Join([][]byte{s.Data["tls.key"], s.Data["ca.crt"]}, nil)
}

// servedCert completes a TLS handshake with the server at addr, presenting pair (the
// extproc role's certificate and key, the key's PEM followed by the CA bundle), and returns
// the certificate it served, verified against that bundle.
func servedCert(addr string, crt, keyAndCA []byte) (*x509.Certificate, error) {
	pair, err := tls.X509KeyPair(crt, keyAndCA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(keyAndCA)
	var served *x509.Certificate
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"},
		// xds-server's certificate names its Service, not the pod's address; the chain is
		// checked here instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("no certificate served")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter}); err != nil {
				return err
			}
			served = cs.PeerCertificates[0]
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	conn.Close()
	return served, nil
}

// pods are the release's running pods of one component.
func (in *installation) pods(t *testing.T, ctx context.Context, component string) []corev1.Pod {
	t.Helper()
	list, err := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// podRestarts are the restarts of every container of a component's pods, by pod UID.
func (in *installation) podRestarts(t *testing.T, ctx context.Context, component string) map[types.UID]int32 {
	t.Helper()
	out := map[types.UID]int32{}
	for _, p := range in.pods(t, ctx, component) {
		var n int32
		for _, c := range p.Status.ContainerStatuses {
			n += c.RestartCount
		}
		out[p.UID] = n
	}
	return out
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
