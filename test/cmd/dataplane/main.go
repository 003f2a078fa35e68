// Command dataplane runs kube-mvp's test data plane (test/dataplane) by hand: a stand-in for
// Envoy that executes the subset of Envoy our configuration uses. Production runs real Envoy.
//
//	dataplane --xds 127.0.0.1:18000 --node-id test --listen-override kube-apiserver=127.0.0.1:6443
//	xds-server translate -f fixture.yaml -o json > dump.json && dataplane --config dump.json
//
// It prints the admin URL and every listener's bound address once the configuration is
// applied, and any NACK it sends, then runs until interrupted.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kube-mvp/kube-mvp/test/dataplane"
)

type overrides map[string]string

func (o overrides) String() string { return fmt.Sprint(map[string]string(o)) }

func (o overrides) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want name=host:port, got %q", v)
	}
	o[name] = addr
	return nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("dataplane", flag.ContinueOnError)
	xdsAddr := fs.String("xds", "", "ADS server host:port (plaintext gRPC)")
	configFile := fs.String("config", "", "a `xds-server translate -o json` dump instead of ADS")
	nodeID := fs.String("node-id", "kube-mvp-test-dataplane", "Envoy node id")
	local := fs.String("local-apiserver", "", "sidecar mode: node metadata kube-mvp.io/local-apiserver")
	admin := fs.String("admin", "127.0.0.1:9901", "admin listen address")
	verbose := fs.Bool("v", false, "debug logging")
	lo := overrides{}
	fs.Var(lo, "listen-override", "name=host:port: bind listener name there instead (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if (*xdsAddr == "") == (*configFile == "") {
		fmt.Fprintln(os.Stderr, "dataplane: exactly one of --xds and --config is required")
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	opts := dataplane.Options{
		XDSAddress: *xdsAddr, NodeID: *nodeID, LocalAPIServer: *local, AdminAddress: *admin, ListenerAddress: lo,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if *configFile != "" {
		b, err := os.ReadFile(*configFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dataplane: %v\n", err)
			return 2
		}
		opts.ConfigJSON = b
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dp, err := dataplane.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dataplane: %v\n", err)
		return 1
	}
	defer dp.Close()
	fmt.Printf("admin %s\n", dp.AdminURL())
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := dp.WaitReady(wctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0
		}
		fmt.Fprintf(os.Stderr, "dataplane: still waiting for configuration: %v\n", err)
		if opts.ConfigJSON != nil {
			for _, n := range dp.NACKs() {
				fmt.Fprintf(os.Stderr, "NACK: %s\n", n)
			}
			return 1
		}
	}
	versions := dp.Versions()
	types := make([]string, 0, len(versions))
	for t := range versions {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		fmt.Printf("applied %s version %s\n", t, versions[t])
	}
	names := listenerNames(dp)
	for _, n := range names {
		fmt.Printf("listener %s listening on %s\n", n, dp.ListenerAddr(n))
	}
	seen := 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
			n := dp.NACKs()
			for _, e := range n[seen:] {
				fmt.Fprintf(os.Stderr, "NACK: %s\n", e)
			}
			seen = len(n)
		}
	}
}

// listenerNames are the names of the applied listeners, from the admin config dump's
// perspective: our configuration has one, "kube-apiserver".
func listenerNames(dp *dataplane.DataPlane) []string {
	return dp.Listeners()
}
