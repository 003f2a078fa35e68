package dataplane

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/test/dataplane/internal/re2"
)

// regexOfSize is prefix followed by as many 'a's as make its RE2 program size exactly
// want (a literal adds one instruction per byte).
func regexOfSize(t *testing.T, prefix string, want int) string {
	t.Helper()
	for p := prefix; len(p) < 4*want; p += "a" {
		n, err := re2.ProgramSize(p)
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return p
		}
		if n > want {
			break
		}
	}
	t.Fatalf("no regex %q + a... has RE2 program size %d", prefix, want)
	return ""
}

func safeRegex(re string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

// extProcListener is a listener whose HCM runs an ext_proc filter with mutation rules mr.
func extProcListener(t *testing.T, mr *mutationv3.HeaderMutationRules) *listenerv3.Listener {
	ep := &extprocfilterv3.ExternalProcessor{
		GrpcService:   &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "extproc"}}},
		MutationRules: mr,
	}
	h := &hcmv3.HttpConnectionManager{StatPrefix: "t", RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "rc"}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.ext_proc", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, ep)}},
			{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}}}
	return &listenerv3.Listener{Name: "l",
		Address:      &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{Name: "hcm", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, h)}}}}}}
}

// TestRE2ProgramSizeLimit: a regex whose RE2 program size exceeds Envoy's error level (the
// runtime key re2.max_program_size.error_level, default 100) NACKs the resource carrying
// it, with Envoy's message (source/common/common/regex.cc, CompiledGoogleReMatcher); one at
// the limit is accepted. Every place the stand-in compiles a RegexMatcher.
func TestRE2ProgramSizeLimit(t *testing.T) {
	cases := []struct {
		name    string
		typeURL string
		build   func(t *testing.T, re string) proto.Message
	}{
		{"route safe_regex", resource.RouteType, func(t *testing.T, re string) proto.Message {
			r := routeTo("r")
			r.Match.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}
			return vhost([]*routev3.Route{r}, nil)
		}},
		{"header matcher string_match safe_regex", resource.RouteType, func(t *testing.T, re string) proto.Message {
			return vhost([]*routev3.Route{routeTo("r", &routev3.HeaderMatcher{Name: "x-h",
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: safeRegex(re)}})}, nil)
		}},
		{"query parameter string_match safe_regex", resource.RouteType, func(t *testing.T, re string) proto.Message {
			r := routeTo("r")
			r.Match.QueryParameters = []*routev3.QueryParameterMatcher{{Name: "q",
				QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: safeRegex(re)}}}
			return vhost([]*routev3.Route{r}, nil)
		}},
		{"ext_proc mutation_rules allow_expression", resource.ListenerType, func(t *testing.T, re string) proto.Message {
			return extProcListener(t, &mutationv3.HeaderMutationRules{AllowExpression: &matcherv3.RegexMatcher{Regex: re}})
		}},
		{"ext_proc mutation_rules disallow_expression", resource.ListenerType, func(t *testing.T, re string) proto.Message {
			return extProcListener(t, &mutationv3.HeaderMutationRules{DisallowExpression: &matcherv3.RegexMatcher{Regex: re}})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			at := regexOfSize(t, "/x-", 100)
			if _, errs := emptyConfig().withType(tc.typeURL, "1", []proto.Message{tc.build(t, at)}); len(errs) > 0 {
				t.Fatalf("a regex of program size 100 NACKed: %v", errs)
			}
			over := regexOfSize(t, "/x-", 101)
			_, errs := emptyConfig().withType(tc.typeURL, "1", []proto.Message{tc.build(t, over)})
			want := fmt.Sprintf("regex '%s' RE2 program size of 101 > max program size of 100 set for the error level threshold. Increase configured max program size if necessary.", over)
			var all []string
			for _, e := range errs {
				all = append(all, e.Error())
			}
			if got := strings.Join(all, "\n"); len(errs) != 1 || !strings.Contains(got, want) {
				t.Fatalf("errors %q, want one with %q", got, want)
			}
		})
	}
	// A pattern RE2 rejects is a NACK with RE2's message, as in Envoy (regex_.error()).
	_, errs := emptyConfig().withType(resource.RouteType, "1", []proto.Message{cases[0].build(t, "a**")})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "bad repetition operator") {
		t.Fatalf("errors %v, want RE2's bad repetition operator", errs)
	}
}

// productRE2Margin is the largest RE2 program size TestProductRegexesWithinRE2Limit admits
// in our configuration: below Envoy's error level (100) because Envoy bundles a newer RE2
// than Debian's libre2, which measures here, and the two may size a regex differently.
const productRE2Margin = 90

// TestProductRegexesWithinRE2Limit: every regex in every golden output of internal/snapshot
// (testdata/<case>/*.yaml: each RegexMatcher's regex field, wherever it is, typed_config
// included) has an RE2 program size of at most productRE2Margin, so Envoy accepts our
// configuration with room to spare. Each offending regex is printed with its size and where
// it occurs.
func TestProductRegexesWithinRE2Limit(t *testing.T) {
	testdata := fixtures.Dir()
	ins, err := filepath.Glob(filepath.Join(testdata, "*.in.yaml"))
	if err != nil || len(ins) == 0 {
		t.Fatalf("no golden fixtures: %v", err)
	}
	where := map[string][]string{} // regex -> case/file
	for _, in := range ins {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		files, err := filepath.Glob(filepath.Join(testdata, name, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no golden files: %v", name, err)
		}
		for _, f := range files {
			y, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			js, err := yaml.YAMLToJSON(y)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var doc any
			if err := json.Unmarshal(js, &doc); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			loc := name + "/" + filepath.Base(f)
			walkRegexes(doc, func(re string) {
				if l := where[re]; len(l) == 0 || l[len(l)-1] != loc {
					where[re] = append(l, loc)
				}
			})
		}
	}
	if len(where) == 0 {
		t.Fatal("no regex found in the golden files")
	}
	regexes := make([]string, 0, len(where))
	for re := range where {
		regexes = append(regexes, re)
	}
	sort.Strings(regexes)
	bad := 0
	for _, re := range regexes {
		n, err := re2.ProgramSize(re)
		switch {
		case err != nil:
			bad++
			t.Errorf("regex '%s' (in %s): RE2 rejects it: %v", re, strings.Join(where[re], ", "), err)
		case n > productRE2Margin:
			bad++
			t.Errorf("regex '%s' (in %s): RE2 program size %d > %d (Envoy's error level: %d)", re, strings.Join(where[re], ", "), n, productRE2Margin, re2MaxProgramSizeErrorLevel)
		default:
			t.Logf("regex '%s': RE2 program size %d", re, n)
		}
	}
	t.Logf("%d distinct regexes in %d cases, %d over %d", len(regexes), len(ins), bad, productRE2Margin)
}

// walkRegexes calls f with every string under a "regex" key in a decoded JSON document (a
// RegexMatcher's regex: safe_regex, string_match.safe_regex, allow_expression, ...).
func walkRegexes(v any, f func(string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok && k == "regex" {
				f(s)
				continue
			}
			walkRegexes(c, f)
		}
	case []any:
		for _, c := range x {
			walkRegexes(c, f)
		}
	}
}

// TestProductRegexesWhateverTheNames: the regexes of our configuration do not grow with the
// names it carries: a control plane mid-upgrade whose group names are as long as Kubernetes
// allows (a CRD group of 253 characters; here served by one apiserver of two, so its routes
// and ext_proc are in play) and whose apiservers read request-header names of their own,
// long ones included, has only regexes within productRE2Margin.
func TestProductRegexesWhateverTheNames(t *testing.T) {
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 59) + ".example.io" // 253
	ss := []topology.APIServer{
		{ID: "apiserver-aaaaaaaaaaaaaaaaaaaaaaaaaa", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "apiserver-bbbbbbbbbbbbbbbbbbbbbbbbbb", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
	}
	served := map[topology.Resource][]string{
		{Group: long, Version: "v1alpha1", Resource: "things"}:            {ss[0].ID},
		{Group: long, Version: "v1alpha1", Resource: "others"}:            {ss[0].ID, ss[1].ID},
		{Group: "", Version: "v1", Resource: "pods"}:                      {ss[0].ID, ss[1].ID},
		{Group: "", Version: "v1", Resource: "pods", Subresource: "exec"}: {ss[0].ID, ss[1].ID},
	}
	topo, err := topology.New(ss, served, nil)
	if err != nil {
		t.Fatal(err)
	}
	topo.RequestHeaders = topology.RequestHeaders{
		User:        []string{"X-Authenticated-User-Name-Of-A-Very-Long-Kind", "X-Remote-User"},
		UID:         []string{"X-Authenticated-User-Identifier-Of-A-Very-Long-Kind"},
		Group:       []string{"X-Authenticated-User-Groups-Of-A-Very-Long-Kind", "X-Remote-Group"},
		ExtraPrefix: []string{"X-Authenticated-User-Extra-Attributes-Of-A-Very-Long-Kind-", "X-Remote-Extra-"},
	}
	pl, err := plan.Build(topo)
	if err != nil {
		t.Fatal(err)
	}
	res, err := snapshot.Build(pl, snapshot.Config{ExtProcAddress: "unix:/nonexistent/extproc.sock", Secrets: newPKI(t).files(t)})
	if err != nil {
		t.Fatal(err)
	}
	js, err := res.ToJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	walkRegexes(doc, func(re string) {
		n++
		if size, err := re2.ProgramSize(re); err != nil || size > productRE2Margin {
			t.Errorf("regex '%s': RE2 program size %d (%v), want at most %d", re, size, err, productRE2Margin)
		}
	})
	if n == 0 || !strings.Contains(string(js), long) {
		t.Fatalf("%d regexes, long group in the configuration %v: not the configuration meant", n, strings.Contains(string(js), long))
	}
}
