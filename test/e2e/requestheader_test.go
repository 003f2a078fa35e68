package e2e

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestCustomRequestHeaderNames: an apiserver that reads identity from other headers than
// X-Remote-* (--requestheader-username-headers=X-Login and so on) publishes them in
// kube-system/extension-apiserver-authentication; kube-mvp reads them there, forwards a
// certificate user's name, groups and UID in them, and strips them (and the defaults) from
// every client, so whoever calls — certificate, token, nobody — gets the identity the
// apiserver gives directly, spoofed headers in either naming notwithstanding. The names
// are kept in the memory ConfigMap: an xds-server restarted after an attacker deleted the
// group key (before the apiserver puts it back) still strips the apiserver's group header.
func TestCustomRequestHeaderNames(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1", Args: []string{
		"--requestheader-username-headers=X-Login",
		"--requestheader-group-headers=X-Teams",
		"--requestheader-extra-headers-prefix=X-Attr-",
		// The apiserver insists on the standard UID header among its UID headers.
		"--requestheader-uid-headers=X-Id,X-Remote-Uid",
	}})
	// extproc checks the proxy certificate at once when the header names change, then every
	// proxyCheckInterval; each change below is watched for three of those.
	const proxyCheckInterval = 5 * time.Second
	k := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) {
		o.XDSServerArgs = []string{"--memory-configmap", "default/kube-mvp-memory"}
		o.ExtprocArgs = []string{"--proxy-check-interval", proxyCheckInterval.String()}
	})

	// alice with Kubernetes' UID attribute (1.3.6.1.4.1.57683.2).
	alice, err := e.cp.PKI.ClientCA.Issue(pkix.Name{CommonName: "alice", Organization: []string{"team-a", "team-b"},
		ExtraNames: []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}, Value: "alice-uid"}}},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	carolToken := serviceAccountToken(t, ctx, e.adminClient(e.cp.Server("cp-a")), "carol")

	spoof := http.Header{
		"X-Login": {"system:admin"}, "X-Teams": {"system:masters"}, "X-Id": {"0"}, "X-Attr-Scopes": {"everything"},
		"X-Remote-User": {"system:admin"}, "X-Remote-Group": {"system:masters"},
		"X-Attacker-User": {"system:admin"}, "X-Attacker-Group": {"system:masters"},
	}
	direct := "https://" + e.cp.Server("cp-a").Address()
	sameIdentity := func(t *testing.T) {
		t.Helper()
		for _, c := range []struct {
			cert  *controlplane.KeyPair
			token string
		}{{&alice, ""}, {nil, carolToken}} {
			hc := e.rawClient(c.cert)
			want := selfSubjectReview(t, ctx, hc, direct, c.token, spoof)
			for i := range 3 {
				if got := selfSubjectReview(t, ctx, hc, k.Endpoint(), c.token, spoof); got != want {
					t.Fatalf("request %d through kube-mvp: %s\nwant what the apiserver answers directly: %s", i, got, want)
				}
			}
		}
	}
	defer func() {
		if t.Failed() {
			return
		}
		// Whoever may write kube-system/extension-apiserver-authentication can make it say
		// anything; the apiserver keeps reading its own flags (and does not repair a malformed
		// key, nor an update, until its minute's resync). The identity through kube-mvp stays
		// the one the apiserver gives directly.
		cms := e.adminClient(e.cp.Server("cp-a")).CoreV1().ConfigMaps("kube-system")
		orig, err := cms.Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tamper := func(t *testing.T, change func(map[string]string)) {
			t.Helper()
			cm, err := cms.Get(ctx, orig.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cm.Data = maps.Clone(orig.Data)
			change(cm.Data)
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		malformed := func(want string) func() bool {
			return func() bool { // the sample's line, not the HELP text (which says "... 1 while")
				return strings.Contains(httpGet(t, k.XDSAdmin+"/metrics"), "\nkube_mvp_xds_request_header_config_malformed "+want+"\n")
			}
		}
		for _, c := range []struct {
			name   string
			change func(map[string]string)
			seen   func() bool // xds-server has read the change
		}{
			{"malformed group key", func(d map[string]string) { d["requestheader-group-headers"] = `["X-Teams"` }, malformed("1")},
			{"group key deleted", func(d map[string]string) { delete(d, "requestheader-group-headers") }, malformed("1")},
			{"names prepended", func(d map[string]string) {
				d["requestheader-username-headers"] = `["X-Attacker-User","X-Login"]`
				d["requestheader-group-headers"] = `["X-Attacker-Group","X-Teams"]`
				d["requestheader-extra-headers-prefix"] = `["X-Attacker-Extra-","X-Attr-"]`
			}, func() bool { return strings.Contains(httpGet(t, k.XDSAdmin+"/debug/topology"), `"x-attacker-user"`) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				tamper(t, c.change)
				testutil.WaitFor(t, ctx, 30*time.Second, "xds-server reads the changed ConfigMap", testutil.Cond(c.seen))
				// The route update reaches the data plane within its delay, the routing table
				// reaches extproc, whose proxy certificate check runs at once and then every
				// interval (with the names as Envoy's health checks send them, it must keep
				// finding the apiserver accepts the certificate): keep asking through all of it.
				deadline := time.Now().Add(3 * proxyCheckInterval)
				for time.Now().Before(deadline) {
					sameIdentity(t)
				}
				if m := httpGet(t, k.ExtprocAdmin+"/metrics"); !strings.Contains(m, "\nkube_mvp_extproc_proxy_certificate_accepted{") || !proxyAcceptedEverywhere(m) {
					t.Errorf("extproc's proxy certificate check does not find the apiserver accepts it:\n%s", grepLines(m, "kube_mvp_extproc_proxy_certificate_accepted"))
				}
				tamper(t, func(map[string]string) {})
				testutil.WaitFor(t, ctx, 30*time.Second, "xds-server reads the restored ConfigMap", testutil.Cond(malformed("0")))
			})
		}
		sameIdentity(t)

		// The names are in the memory ConfigMap; the group key is deleted and xds-server
		// restarted before the apiserver puts the key back (its resync is a minute): the
		// restarted xds-server knows X-Teams from the memory and strips it.
		t.Run("group key deleted, then xds-server restarted", func(t *testing.T) {
			configMaps := e.adminClient(e.cp.Server("cp-a")).CoreV1().ConfigMaps("default")
			waitFor(t, ctx, "the request-header names in the memory ConfigMap", func() error {
				cm, err := configMaps.Get(ctx, "kube-mvp-memory", metav1.GetOptions{})
				if err != nil {
					return err
				}
				if v := cm.Data[memory.RequestHeaderNamesKey]; !strings.Contains(v, `"x-teams"`) {
					return fmt.Errorf("%s: %.200q", memory.RequestHeaderNamesKey, v)
				}
				return nil
			})
			tamper(t, func(d map[string]string) { delete(d, "requestheader-group-headers") })
			if err := k.RestartXDSServer(ctx); err != nil {
				t.Fatalf("restarting xds-server: %v\n%s", err, k.Logs())
			}
			// It complains (the last good names kept, from the memory) and publishes X-Teams as
			// the group header; a restart that forgot would publish X-Remote-Group, without
			// complaint.
			testutil.WaitFor(t, ctx, 30*time.Second, "the restarted xds-server reads the ConfigMap without its group key", testutil.Cond(malformed("1")))
			var topo struct {
				RequestHeaders struct {
					Group []string `json:"group"`
				} `json:"requestHeaders"`
			}
			if err := json.Unmarshal([]byte(httpGet(t, k.XDSAdmin+"/debug/topology")), &topo); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(topo.RequestHeaders.Group, []string{"x-teams"}) {
				t.Errorf("the restarted xds-server publishes the group headers %q, want [x-teams] (the last good, from the memory ConfigMap)", topo.RequestHeaders.Group)
			}
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				sameIdentity(t)
			}
			if cm, err := cms.Get(ctx, orig.Name, metav1.GetOptions{}); err == nil {
				if _, back := cm.Data["requestheader-group-headers"]; back {
					t.Log("the apiserver put the group key back before the check ended: the check shows less than it should")
				}
			}
			tamper(t, func(map[string]string) {})
			testutil.WaitFor(t, ctx, 30*time.Second, "xds-server reads the restored ConfigMap", testutil.Cond(malformed("0")))
			sameIdentity(t)
		})
	}()
	for _, c := range []struct {
		name     string
		cert     *controlplane.KeyPair
		token    string
		wantUser string
	}{
		{"client certificate with UID", &alice, "", `"username":"alice","uid":"alice-uid","groups":["team-a","team-b","system:authenticated"]`},
		{"bearer token", nil, carolToken, `"username":"system:serviceaccount:default:carol"`},
		{"no credentials", nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			hc := e.rawClient(c.cert)
			want := selfSubjectReview(t, ctx, hc, direct, c.token, spoof)
			if strings.Contains(want, "system:admin") || strings.Contains(want, "system:masters") || !strings.Contains(want, c.wantUser) {
				t.Fatalf("directly, the apiserver answered %s; want it to contain %s", want, c.wantUser)
			}
			for i := range 3 {
				if got := selfSubjectReview(t, ctx, hc, k.Endpoint(), c.token, spoof); got != want {
					t.Fatalf("request %d through kube-mvp: %s\nwant what the apiserver answers directly: %s", i, got, want)
				}
			}
		})
	}
}

// proxyAcceptedEverywhere: every kube_mvp_extproc_proxy_certificate_accepted sample in an
// exposition is 1.
func proxyAcceptedEverywhere(metrics string) bool {
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "kube_mvp_extproc_proxy_certificate_accepted{") && !strings.HasSuffix(l, " 1") {
			return false
		}
	}
	return true
}
