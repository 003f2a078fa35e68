package opstatus

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

func TestSummarize(t *testing.T) {
	since := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	view := &plan.View{
		APIServers: []plan.APIServerView{
			{APIServer: topology.APIServer{ID: "a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}, Source: topology.Source{From: "discovery", Since: since, Version: "v1.37.1"}},
			{APIServer: topology.APIServer{ID: "b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true,
				Verified: true, Dangerous: "takes it for a client"}, Source: topology.Source{From: "discovery",
				Since: since}},
			{APIServer: topology.APIServer{ID: "c", Hostname: "cp-c", Address: "10.0.0.3:6443"},
				Source:      topology.Source{From: "storageVersions", AwaitingDiscovery: true},
				NotRoutable: "its own discovery was never read"},
			{APIServer: topology.APIServer{ID: "d", Hostname: "cp-d", Address: "10.0.0.4:6443"}, Source: topology.Source{From: "remembered", Since: since}},
			{APIServer: topology.APIServer{ID: "e", Hostname: "cp-e"}, Source: topology.Source{From: "none"}},
		},
		GroupVersions: []plan.GroupVersionView{{
			GroupVersion: "batch/v1",
			Document:     plan.ResourceView{Resource: "/apis/batch/v1", Outcome: "subset", ServedBy: []string{"cp-a"}, Cluster: "kube-apiservers-only-cp-a"},
			Resources: []plan.ResourceView{
				{Resource: "jobs", Outcome: "subset", ServedBy: []string{"cp-a"}, Cluster: "kube-apiservers-only-cp-a"},
				{Resource: "cronjobs", Outcome: "unavailable", ServedBy: []string{"cp-d"}},
				{Resource: "widgets", Outcome: "default", ServedBy: []string{"cp-a", "cp-b"}, Cluster: "kube-apiservers"},
			},
		}},
	}
	syncz := []xdsstatus.NodeStatus{
		{NodeID: "ok", Role: "envoy-front", EnvoyVersion: "1.40.0", Streams: 1, Snapshot: "v1",
			Types: map[string]*xdsstatus.TypeStatus{"type.googleapis.com/envoy.config.route.v3.RouteConfiguration": {Sent: "1", Acked: "1"}}},
		{NodeID: "bad", Streams: 1, Snapshot: "v2", Types: map[string]*xdsstatus.TypeStatus{
			"type.googleapis.com/envoy.config.route.v3.RouteConfiguration":       {Sent: "2", Acked: "1", NackError: "bad regex", NackedNext: "2"},
			"type.googleapis.com/envoy.config.cluster.v3.Cluster":                {Sent: "2", Acked: "2"},
			"type.googleapis.com/envoy.config.listener.v3.Listener":              {Sent: "2", Acked: "2"},
			"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment": {Sent: "2", Acked: "1"},
		}},
		{NodeID: "waiting", Streams: 1, Types: map[string]*xdsstatus.TypeStatus{"x.Cluster": {Sent: "3", Acked: "2"}}},
		{NodeID: "gone", Types: map[string]*xdsstatus.TypeStatus{}},
		{NodeID: "old", EnvoyVersion: "1.37.6", EnvoySupport: "Envoy 1.37.6 is past its end of life (2027-01-13)", Streams: 1, Types: map[string]*xdsstatus.TypeStatus{}},
	}
	r := Summarize(&Pages{XDSAdmin: "http://x", Topology: view, Syncz: syncz})

	states := map[string]string{}
	for _, a := range r.APIServers {
		states[a.Hostname] = a.State + " " + a.ProxyCertificate
	}
	for host, want := range map[string]string{"cp-a": "live accepted",
		"cp-b": "live refused: takes it for a client", "cp-c": "unverified accepted", "cp-d": "departed accepted",
		"cp-e": "stale accepted"} {
		if states[host] != want {
			t.Errorf("%s: %q, want %q", host, states[host], want)
		}
	}
	if len(r.PartiallyServed) != 3 || r.PartiallyServed[1].Cluster != "kube-apiservers-serving" ||
		r.PartiallyServed[1].ServingSet != "kube-apiservers-only-cp-a" ||
		r.PartiallyServed[2].Resource != "batch/v1/cronjobs" {
		t.Errorf("partially served: %+v", r.PartiallyServed)
	}
	envoys := map[string]Envoy{}
	for _, e := range r.Envoys {
		envoys[e.Node] = e
	}
	if envoys["ok"].State != "ACK" || envoys["waiting"].State != "pending" || envoys["gone"].State != "disconnected" {
		t.Errorf("envoys: %+v", r.Envoys)
	}
	if b := envoys["bad"]; b.State != "NACK" || len(b.NACKs) != 1 || b.NACKs[0].Type != "RouteConfiguration" || b.NACKs[0].Reason != "bad regex" {
		t.Errorf("NACKing envoy: %+v", b)
	}
	var out bytes.Buffer
	Write(&out, r, since.Add(time.Minute))
	for _, want := range []string{"NACK RouteConfiguration 2: bad regex", "cp-d", "departed", "1m0s ago", "kube-apiservers-only-cp-a", "v1.37.1", "not routable: its own discovery was never read",
		"envoy-front  1.40.0", "unsupported: Envoy 1.37.6 is past its end of life (2027-01-13)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	if len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "Envoy old: Envoy 1.37.6 is past its end of life") {
		t.Errorf("problems with routable apiservers and one Envoy past its end of life: %q", r.Problems)
	}

	// Nothing routable is said once, as a problem, besides each apiserver's reason.
	none := &plan.View{APIServers: []plan.APIServerView{
		{APIServer: topology.APIServer{ID: "c", Hostname: "cp-c"}, Source: topology.Source{From: "storageVersions", AwaitingDiscovery: true}, NotRoutable: "its own discovery was never read"},
	}}
	r = Summarize(&Pages{XDSAdmin: "http://x", Topology: none})
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "no apiserver is routable") || r.APIServers[0].NotRoutable == "" {
		t.Errorf("nothing routable: problems %q, apiservers %+v", r.Problems, r.APIServers)
	}
}

// TestFetchSaysWhatDoesNotAnswer: an admin that is not xds-server's, and an extproc that
// does not answer, are named.
func TestFetchSaysWhatDoesNotAnswer(t *testing.T) {
	notXDS := httptest.NewServer(http.NotFoundHandler())
	defer notXDS.Close()
	if _, err := Fetch(context.Background(), http.DefaultClient, []Target{{Name: notXDS.URL, URL: notXDS.URL}}, nil); err == nil || !strings.Contains(err.Error(), "answered 404") {
		t.Errorf("not xds-server: %v", err)
	}
	xdsAdmin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/debug/topology":
			http.Error(w, "no topology yet", http.StatusServiceUnavailable)
		case "/debug/syncz":
			w.Write([]byte("[]"))
		}
	}))
	defer xdsAdmin.Close()
	p, err := Fetch(context.Background(), http.DefaultClient, []Target{{Name: xdsAdmin.URL, URL: xdsAdmin.URL}}, []Target{{Name: "http://127.0.0.1:1", URL: "http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	r := Summarize(p)
	if len(r.Problems) != 2 || !strings.Contains(r.Problems[0], "no topology yet") || !strings.Contains(r.Problems[1], "extproc's admin at http://127.0.0.1:1 does not answer") || len(r.ExtProcs) != 0 {
		t.Errorf("problems %q, extprocs %+v", r.Problems, r.ExtProcs)
	}
}

// TestEveryReplicasEnvoys: each xds-server replica knows only the Envoys connected to it;
// status lists them all, each with its replica, a node that moved from the one where it has
// open streams; a replica that does not answer is a problem, not the end.
func TestEveryReplicasEnvoys(t *testing.T) {
	replica := func(syncz string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/debug/topology":
				w.Write([]byte(`{"apiServers":[]}`))
			case "/debug/syncz":
				w.Write([]byte(syncz))
			}
		}))
	}
	a := replica(`[{"nodeID":"envoy-1","openStreams":1},{"nodeID":"envoy-3","openStreams":0}]`)
	defer a.Close()
	b := replica(`[{"nodeID":"envoy-2","openStreams":1},{"nodeID":"envoy-3","openStreams":1}]`)
	defer b.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	defer down.Close()
	p, err := Fetch(context.Background(), http.DefaultClient, []Target{{Name: "xds-a", URL: a.URL}, {Name: "xds-b", URL: b.URL}, {Name: "xds-down", URL: down.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := Summarize(p)
	got := map[string]string{}
	for _, e := range r.Envoys {
		got[e.Node] = e.XDSServer + " " + e.State
	}
	want := map[string]string{"envoy-1": "xds-a ACK", "envoy-2": "xds-b ACK", "envoy-3": "xds-b ACK"}
	if len(got) != len(want) || got["envoy-1"] != want["envoy-1"] || got["envoy-2"] != want["envoy-2"] || got["envoy-3"] != want["envoy-3"] {
		t.Errorf("envoys %v, want %v", got, want)
	}
	if len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], "xds-down: ") {
		t.Errorf("problems %q, want the replica that did not answer", r.Problems)
	}
	var text bytes.Buffer
	Write(&text, r, time.Now())
	if !strings.Contains(text.String(), "XDS-SERVER") || !strings.Contains(text.String(), "xds-b") {
		t.Errorf("table lacks the replicas:\n%s", text.String())
	}

	// With one replica, its name is not repeated on every line.
	p, err = Fetch(context.Background(), http.DefaultClient, []Target{{Name: "xds-a", URL: a.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range Summarize(p).Envoys {
		if e.XDSServer != "" {
			t.Errorf("one replica: %+v names it", e)
		}
	}
}
