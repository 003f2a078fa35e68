package memory_test

import (
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/memory"
)

func TestDecodeMemoryMalformed(t *testing.T) {
	for name, value := range map[string]string{
		"not json":        `{"lastSeen":`,
		"no lastSeen":     `{"served":{"batch/v1":"jobs"}}`,
		"bad gv":          `{"lastSeen":"2026-01-02T03:04:05Z","served":{"a/b/c":"jobs"}}`,
		"bad resource":    `{"lastSeen":"2026-01-02T03:04:05Z","served":{"batch/v1":"jobs/status/x"}}`,
		"wrong JSON type": `{"lastSeen":"2026-01-02T03:04:05Z","served":["jobs"]}`,
		"bad address":     `{"lastSeen":"2026-01-02T03:04:05Z","address":"10.0.0.1","served":{"v1":"pods"}}`,
	} {
		_, err := memory.Decode(map[string]string{"apiserver-good": `{"lastSeen":"2026-01-02T03:04:05Z","served":{"v1":"pods"}}`, "apiserver-x": value})
		if err == nil {
			t.Errorf("%s: decoded without error", name)
		} else if want := `"apiserver-x"`; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not name the entry %s", name, err, want)
		}
	}
}
