package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestFreePort: ports are distinct, outside the kernel's ephemeral range, never given to a
// listener on :0, and another process (this test binary run again) can claim none of the
// ones this process holds.
func TestFreePort(t *testing.T) {
	if held := os.Getenv("KUBE_MVP_FREEPORT_CHILD"); held != "" {
		// The parent's ports, asked for by number: each must be refused.
		dir, err := portLockDir()
		if err != nil {
			t.Fatal(err)
		}
		ports.Lock()
		defer ports.Unlock()
		for _, s := range strings.Split(held, ",") {
			p, _ := strconv.Atoi(s)
			if ok, err := claimLocked(dir, p); err != nil || ok {
				fmt.Printf("claimed %d (%v)\n", p, err)
			} else {
				fmt.Printf("refused %d\n", p)
			}
		}
		return
	}
	mine := map[int]bool{}
	for range 100 {
		p := MustFreePort(t)
		if mine[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		if p < portRangeFloor || p >= ephemeralLow() {
			t.Fatalf("port %d outside %d-%d", p, portRangeFloor, ephemeralLow()-1)
		}
		mine[p] = true
	}
	// A listener on :0 never gets one of them (the race that once took extproc's port).
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if mine[p] {
			t.Fatalf("the kernel handed out reserved port %d", p)
		}
	}
	var list []string
	for p := range mine {
		list = append(list, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePort$")
	cmd.Env = append(os.Environ(), "KUBE_MVP_FREEPORT_CHILD="+strings.Join(list, ","))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "refused "); n != len(mine) || strings.Contains(string(out), "claimed") {
		t.Fatalf("another process refused %d of this one's %d ports, want all:\n%s", n, len(mine), out)
	}
}
