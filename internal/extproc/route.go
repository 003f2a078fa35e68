package extproc

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// preparedTable is one routing table (plan.Table) with everything derived from it that requests need, so a
// request sees one consistent table and does no work that depends only on the table.
type preparedTable struct {
	plans    *plan.Table
	version  string
	loadedAt time.Time
	m        *metrics
	// views are the prepared routes of each kind of Envoy, by local apiserver ("" for a
	// front proxy). An extproc serves one Envoy, so a view is prepared when first asked for.
	views map[string]*view
	// discoveryGzip is plans.Discovery's document gzip-compressed (nil without one).
	discoveryGzip []byte
}

func newPreparedTable(p *plan.Table, version string, at time.Time, m *metrics) *preparedTable {
	tb := &preparedTable{plans: p, version: version, loadedAt: at, m: m, views: make(map[string]*view, len(p.Routes))}
	for local, rs := range p.Routes {
		tb.views[local] = &view{routes: rs}
	}
	return tb
}

// view is one Envoy's routes with their responses built once per table, not per request,
// so the common response is sent as is. The responses depend only on a route's outcome and
// cluster, so they are built per distinct route (a plan has a handful for thousands of
// keys); what names a key is made on the key's first request.
type view struct {
	routes  *plan.Routes
	m       *metrics
	once    sync.Once
	def     *route
	answers []*answers // of routes.Distinct()
	keys    []keyRoute // by the key's position (plan.Routes.DecideKey)
}

type keyRoute struct {
	once sync.Once
	rt   *route
}

// view returns the prepared routes of the Envoy beside local ("" for a front proxy), or nil
// when the table has no plan for it.
func (tb *preparedTable) view(local string) *view {
	v := tb.views[local]
	if v == nil {
		return nil
	}
	v.once.Do(func() {
		servers := tb.plans.APIServers
		refusals := map[string]*extprocv3.ProcessingResponse{} // by ProxyCertRefused's key
		refuse := func(ids topology.ServerSet) *extprocv3.ProcessingResponse {
			key := ids.Key()
			if refusals[key] == nil {
				refusals[key] = proxyCertRefusal(servers, ids)
			}
			return refusals[key]
		}
		v.m = tb.m
		v.def = newKeyRoute(v.routes.Default, newAnswers(v.routes.Default, refuse), tb.m)
		distinct := v.routes.Distinct()
		v.answers = make([]*answers, len(distinct))
		for i, r := range distinct {
			v.answers[i] = newAnswers(r, refuse)
		}
		v.keys = make([]keyRoute, v.routes.Len())
	})
	return v
}

// route returns the prepared route of d, the route of v's key-th key (the default route
// when key < 0).
func (v *view) route(d plan.Route, key int) *route {
	if key < 0 || key >= len(v.keys) {
		return v.def
	}
	k := &v.keys[key]
	k.once.Do(func() { k.rt = newKeyRoute(d, v.answers[v.routes.DistinctOf(key)], v.m) })
	return k.rt
}

// answers are what a decision turns into, whatever key it is for: one answer per request
// kind (plan.RequestKind.Index), each for the kind's plan.Route.Destination.
type answers struct {
	// lb names a Subset's serving set in the request's dynamic metadata, which Envoy's
	// router hands the serving-sets cluster's subset load balancer; nil otherwise.
	lb *structpb.Struct
	// set, for a kind the route forwards, holds the routing header naming the kind's cluster
	// (and x-kubernetes-peer-proxied for a subset); nil for a kind it refuses.
	set [len(plan.RequestKinds)][]*corev3.HeaderValueOption
	// resp is the whole answer for a request of the kind without client-supplied headers
	// that only kube-mvp may set; for a kind it refuses, the immediate 503 for every
	// request: Unavailable (it names the key: see newKeyRoute), or every apiserver of the
	// cluster dangerous for requests whose identity the Lua filter set
	// (plan.Route.ProxyCertRefused).
	resp [len(plan.RequestKinds)]*extprocv3.ProcessingResponse
}

// route is a decision for one key: its answers and the metric to count it in.
type route struct {
	*answers
	labels      [4]string
	counterOnce sync.Once
	counter     prometheus.Counter
	m           *metrics
}

// newKeyRoute is the route of d's key, answered as a: the metric's labels name the key, and
// an Unavailable key's 503 says which resource has no apiserver, or that a new CRD's is not
// served yet (d.Pending).
func newKeyRoute(d plan.Route, a *answers, m *metrics) *route {
	res := d.Resource.Resource
	if d.Resource.Subresource != "" {
		res += "/" + d.Resource.Subresource
	}
	outcome := d.Outcome.String()
	if d.Outcome == topology.Unavailable {
		resp := immediate503("no apiserver that serves "+d.Resource.String()+" is available", "kube_mvp_no_live_apiserver")
		if d.Pending {
			outcome = outcomePending
			resp = immediate503(d.Resource.String()+" is a new CustomResourceDefinition's that no apiserver serves yet; retry in a moment", "kube_mvp_new_crd_pending")
		}
		a = &answers{}
		for k := range a.resp {
			a.resp[k] = resp
		}
	}
	return &route{answers: a, labels: [4]string{outcome, d.Resource.Group, d.Resource.Version, res}, m: m}
}

// newAnswers prepares d's answers; refuse makes the answer to requests with the proxy
// certificate when every apiserver of d's cluster is dangerous.
func newAnswers(d plan.Route, refuse func(topology.ServerSet) *extprocv3.ProcessingResponse) *answers {
	a := &answers{}
	if set := d.Destination(plan.RequestKind{}).ServingSet; set != "" {
		a.lb = servingSetMetadata(set) // every kind's: the serving set is the route's
	}
	for _, k := range plan.RequestKinds {
		dest := d.Destination(k)
		switch dest.Refused {
		case plan.RefusedUnavailable:
			continue // newKeyRoute answers, naming the key
		case plan.RefusedProxyCert:
			a.resp[k.Index()] = refuse(d.ProxyCertRefused)
			continue
		}
		set := []*corev3.HeaderValueOption{setHeader(contract.HeaderRoutingCluster, dest.Cluster.String(), false)}
		if dest.ServingSet != "" {
			// An apiserver that runs upstream's in-process MVP must not proxy the request again.
			set = append(set, setHeader(contract.HeaderPeerProxied, "true", false))
		}
		a.set[k.Index()] = set
		a.resp[k.Index()] = headersResponse(set, nil, a.lb)
	}
	return a
}

func (r *route) count() {
	r.counterOnce.Do(func() { r.counter = r.m.decision(r.labels) })
	r.counter.Inc()
}

// response is a's answer for a request of kind k (plan.RequestKind.Index), one a forwards,
// that carries headers only kube-mvp may set (seen, lower-case names), which the listener
// should have stripped: they are removed, and since the ext_proc filter's mutation rules
// allow extproc to remove nothing, Envoy then fails the request (disallow_is_error: a 503
// Status) rather than forward it. That only happens with a listener that does not strip what
// this table names: one configured by hand, or one of another configuration version than
// the table.
func (a *answers) response(seen []string, k int) *extprocv3.ProcessingResponse {
	return headersResponse(a.set[k], seen, a.lb)
}

// proxyCertRefusal is the immediate 503 for requests whose identity the Lua filter set
// when every apiserver that could serve them (ids) takes the proxy certificate for an
// ordinary client's: the same message as the direct responses of Envoy's routes.
func proxyCertRefusal(servers []topology.APIServer, ids topology.ServerSet) *extprocv3.ProcessingResponse {
	return immediate503(plan.ProxyCertRefusal(servers, ids), "kube_mvp_front_proxy_refused")
}

// headersResponse answers request_headers by continuing with a header mutation.
//
// Route cache: the route was chosen before ext_proc ran, and it must be chosen again now that
// x-kube-mvp-cluster is set. Envoy (ext_proc DecodingProcessorState::clearRouteCache)
// considers clearing it only when a headers response carries a header_mutation (ours always
// does), and then follows the filter's route_cache_action: CLEAR, which our snapshot sets,
// clears it regardless of this response's clear_route_cache bit; DEFAULT clears it only when
// the bit is set; RETAIN never does. We set the bit as well so a filter left at DEFAULT
// routes correctly too.
func headersResponse(set []*corev3.HeaderValueOption, remove []string, lb *structpb.Struct) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		DynamicMetadata: lb,
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
				ClearRouteCache: true,
			},
		}},
	}
}

// servingSetMetadata is the dynamic metadata that selects serving set name in the
// serving-sets cluster: Envoy's ext_proc filter sets each top-level field as a namespace
// (only those its metadata_options.receiving_namespaces allow, which our snapshot sets to
// contract.MetadataNamespaceLB), and the router takes that namespace as the subset criteria.
func servingSetMetadata(name string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		contract.MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			contract.LBSetKey: structpb.NewStringValue(name),
		}}),
	}}
}

// setHeader sets key to value. Envoy reads header values from raw_value (the runtime flag
// envoy.reloadable_features.send_header_raw_value, on by default; setting both value and
// raw_value makes Envoy reject the mutation). In ext_proc, append defaults to false, which
// replaces every existing value; ext_proc honours only the (deprecated) append flag, not
// append_action, so appending needs append: true.
func setHeader(key, value string, appendValue bool) *corev3.HeaderValueOption {
	o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
	if appendValue {
		//lint:ignore SA1019 ext_proc honours only the deprecated append flag (see above)
		o.Append = wrapperspb.Bool(true)
	}
	return o
}

// retryAfterSeconds is the Retry-After of kube-mvp's own 503s: nobody can answer now, and
// client-go retries a 503 that carries Retry-After by itself (up to 10 times), which rides
// out a restart or a rolling upgrade without an error reaching the caller.
const retryAfterSeconds = 1

// immediate503 answers the client directly with a Kubernetes Status, as an apiserver would,
// and Retry-After.
func immediate503(message, details string) *extprocv3.ProcessingResponse {
	r := immediateStatus(typev3.StatusCode_ServiceUnavailable, metav1.StatusReasonServiceUnavailable, message, details)
	ir := r.GetImmediateResponse()
	ir.Headers.SetHeaders = append(ir.Headers.SetHeaders, setHeader("retry-after", strconv.Itoa(retryAfterSeconds), false))
	return r
}

func immediateStatus(code typev3.StatusCode, reason metav1.StatusReason, message, details string) *extprocv3.ProcessingResponse {
	st := &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   reason,
		Code:     int32(code),
	}
	if code == typev3.StatusCode_ServiceUnavailable {
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: retryAfterSeconds}
	}
	body, err := json.Marshal(st)
	if err != nil {
		panic(err) // a fixed struct of strings always marshals
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("content-type", "application/json", false),
			}},
			Body: body,
			// Envoy's %RESPONSE_CODE_DETAILS% for the access log.
			Details: details,
		}},
	}
}
