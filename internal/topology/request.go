package topology

// RequestInfo is what Decide needs to know about a request. It mirrors the fields of
// k8s.io/apiserver/pkg/endpoints/request.RequestInfo, parsed the same way (see ParseRequest).
type RequestInfo struct {
	IsResourceRequest bool
	Path              string
	Verb              string
	APIPrefix         string
	APIGroup          string
	APIVersion        string
	Namespace         string
	Resource          string
	Subresource       string
	Name              string
	Parts             []string
}
