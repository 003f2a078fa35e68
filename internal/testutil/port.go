package testutil

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Ports for processes the tests start (apiservers, etcd, xds-server, extproc) used to come
// from "listen on :0, note the port, close": the kernel hands a closed port out again, and
// once our own round-robin balancer, started between the note and the child's bind, got the
// port extproc was about to take (a red CI). FreePort removes both races:
//   - the ports lie below the kernel's ephemeral range, so nothing listening on :0 and no
//     outgoing connection is ever given one of them;
//   - each port is claimed with an flock on a file named after it, held until the test
//     process exits, so two test processes (go test runs packages in parallel) never hand out
//     the same one, and one process never hands it out twice.
var ports = struct {
	sync.Mutex
	held map[int]*os.File // the lock files: kept open, so the locks last as long as the process
}{held: map[int]*os.File{}}

// portRangeFloor is the lowest port handed out; the highest is just below the ephemeral range.
const portRangeFloor = 20000

// FreePort returns a free TCP port on 127.0.0.1 that no other caller of FreePort, in this or
// another process, gets while this process runs.
func FreePort() (int, error) {
	low, high := portRangeFloor, ephemeralLow()-1
	if high-low < 1000 {
		return 0, fmt.Errorf("the kernel's ephemeral ports start at %d: no room below them for test ports (from %d)", high+1, low)
	}
	dir, err := portLockDir()
	if err != nil {
		return 0, err
	}
	ports.Lock()
	defer ports.Unlock()
	span := high - low + 1
	start := rand.IntN(span)
	for i := range span {
		port := low + (start+i)%span
		ok, err := claimLocked(dir, port)
		if err != nil {
			return 0, err
		}
		if ok {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free test port in %d-%d", low, high)
}

// claimLocked takes port for this process if no process holds it and nothing listens there.
// ports must be locked.
func claimLocked(dir string, port int) (bool, error) {
	if ports.held[port] != nil {
		return false, nil
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // another test process holds it
		}
		return false, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	// Something that is not a test (or a test of an older checkout) may listen there.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		f.Close()
		return false, nil
	}
	l.Close()
	ports.held[port] = f
	return true, nil
}

// MustFreePort is FreePort for a test: a failure ends it.
func MustFreePort(t testing.TB) int {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// FreeAddr is MustFreePort as "127.0.0.1:PORT".
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(MustFreePort(t)))
}

func portLockDir() (string, error) {
	dir := filepath.Join(os.TempDir(), "kube-mvp-test-ports")
	return dir, os.MkdirAll(dir, 0o777)
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's default when the
// file cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}
