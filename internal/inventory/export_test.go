package inventory

import (
	"context"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	"k8s.io/client-go/rest"
)

// FetchDiscovery is Fetch's list and version.
func FetchDiscovery(ctx context.Context, base *rest.Config, address string, opts FetchOptions) (*apidiscoveryv2.APIGroupDiscoveryList, string, error) {
	f, err := Fetch(ctx, base, address, opts)
	if err != nil {
		return nil, "", err
	}
	return f.List, f.Version, nil
}
