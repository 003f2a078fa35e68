package objects_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
)

func authCM(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objects.AuthenticationNamespace, Name: objects.AuthenticationConfigMap}, Data: data}
}

// TestRequestHeaderNamesFailClosed: whoever may write kube-system/extension-apiserver-
// authentication can make it say anything, while the apiservers keep reading their own
// flags. So a malformed or deleted key keeps the last good names, a never-good one publishes
// nothing, and no name read before ever stops being stripped from clients.
func TestRequestHeaderNamesFailClosed(t *testing.T) {
	var n memory.RequestHeaderNames
	step := func(what string, cm *corev1.ConfigMap, wantUsable bool, wantErr string) (use []string, group []string, strip []string) {
		t.Helper()
		next, h, usable, err := objects.ObserveRequestHeaderNames(n, cm)
		if usable != wantUsable || (err == nil) != (wantErr == "") || (err != nil && !strings.Contains(err.Error(), wantErr)) {
			t.Fatalf("%s: usable %v, error %v; want %v, %q", what, usable, err, wantUsable, wantErr)
		}
		n = next
		return h.User, h.Group, h.StripNames()
	}

	step("malformed, never good", authCM(map[string]string{"requestheader-group-headers": `["X-Group"`}), false, "no good configuration was read before")
	_, group, strip := step("good", authCM(map[string]string{"requestheader-username-headers": `["X-Remote-User"]`, "requestheader-group-headers": `["X-Group"]`}), true, "")
	if !slices.Equal(group, []string{"x-group"}) || !slices.Contains(strip, "x-group") || !slices.Contains(strip, "x-remote-group") {
		t.Fatalf("good: group %v, strip %v", group, strip)
	}
	for _, c := range []struct {
		what string
		data map[string]string
		err  string
	}{
		{"malformed group key", map[string]string{"requestheader-username-headers": `["X-Remote-User"]`,
			"requestheader-group-headers": `["X-Group"`},
			"is malformed: requestheader-group-headers is not a JSON list"},
		{"group key deleted", map[string]string{"requestheader-username-headers": `["X-Remote-User"]`}, "does not give [requestheader-group-headers"},
		{"a name that is no header", map[string]string{"requestheader-group-headers": `["X-Group\r\nX-Remote-User: admin"]`}, "is not an HTTP header name"},
		{"too many names", map[string]string{"requestheader-group-headers": `["` + strings.Repeat(`X-G", "`, 16) + `X-G17"]`}, "more than 16"},
		{"a very long name", map[string]string{"requestheader-group-headers": `["X-` + strings.Repeat("g", 200) + `"]`}, "at most 128 characters"},
	} {
		_, group, strip := step(c.what, authCM(c.data), true, c.err)
		if !slices.Equal(group, []string{"x-group"}) || !slices.Contains(strip, "x-group") {
			t.Errorf("%s: group %v, strip %v; want the last good x-group, stripped", c.what, group, strip)
		}
	}
	step("ConfigMap deleted", nil, true, "the ConfigMap is gone")

	// Prepended names (the apiservers merge their own back after them): written under every
	// name, and still stripped once they are gone again.
	user, _, _ := step("prepended",
		authCM(map[string]string{"requestheader-username-headers": `["X-Attacker-User","X-Remote-User"]`,
			"requestheader-group-headers": `["X-Attacker-Group","X-Group"]`}), true, "")
	if !slices.Equal(user, []string{"x-attacker-user", "x-remote-user"}) {
		t.Errorf("prepended: user names %v, want both", user)
	}
	user, group, strip = step("back to the apiservers' own", authCM(map[string]string{"requestheader-username-headers": `["X-Remote-User"]`, "requestheader-group-headers": `["X-Group"]`}), true, "")
	if !slices.Equal(user, []string{"x-remote-user"}) || !slices.Equal(group, []string{"x-group"}) {
		t.Errorf("names in use %v %v", user, group)
	}
	for _, name := range []string{"x-attacker-user", "x-attacker-group", "x-group", "x-remote-user", "x-remote-uid"} {
		if !slices.Contains(strip, name) {
			t.Errorf("%s is no longer stripped: %v", name, strip)
		}
	}

	// Bounded: however many names an attacker cycles through, what is kept stays bounded and
	// the names in use stay.
	for i := range 100 {
		step(fmt.Sprint("cycle ", i), authCM(map[string]string{"requestheader-username-headers": fmt.Sprintf(`["X-Cycle-%d","X-Remote-User"]`, i), "requestheader-group-headers": `["X-Group"]`}), true, "")
	}
	if len(n.Seen) > memory.MaxSeenRequestHeaderNames || !slices.Contains(n.Seen, "x-group") || !slices.Contains(n.Seen, "x-remote-user") {
		t.Errorf("seen %d names (max %d), in use kept: %v", len(n.Seen), memory.MaxSeenRequestHeaderNames, n.Seen)
	}
}
