package inventory

import (
	"bytes"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func apiService(name, uid, rv string, group any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": name, "uid": uid, "resourceVersion": rv, "labels": map[string]any{"l": "v"}},
		"spec":     map[string]any{"group": group, "version": "v1", "groupPriorityMinimum": int64(100)},
	}}
}

// TestAPIServicesConvertedOncePerVersion: a rebuild converts only the APIServices that
// changed since the last one (a burst of CRDs rebuilds hundreds of times), and a malformed
// one is logged once per version, not at every rebuild.
func TestAPIServicesConvertedOncePerVersion(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	skipped := func() int { return strings.Count(logs.String(), "APIService skipped") }
	mapID := func(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }

	good := apiService("v1.example.com", "u1", "1", "example.com")
	bad := apiService("v1.bad.example", "u2", "1", int64(7)) // spec.group is not a string
	out, prev := convertAPIServices([]any{good, bad}, convertedAPIServices{}, log)
	if len(out) != 1 || out[0].Spec.Group != "example.com" || out[0].Labels["l"] != "v" || skipped() != 1 {
		t.Fatalf("first conversion: %+v, %d skipped lines; want example.com only, bad logged once\n%s", out, skipped(), logs.String())
	}
	first := mapID(out[0].Labels)

	again, prev := convertAPIServices([]any{good, bad}, prev, log)
	if len(again) != 1 || mapID(again[0].Labels) != first {
		t.Errorf("unchanged objects: %+v; want the earlier conversion itself (the same labels map), not a new one", again)
	}
	if skipped() != 1 {
		t.Errorf("the malformed APIService was logged %d times over two rebuilds; want once\n%s", skipped(), logs.String())
	}

	// Listed again (an informer's relist): other objects of the same versions.
	relisted, prev := convertAPIServices([]any{good.DeepCopy(), bad.DeepCopy()}, prev, log)
	if len(relisted) != 1 || mapID(relisted[0].Labels) != first || skipped() != 1 {
		t.Errorf("relisted: %+v, %d skipped lines; want the earlier conversion itself, nothing logged again", relisted, skipped())
	}

	changed := apiService("v1.example.com", "u1", "2", "example.org")
	fixed := apiService("v1.bad.example", "u2", "2", "bad.example")
	out, prev = convertAPIServices([]any{changed, fixed}, prev, log)
	if len(out) != 2 || out[0].Spec.Group != "example.org" || out[1].Spec.Group != "bad.example" {
		t.Errorf("after both changed: %+v; want example.org and bad.example", out)
	}

	// Deleted and created again under the same name: another object, converted anew even
	// though its resourceVersion happens to match.
	recreated := apiService("v1.example.com", "u3", "2", "example.net")
	out, _ = convertAPIServices([]any{recreated}, prev, log)
	if len(out) != 1 || out[0].Spec.Group != "example.net" || out[0].UID != "u3" {
		t.Errorf("recreated: %+v; want example.net with uid u3", out)
	}
}
