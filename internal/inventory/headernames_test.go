package inventory

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
)

func authentication(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objects.AuthenticationNamespace, Name: objects.AuthenticationConfigMap}, Data: data}
}

// lookNames is one rebuild's part about the request-header names and the memory: the names
// the build reads auth against, and whether it publishes and the names it strips.
func (r *replica) lookNames(c cluster, auth *corev1.ConfigMap) (usable bool, strip []string, err error) {
	r.t.Helper()
	r.sync()
	before, err := r.w.learnHeaderNames(auth, c.now)
	opts := r.w.opts.Options
	opts.Now = c.now
	r.w.remember(context.Background(), c.objects(), opts)
	r.waitForWrite()
	_, use, usable, _ := objects.ObserveRequestHeaderNames(before, auth) // as objects.Build reads it
	return usable, use.StripNames(), err
}

// persistedHeaderNames are the names the server's ConfigMap keeps, checked.
func persistedHeaderNames(t *testing.T, s *cmServer, creds *cptls.Credentials, now time.Time) memory.RequestHeaderNames {
	t.Helper()
	_, pool := creds.Current()
	n, err := memory.ReadRequestHeaderNames(s.data()[memory.RequestHeaderNamesKey], memory.Trust{Roots: pool, Now: now})
	if err != nil {
		t.Fatalf("the ConfigMap's request-header names: %v", err)
	}
	return n
}

var customGroup = authentication(map[string]string{"requestheader-group-headers": `["X-Custom-Group"]`, "requestheader-username-headers": `["X-Remote-User"]`})

// TestHeaderNamesKeptAcrossRestarts: the names read before and the last good configuration
// are in the memory ConfigMap, so that an xds-server restarted after an attacker deleted a
// key, renamed a header or made the ConfigMap malformed still strips (and uses) the names
// the apiservers read; with nothing good ever read and nothing persisted it stays unready.
func TestHeaderNamesKeptAcrossRestarts(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	now := time.Now()
	c := cluster{now: now, live: map[string]string{idA: "cp-a"}}
	first := newReplica(t, server, creds)
	if usable, strip, err := first.lookNames(c, customGroup); !usable || err != nil || !slices.Contains(strip, "x-custom-group") {
		t.Fatalf("first read: usable %v, %v, strip %v", usable, err, strip)
	}
	p := persistedHeaderNames(t, server, creds, now)
	if !slices.Contains(p.Seen, "x-custom-group") || p.Good == nil || !slices.Equal(p.Good.Group, []string{"x-custom-group"}) {
		t.Fatalf("persisted %+v", p)
	}
	if got := ids(persisted(t, server, creds, now)); got != ids(memory.Memory{idA: {}}) {
		t.Fatalf("the memory beside the names: %s", got)
	}

	for _, attack := range []struct {
		what string
		auth *corev1.ConfigMap
		err  bool
	}{
		{"the group key deleted", authentication(map[string]string{"requestheader-username-headers": `["X-Remote-User"]`}), true},
		{"the ConfigMap deleted", nil, true},
		{"malformed", authentication(map[string]string{"requestheader-group-headers": `{`}), true},
		{"the group header renamed", authentication(map[string]string{"requestheader-group-headers": `["X-Evil-Group"]`}), false},
	} {
		c.now = c.now.Add(time.Second)
		restarted := newReplica(t, server, creds)
		usable, strip, err := restarted.lookNames(c, attack.auth)
		if !usable || !slices.Contains(strip, "x-custom-group") || (err != nil) != attack.err {
			t.Errorf("%s, then a restart: usable %v, strips x-custom-group %v, error %v", attack.what, usable, slices.Contains(strip, "x-custom-group"), err)
		}
		if restarted.w.headerNames.Good == nil {
			t.Errorf("%s, then a restart: no good configuration", attack.what)
		}
	}
	// The rename was a good configuration: the next restart uses it, and still strips the
	// custom name.
	c.now = c.now.Add(time.Second)
	restarted := newReplica(t, server, creds)
	usable, strip, _ := restarted.lookNames(c, authentication(map[string]string{"requestheader-group-headers": `{`}))
	if !usable || !slices.Contains(strip, "x-custom-group") || !slices.Contains(strip, "x-evil-group") || !slices.Equal(restarted.w.headerNames.Good.Group, []string{"x-evil-group"}) {
		t.Errorf("after the rename, a restart: usable %v, strip %v, good %+v", usable, strip, restarted.w.headerNames.Good)
	}

	// Never good, nothing persisted: unready.
	if usable, _, _ := newReplica(t, &cmServer{}, creds).lookNames(c, authentication(map[string]string{"requestheader-group-headers": `{`})); usable {
		t.Error("never good, nothing persisted: usable")
	}
}

// TestHeaderNamesForgedOrRemoved: a value xds-server did not sign (or signed for an entry)
// is ignored, logged and counted once per version, and replaced; a deleted key is written
// again; the names read before survive both.
func TestHeaderNamesForgedOrRemoved(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	now := time.Now()
	c := cluster{now: now, live: map[string]string{idA: "cp-a"}}
	r := newReplica(t, server, creds)
	r.lookNames(c, customGroup)

	// An attacker rewrites the value without x-custom-group (keeping the signature).
	server.edit(func(d map[string]string) map[string]string {
		var v map[string]any
		_ = json.Unmarshal([]byte(d[memory.RequestHeaderNamesKey]), &v)
		v["seen"] = slices.DeleteFunc(v["seen"].([]any), func(s any) bool { return s == "x-custom-group" })
		b, _ := json.Marshal(v)
		d[memory.RequestHeaderNamesKey] = string(b)
		return d
	})
	for range 3 {
		c.now = c.now.Add(time.Second)
		r.lookNames(c, customGroup)
	}
	if n := strings.Count(r.logs.String(), "request-header names in the memory ConfigMap rejected"); n != 1 || strings.Join(r.rejected, " ") != memory.RejectSignature {
		t.Errorf("want one log line and one rejection (signature), got %v:\n%s", r.rejected, r.logs.String())
	}
	if p := persistedHeaderNames(t, server, creds, c.now); !slices.Contains(p.Seen, "x-custom-group") {
		t.Errorf("the forged value is not replaced: %+v", p)
	}

	// A memory entry's signature moved onto the names: rejected too.
	server.edit(func(d map[string]string) map[string]string {
		var v, e map[string]any
		_ = json.Unmarshal([]byte(d[memory.RequestHeaderNamesKey]), &v)
		_ = json.Unmarshal([]byte(d[idA]), &e)
		v["signedAt"], v["signature"] = e["signedAt"], e["signature"]
		b, _ := json.Marshal(v)
		d[memory.RequestHeaderNamesKey] = string(b)
		return d
	})
	c.now = c.now.Add(time.Second)
	r.lookNames(c, customGroup)
	if strings.Join(r.rejected, " ") != memory.RejectSignature+" "+memory.RejectSignature {
		t.Errorf("rejections %v", r.rejected)
	}

	// The key deleted: written again, and a restart still knows the names.
	server.edit(func(d map[string]string) map[string]string { delete(d, memory.RequestHeaderNamesKey); return d })
	c.now = c.now.Add(time.Second)
	r.lookNames(c, customGroup)
	if p := persistedHeaderNames(t, server, creds, c.now); !slices.Contains(p.Seen, "x-custom-group") {
		t.Errorf("the deleted key is not written again: %+v", p)
	}
	if _, strip, _ := newReplica(t, server, creds).lookNames(c, nil); !slices.Contains(strip, "x-custom-group") {
		t.Errorf("a restart after the key was written again strips %v", strip)
	}
	if len(r.rejected) != 2 {
		t.Errorf("a deleted key is no rejection: %v", r.rejected)
	}
}

// TestHeaderNamesTwoReplicas: two replicas writing one ConfigMap converge on the union of
// the names they read and stop writing.
func TestHeaderNamesTwoReplicas(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	now := time.Now()
	c := cluster{now: now, live: map[string]string{idA: "cp-a"}}
	one, two := newReplica(t, server, creds), newReplica(t, server, creds)
	one.lookNames(c, customGroup)
	c.now = c.now.Add(time.Second)
	other := authentication(map[string]string{"requestheader-uid-headers": `["X-Other-Uid"]`})
	two.lookNames(c, other) // its informer shows one's write, and the ConfigMap changed since
	for range 3 {
		c.now = c.now.Add(time.Second)
		one.lookNames(c, other)
		two.lookNames(c, other)
	}
	p := persistedHeaderNames(t, server, creds, c.now)
	for _, s := range []string{"x-custom-group", "x-other-uid"} {
		if !slices.Contains(p.Seen, s) || !slices.Contains(one.w.headerNames.Seen, s) || !slices.Contains(two.w.headerNames.Seen, s) {
			t.Errorf("%s missing: persisted %v, one %v, two %v", s, p.Seen, one.w.headerNames.Seen, two.w.headerNames.Seen)
		}
	}
	version := server.data()
	c.now = c.now.Add(time.Second)
	one.lookNames(c, other)
	two.lookNames(c, other)
	if got := server.data(); got[memory.RequestHeaderNamesKey] != version[memory.RequestHeaderNamesKey] {
		t.Error("the replicas still write the names when nothing changed")
	}
}

// TestHeaderNamesWithoutConfigMap: without a memory ConfigMap the names are kept in the
// process only: nothing is written, and a new process knows nothing.
func TestHeaderNamesWithoutConfigMap(t *testing.T) {
	w := &Watcher{opts: WatchOptions{Log: slog.New(slog.DiscardHandler)}}
	now := time.Now()
	if _, err := w.learnHeaderNames(customGroup, now); err != nil {
		t.Fatal(err)
	}
	w.remember(context.Background(), cluster{now: now}.objects(), objects.Options{Now: now})
	if !slices.Contains(w.headerNames.Seen, "x-custom-group") {
		t.Errorf("in process: %+v", w.headerNames)
	}
	fresh := &Watcher{opts: WatchOptions{Log: slog.New(slog.DiscardHandler)}}
	before, _ := fresh.learnHeaderNames(authentication(map[string]string{"requestheader-group-headers": `{`}), now)
	if _, _, usable, _ := objects.ObserveRequestHeaderNames(before, authentication(map[string]string{"requestheader-group-headers": `{`})); usable {
		t.Error("a new process without a ConfigMap uses names it never read")
	}
}
