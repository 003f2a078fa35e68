package topology

// RequestInfo is what routing needs to know about a request (plan.Routes.Decide): the fields of
// k8s.io/apiserver/pkg/endpoints/request.RequestInfo that routing reads, parsed the same way
// (see ParsePath). Upstream's other fields (verb, namespace, name, parts) route nothing, so
// they are not computed.
type RequestInfo struct {
	IsResourceRequest bool
	// GroupVersionDocument: the path is a group/version's discovery document, "/api/<v>" or
	// "/apis/<g>/<v>" (slashes around it ignored), whose group and version are in APIGroup and
	// APIVersion. Upstream has no such field: to it this is a non-resource request (its
	// RequestInfo leaves group and version empty), answered by the handler that serves the
	// group/version, so an apiserver that serves none of it answers 404.
	GroupVersionDocument bool
	APIGroup             string
	APIVersion           string
	Resource             string
	Subresource          string
}
