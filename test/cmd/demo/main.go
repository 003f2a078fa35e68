// Command demo shows kube-mvp at work on this machine (`make demo`): a mixed-version control
// plane — cp-a runs kube-apiserver v1.37.1, cp-b v1.36.4 with batch/v1 turned off — behind a
// plain round-robin balancer and behind kube-mvp (xds-server, extproc and the test data plane
// standing in for Envoy). The same kubectl calls go through both; then it prints where kube-mvp
// routed them and stays up for you to try until Ctrl-C (or exits with --exit).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/explain"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

func main() {
	exit := flag.Bool("exit", false, "exit after the scripted calls instead of staying up")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *exit); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, exit bool) error {
	step := func(format string, args ...any) { fmt.Fprintf(out, "\n==> "+format+"\n", args...) }

	step("building (or reusing) kube-apiserver v1.37.1 and v1.36.4, etcd, kubectl, xds-server and extproc")
	kubectl, err := controlplane.EnsureKubectl(ctx, out)
	if err != nil {
		return err
	}
	for _, v := range []string{"v1.37.1", "v1.36.4"} {
		if _, err := controlplane.EnsureBinaries(ctx, v, out); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("/tmp", "kube-mvp-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	binDir := filepath.Join(dir, "bin")
	if err := harness.BuildBinaries(ctx, binDir); err != nil {
		return err
	}

	step("starting etcd, cp-a (v1.37.1) and cp-b (v1.36.4, --runtime-config=batch/v1=false)")
	cp, err := controlplane.Start(ctx, controlplane.Options{Log: out, Servers: controlplane.MixedServers()})
	if err != nil {
		return err
	}
	defer cp.Close()

	step("starting kube-mvp: xds-server (watching the Leases), extproc (following xds-server), the data plane")
	k, err := harness.Start(ctx, harness.Options{ControlPlane: cp, BinDir: binDir, Dir: dir, Name: "demo"})
	if err != nil {
		return err
	}
	defer k.Close()
	rr, err := harness.StartRoundRobin([]string{cp.Server("cp-a").Address(), cp.Server("cp-b").Address()})
	if err != nil {
		return err
	}
	defer rr.Close()

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, cp, map[string]string{
		"kube-mvp":    k.Endpoint(),
		"round-robin": "https://" + rr.Addr(),
		"cp-a":        cp.Server("cp-a").URL(),
		"cp-b":        cp.Server("cp-b").URL(),
	}); err != nil {
		return err
	}
	sh := func(args ...string) (string, error) {
		if !slices.Contains(args, "--cache-dir") {
			args = append([]string{"--cache-dir", filepath.Join(dir, "kubectl-cache")}, args...)
		}
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		b, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	show := func(args ...string) {
		o, err := sh(args...)
		mark := "ok  "
		if err != nil {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "  %s $ kubectl %s\n", mark, strings.Join(args, " "))
		for line := range strings.Lines(o) {
			fmt.Fprintf(out, "         %s", line)
		}
		fmt.Fprintln(out)
	}

	step("a Job, created on cp-a (cp-b does not serve batch/v1)")
	show("--context", "cp-a", "create", "job", "hello", "--image=busybox")
	show("--context", "cp-b", "get", "jobs")

	// Each call with a fresh discovery cache, as a new kubectl would: it reads discovery
	// (/api, /apis) and then lists, and behind a plain balancer either may reach cp-b.
	for _, via := range []string{"round-robin", "kube-mvp"} {
		step("kubectl get jobs, 6 times through %s", via)
		okCount := 0
		for i := range 6 {
			o, err := sh("--context", via, "--cache-dir", filepath.Join(dir, fmt.Sprintf("cache-%s-%d", via, i)), "get", "jobs", "-o", "name")
			if err == nil {
				okCount++
				fmt.Fprintf(out, "  ok    %s\n", firstLine(o))
			} else {
				fmt.Fprintf(out, "  FAIL  %s\n", firstLine(o))
			}
		}
		fmt.Fprintf(out, "  %s: %d of 6 succeeded\n", via, okCount)
	}

	step("more through kube-mvp")
	show("--context", "kube-mvp", "get", "deployments", "-A")
	show("--context", "kube-mvp", "auth", "whoami")
	show("--context", "kube-mvp", "version")

	step("what kube-mvp sees (kubectl mvp status --xds-admin %s --extproc-admin %s)", k.XDSAdmin, k.ExtprocAdmin)
	if err := printStatus(ctx, out, k.XDSAdmin, k.ExtprocAdmin); err != nil {
		fmt.Fprintf(out, "  (status unavailable: %v)\n", err)
	}
	step("where a request goes, and why (kubectl mvp explain GET /apis/batch/v1/jobs --xds-admin %s)", k.XDSAdmin)
	if err := printExplain(out, k.XDSAdmin, "GET", "/apis/batch/v1/jobs"); err != nil {
		fmt.Fprintf(out, "  (explain unavailable: %v)\n", err)
	}
	step("where the requests went (data plane admin %s/clusters)", k.Envoy.Admin)
	if err := printClusters(ctx, out, k.Envoy.Admin); err != nil {
		fmt.Fprintf(out, "  (clusters unavailable: %v)\n", err)
	}

	step("xds-server's gRPC port %s answers only the control plane's certificates", k.XDSAddress)
	for _, c := range []struct {
		who   string
		creds credentials.TransportCredentials
	}{
		{"a client without a certificate", credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})}, //nolint:gosec // an attacker's client
		{"extproc's certificate asking for Envoy's secrets", roleCreds(k, cptls.RoleExtproc)},
		{"a front Envoy's certificate", roleCreds(k, cptls.RoleEnvoyFront)},
	} {
		fmt.Fprintf(out, "  %-50s %s\n", c.who, askForSecrets(ctx, k.XDSAddress, c.creds))
	}

	if exit {
		return nil
	}
	step("kube-mvp is up. In another shell:\n\n"+
		"    export KUBECONFIG=%s\n    kubectl --context kube-mvp get jobs\n    kubectl --context round-robin get jobs\n\n"+
		"    make build && export PATH=$PWD/bin:$PATH   # kubectl mvp\n"+
		"    kubectl mvp status --xds-admin %s --extproc-admin %s\n"+
		"    kubectl mvp explain GET /apis/batch/v1/jobs --xds-admin %s\n"+
		"    kubectl mvp config-dump --xds-admin %s --envoy-admin %s\n\n"+
		"    xds-server admin: %s/debug/topology  %s/debug/config_dump\n    data plane admin: %s/clusters  %s/config_dump\n    extproc metrics:  %s/metrics\n\n"+
		"Ctrl-C stops everything.",
		kubeconfig, k.XDSAdmin, k.ExtprocAdmin, k.XDSAdmin, k.XDSAdmin, k.Envoy.Admin, k.XDSAdmin, k.XDSAdmin, k.Envoy.Admin, k.Envoy.Admin, k.ExtprocAdmin)
	<-ctx.Done()
	return nil
}

func writeKubeconfig(path string, cp *controlplane.ControlPlane, servers map[string]string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.PKI.Admin.CertPEM, ClientKeyData: cp.PKI.Admin.KeyPEM}
	for name, url := range servers {
		cfg.Clusters[name] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: cp.PKI.ServerCA.CertPEM}
		cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: "admin", Namespace: "default"}
	}
	cfg.CurrentContext = "kube-mvp"
	return clientcmd.WriteToFile(*cfg, path)
}

// printStatus prints what kubectl mvp status prints, indented.
func printStatus(ctx context.Context, out io.Writer, xdsAdmin, extprocAdmin string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pages, err := opstatus.Fetch(ctx, &http.Client{}, []opstatus.Target{{Name: xdsAdmin, URL: xdsAdmin}}, []opstatus.Target{{Name: extprocAdmin, URL: extprocAdmin}})
	if err != nil {
		return err
	}
	var b bytes.Buffer
	opstatus.Write(&b, opstatus.Summarize(pages), time.Now())
	indent(out, b.String())
	return nil
}

// printExplain prints what kubectl mvp explain prints for one request, indented.
func printExplain(out io.Writer, xdsAdmin, method, path string) error {
	var x explain.Explanation
	if err := getJSON(xdsAdmin+"/debug/explain?"+url.Values{"method": {method}, "path": {path}}.Encode(), &x); err != nil {
		return err
	}
	var b bytes.Buffer
	explain.Write(&b, &x)
	indent(out, b.String())
	return nil
}

func indent(out io.Writer, s string) {
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		fmt.Fprintf(out, "  %s\n", line)
	}
}

// printClusters shows, per cluster of the data plane's /clusters, each apiserver with its
// health and the requests it answered.
func printClusters(ctx context.Context, out io.Writer, adminURL string) error {
	clusters, err := dataplane.ReadClusters(ctx, adminURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  %-34s %-6s %-9s %s\n", "cluster", "host", "health", "requests")
	for _, c := range clusters.GetClusterStatuses() {
		for _, h := range c.GetHostStatuses() {
			health := "healthy"
			switch hs := h.GetHealthStatus(); {
			case hs.GetFailedActiveHealthCheck():
				health = "unhealthy"
			case hs.GetFailedOutlierCheck():
				health = "ejected"
			case hs.GetPendingActiveHc():
				health = "pending"
			}
			var total uint64
			for _, st := range h.GetStats() {
				if st.GetName() == "rq_total" {
					total = st.GetValue()
				}
			}
			fmt.Fprintf(out, "  %-34s %-6s %-9s %d\n", c.GetName(), h.GetHostname(), health, total)
		}
	}
	return nil
}

func getJSON(url string, v any) error {
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != 200 {
		return fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, v)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// roleCreds are a role's control-plane credentials in the deployment.
func roleCreds(k *harness.KubeMVP, r cptls.Role) credentials.TransportCredentials {
	c, err := cptls.Load(cptls.DirFiles(k.ControlPlaneTLS(r)), r, nil)
	if err != nil {
		return credentials.NewTLS(&tls.Config{}) //nolint:gosec // fails the handshake, as it should
	}
	return credentials.NewTLS(c.ClientConfig())
}

// askForSecrets asks xds-server's ADS for the secrets and says what came back.
func askForSecrets(ctx context.Context, addr string, creds credentials.TransportCredentials) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return "refused: " + err.Error()
	}
	defer conn.Close()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err == nil {
		// In ADS mode the cache answers a request that names every secret of the snapshot.
		err = stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "demo-visitor"}, TypeUrl: resourcev3.SecretType,
			ResourceNames: []string{"kube-mvp-client-ca", "kube-mvp-peer-ca", "kube-mvp-proxy-client-cert", "kube-mvp-serving-cert"}})
		if errors.Is(err, io.EOF) {
			err = nil // the server ended the stream already: Recv has its status
		}
	}
	var resp *discovery.DiscoveryResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	if err != nil {
		return "refused: " + grpcstatus.Code(err).String()
	}
	for _, a := range resp.GetResources() {
		var s tlsv3.Secret
		if a.UnmarshalTo(&s) == nil && s.GetName() == "kube-mvp-proxy-client-cert" {
			return "answered: private_key is the file " + s.GetTlsCertificate().GetPrivateKey().GetFilename()
		}
	}
	return "answered, but not with the proxy client secret"
}
