package inventory_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestThrottledDiscoveryFromARealAPIServer: a real apiserver whose priority and fairness
// rejects xds-server's discovery (429 with Retry-After: a priority level with no seats, its
// one request held executing) fails the fetch, with no discovery at all, so the apiserver's
// previous copy stays in use; once the level is free, the same user's fetch is aggregated
// discovery again. (That a 429 never leads to legacy discovery is
// TestLegacyFallbackOnlyWithoutAggregatedDiscovery: a real apiserver rejects the legacy
// requests too while its level is full.)
func TestThrottledDiscoveryFromARealAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: []controlplane.ServerSpec{{Name: "cp-a", Version: "v1.37.1"}}})
	server := cp.Server("cp-a")
	admin, err := server.Client()
	if err != nil {
		t.Fatal(err)
	}
	const user = "kube-mvp-throttled"
	level := &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "no-seats"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: ptr.To[int32](0),
				LendablePercent: ptr.To[int32](0), BorrowingLimitPercent: ptr.To[int32](0),
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}}
	created, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, level, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schema := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "throttle-" + user},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level.Name},
			MatchingPrecedence: 50,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:         []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: user}}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
			}}}}
	if _, err := admin.FlowcontrolV1().FlowSchemas().Create(ctx, schema, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kp, err := cp.PKI.ClientCert(user)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: server.URL(), TLSClientConfig: rest.TLSClientConfig{CAData: cp.PKI.ServerCA.CertPEM, CertData: kp.CertPEM, KeyData: kp.KeyPEM}}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// HTTP/2 with the smallest receive window, and the body never read: the apiserver's
	// handler blocks writing, its request executing at the level until it times out.
	hog := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, DisableCompression: true,
		HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10}}}
	get := func(path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server.URL()+path, nil)
		return hog.Do(req)
	}
	// The apiserver applies a new flow schema a moment after it is created: wait until the
	// user's requests are classified into the level, then hold the level's one request.
	testutil.WaitFor(t, ctx, time.Minute, user+"'s requests in priority level "+level.Name, func() error {
		res, err := get("/version")
		if err != nil {
			return err
		}
		res.Body.Close()
		if got := res.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"); got != string(created.UID) {
			return fmt.Errorf("priority level %q", got)
		}
		return nil
	})
	held, err := get("/openapi/v2") // 2.4 MB
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	throttled, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := throttled.Discovery().RESTClient().Get().AbsPath("/apis").Do(ctx).Error(); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("GET /apis as %s while its level's request is held: %v; want 429 (the premise)", user, err)
	}

	fetch := func() (*apidiscoveryv2.APIGroupDiscoveryList, error) {
		list, _, err := inventory.FetchDiscovery(ctx, cfg, server.Address(), inventory.FetchOptions{ServerName: controlplane.UpstreamServerName})
		return list, err
	}
	// client-go retries a 429 with Retry-After until the fetch's 10 s timeout; then the fetch
	// fails, and the apiserver's previous discovery stays in use.
	start := time.Now()
	if list, err := fetch(); err == nil || list != nil {
		t.Fatalf("fetch as %s while rejected: %v; want a failed fetch and no discovery (legacy or other)", user, err)
	} else {
		t.Logf("fetch while rejected failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	held.Body.Close() // the level's request ends: the user's requests are served again
	testutil.WaitFor(t, ctx, 2*time.Minute, "the fetch as "+user+" once nothing holds its level", func() error {
		list, err := fetch()
		if err != nil {
			return err
		}
		// Aggregated discovery, not legacy: it names each resource's kind and scope.
		for _, g := range list.Items {
			if g.Name == "apps" && len(g.Versions) > 0 && len(g.Versions[0].Resources) > 0 && g.Versions[0].Resources[0].ResponseKind != nil {
				return nil
			}
		}
		return fmt.Errorf("%d groups, no apps/v1 with kinds", len(list.Items))
	})
}
