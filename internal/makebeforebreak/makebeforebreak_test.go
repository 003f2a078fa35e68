package makebeforebreak

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string // substrings of the error; none: valid
	}{
		{name: "defaults of serve", opts: Options{TableDelay: 2 * time.Second, Linger: 30 * time.Second}},
		{name: "all zero", opts: Options{}},
		{name: "linger 0 with a delay", opts: Options{TableDelay: 2 * time.Second}},
		{name: "linger without a delay", opts: Options{Linger: time.Second}},
		{name: "linger shorter than the delay", opts: Options{TableDelay: 5 * time.Second, Linger: 3 * time.Second},
			want: []string{"cluster linger 3s must be longer than routing table delay 5s"}},
		{name: "linger equal to the delay", opts: Options{TableDelay: 2 * time.Second, Linger: 2 * time.Second},
			want: []string{"cluster linger 2s must be longer than routing table delay 2s"}},
		{name: "negative", opts: Options{TableDelay: -time.Second, Linger: -time.Second},
			want: []string{"routing table delay -1s is negative", "cluster linger -1s is negative"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", tc.opts)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestJoinDelay(t *testing.T) {
	if got := (Options{TableDelay: 2 * time.Second}).JoinDelay(); got != 4*time.Second {
		t.Errorf("JoinDelay %s, want 4s", got)
	}
}
