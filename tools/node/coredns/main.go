// Command coredns is upstream CoreDNS with its default plugin set, built from the published
// github.com/coredns/coredns module for the one-node test cluster's DNS (no image registry is
// reachable from our machines). See test/node/images.CoreDNS.
package main

import (
	_ "github.com/coredns/coredns/core/plugin" // every plugin of the default build
	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
