package inventory_test

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestRESTConfigHTTP2HealthCheck: a watch whose apiserver stops answering with the connection
// open (a real TLS HTTP/2 server behind a proxy that stops forwarding) ends within the health
// check RESTOptions set, without the HTTP2_* environment variables. The operator's variables
// still win over the options, and without either the watch stays stuck (client-go's defaults
// find the dead connection only after 45 s).
func TestRESTConfigHTTP2HealthCheck(t *testing.T) {
	const bound = 5 * time.Second // the 1 s + 1 s health checks below, with room for -race
	for _, tc := range []struct {
		name          string
		opts          inventory.RESTOptions
		idleEnv, ping string
		detected      bool
	}{
		{name: "options", opts: inventory.RESTOptions{HTTP2ReadIdleTimeout: time.Second, HTTP2PingTimeout: time.Second}, detected: true},
		{name: "operator's environment", opts: inventory.RESTOptions{HTTP2ReadIdleTimeout: time.Minute, HTTP2PingTimeout: time.Minute}, idleEnv: "1", ping: "1", detected: true},
		{name: "client-go's defaults", opts: inventory.RESTOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", tc.idleEnv)
			t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", tc.ping)
			addr, freeze := hangingAPIServer(t)
			// The CA as a file, as in-cluster: client-go then reloads it (a wrapped transport).
			dir := t.TempDir()
			tc.opts.Kubeconfig = filepath.Join(dir, "kubeconfig")
			if err := os.WriteFile(tc.opts.Kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", certificate-authority: ca.crt}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`, addr), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "ca.crt"), freeze.caPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := inventory.RESTConfig(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := testutil.Context(t, time.Minute)
			w, err := client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			freeze.now()
			frozen := time.Now()
			timeout := time.After(bound)
			for {
				select {
				case _, open := <-w.ResultChan():
					if open {
						continue // an error event before the end
					}
					if !tc.detected {
						t.Fatalf("the watch ended %s after the freeze: the test's freeze does not hold", time.Since(frozen))
					}
					t.Logf("the watch ended %s after the freeze", time.Since(frozen).Round(time.Millisecond))
					return
				case <-timeout:
					if tc.detected {
						t.Fatalf("the watch is still open %s after its apiserver stopped answering", bound)
					}
					return
				}
			}
		})
	}
}

type freezer struct {
	caPEM []byte
	now   func()
}

// hangingAPIServer serves a watch that sends nothing, over TLS and HTTP/2, behind a TCP proxy
// whose freeze stops forwarding bytes either way without closing anything, as a hung apiserver
// does. It returns the proxy's address.
func hangingAPIServer(t *testing.T) (string, freezer) {
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("%s %s over %s, want HTTP/2", r.Method, r.URL, r.Proto)
		}
		if r.URL.Query().Get("watch") != "true" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		conns  []net.Conn
		frozen = make(chan struct{})
		wg     sync.WaitGroup
	)
	// pipe forwards until the freeze, then holds what it read: the peer sees silence.
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-frozen:
				<-stop
				return
			default:
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, b)
			mu.Unlock()
			wg.Go(func() { pipe(b, c) })
			wg.Go(func() { pipe(c, b) })
		}
	})
	t.Cleanup(func() {
		close(stop)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
		srv.Close()
	})
	var once sync.Once
	return ln.Addr().String(), freezer{
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
		now:   func() { once.Do(func() { close(frozen) }) },
	}
}
