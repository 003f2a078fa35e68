// Command etcd is the etcd server pinned by this Kubernetes release, for tests only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
