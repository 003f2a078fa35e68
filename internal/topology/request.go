package topology

// RequestInfo is what routing needs to know about a request (plan.Routes.Decide): the fields of
// k8s.io/apiserver/pkg/endpoints/request.RequestInfo that routing reads, parsed the same way
// (see ParsePath). Upstream's other fields (verb, namespace, name, parts) route nothing, so
// they are not computed.
type RequestInfo struct {
	IsResourceRequest bool
	APIGroup          string
	APIVersion        string
	Resource          string
	Subresource       string
}
