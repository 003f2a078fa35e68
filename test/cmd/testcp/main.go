// Command testcp builds and runs the test control plane by hand: the same etcd and
// kube-apiservers the end-to-end tests use.
//
//	testcp build [VERSION...]            build (or find cached) binaries and kubectl; default: every pinned version
//	testcp build-node                    build (or find cached) the test node's kubelet, kube-proxy, ... (make test-node)
//	testcp up --server cp-a=v1.37.1 --server cp-b=v1.36.4:batch/v1=false [--peer-proxy]
//	                                     start them, print a kubeconfig, run until interrupted
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-mvp/kube-mvp/test/cmd/internal/cmdmain"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

func main() { cmdmain.Main("testcp", 2, run) }

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: testcp build [VERSION...] | testcp build-node | testcp up --server NAME=VERSION[:RUNTIME-CONFIG,...] [FLAGS]")
	}
	switch args[0] {
	case "build":
		versions := args[1:]
		if len(versions) == 0 {
			versions = controlplane.Versions
		}
		for _, v := range versions {
			if _, err := controlplane.EnsureBinaries(ctx, v, os.Stdout); err != nil {
				return err
			}
		}
		_, err := controlplane.EnsureKubectl(ctx, os.Stdout)
		return err
	case "build-node":
		_, err := controlplane.EnsureNodeBinaries(ctx, os.Stdout)
		return err
	case "up":
		return up(ctx, args[1:])
	}
	return fmt.Errorf("unknown command %q (want build, build-node or up)", args[0])
}

type serverFlags []controlplane.ServerSpec

func (s *serverFlags) String() string { return "" }

// Set parses NAME=VERSION[:RUNTIME-CONFIG,...].
func (s *serverFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("--server %q: want NAME=VERSION[:RUNTIME-CONFIG,...], e.g. cp-b=v1.36.4:batch/v1=false", v)
	}
	version, rc, _ := strings.Cut(rest, ":")
	spec := controlplane.ServerSpec{Name: name, Version: version}
	if rc != "" {
		spec.RuntimeConfig = strings.Split(rc, ",")
	}
	*s = append(*s, spec)
	return nil
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	var servers serverFlags
	fs.Var(&servers, "server", "NAME=VERSION[:RUNTIME-CONFIG,...]; repeat for each apiserver")
	peerProxy := fs.Bool("peer-proxy", false, "turn on upstream's in-process Mixed Version Proxy on every server")
	dir := fs.String("dir", "", "keep certificates, data and logs here (default: a temporary directory, removed on exit)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs error
	if len(servers) == 0 {
		errs = multierror.Append(errs, errors.New("--server: give at least one, e.g. --server cp-a=v1.37.1"))
	}
	for i := range servers {
		servers[i].PeerProxy = *peerProxy
		known := false
		for _, v := range controlplane.Versions {
			known = known || v == servers[i].Version
		}
		if !known {
			errs = multierror.Append(errs, fmt.Errorf("--server %s: version %q has no pinned build; use one of %v", servers[i].Name, servers[i].Version, controlplane.Versions))
		}
	}
	if errs != nil {
		return errs
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Servers: servers, Dir: *dir, Log: os.Stdout})
	if err != nil {
		return err
	}
	defer cp.Close()
	kubeconfig, err := cp.WriteKubeconfig()
	if err != nil {
		return err
	}
	fmt.Printf("\ncontrol plane up; one context per server:\n  export KUBECONFIG=%s\n  certificates and logs: %s\npress Ctrl-C to stop\n", kubeconfig, cp.Dir())
	<-ctx.Done()
	return nil
}
