package objects

import (
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
)

// TestDiscoveryMemoKeepsOnlyTheLastLists: what the check memory holds is bounded by the
// lists of the last build, not by every list ever fetched.
func TestDiscoveryMemoKeepsOnlyTheLastLists(t *testing.T) {
	var c DiscoveryMemo
	for range 5 {
		lists := map[string]*apidiscoveryv2.APIGroupDiscoveryList{"a": {}, "b": {}} // fetched anew each round
		for id, l := range lists {
			c.valid(id, l)
		}
		c.keepOnly(lists)
	}
	if len(c.m) != 2 {
		t.Errorf("after five rounds of two new lists: %d remembered; want 2", len(c.m))
	}
}
