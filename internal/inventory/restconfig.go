package inventory

import (
	"net/http"
	"os"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTOptions say how to reach the cluster.
type RESTOptions struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster, else client-go's default
	// loading rules ($KUBECONFIG, ~/.kube/config).
	Kubeconfig string
	// HTTP2ReadIdleTimeout and HTTP2PingTimeout are the HTTP/2 health check of every
	// connection: a ping after that long without a frame, and the connection closed when
	// the answer takes longer (see objects.HTTP2ReadIdleTimeout). Zero keeps client-go's
	// (30 s, 15 s), and so does the operator's HTTP2_READ_IDLE_TIMEOUT_SECONDS or
	// HTTP2_PING_TIMEOUT_SECONDS, which client-go reads.
	HTTP2ReadIdleTimeout, HTTP2PingTimeout time.Duration
}

// RESTConfig is the in-cluster configuration without opts.Kubeconfig, else the kubeconfig's,
// with opts' HTTP/2 health check.
func RESTConfig(opts RESTOptions) (*rest.Config, error) {
	cfg, err := loadRESTConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	h2 := http.HTTP2Config{SendPingTimeout: opts.HTTP2ReadIdleTimeout, PingTimeout: opts.HTTP2PingTimeout}
	// The operator's variables win, as they did for client-go alone (it has applied them).
	if os.Getenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS") != "" {
		h2.SendPingTimeout = 0
	}
	if os.Getenv("HTTP2_PING_TIMEOUT_SECONDS") != "" {
		h2.PingTimeout = 0
	}
	if h2.SendPingTimeout != 0 || h2.PingTimeout != 0 {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			setHTTP2Config(rt, h2)
			return rt
		})
	}
	return cfg, nil
}

func loadRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
}

var setHTTP2Mu sync.Mutex

// setHTTP2Config gives the *http.Transport under rt (client-go's, shared by every client of
// the same TLS settings and kept across its CA reloads, which clone it) h2, unless it has
// an HTTP2Config already. client-go configures HTTP/2 from the environment only, but
// golang.org/x/net/http2 reads http.Transport.HTTP2 for each new connection, and its
// non-zero fields win. This wrapper runs when a client is built, before the client's first
// request; a connection already open keeps its settings.
func setHTTP2Config(rt http.RoundTripper, h2 http.HTTP2Config) {
	for {
		switch t := rt.(type) {
		case *http.Transport:
			if t == http.DefaultTransport {
				return // plain HTTP (no TLS): no HTTP/2; and not ours to change
			}
			setHTTP2Mu.Lock()
			defer setHTTP2Mu.Unlock()
			if t.HTTP2 == nil {
				c := h2
				t.HTTP2 = &c
			}
			return
		case utilnet.RoundTripperWrapper:
			rt = t.WrappedRoundTripper()
		default:
			return
		}
	}
}
