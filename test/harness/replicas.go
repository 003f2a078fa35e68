package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// XDSServer is one xds-server process of a deployment (a replica of the chart's Deployment).
type XDSServer struct {
	Bin     string // its binary
	Address string // gRPC (ADS and the table stream), host:port
	Admin   string // http://host:port
	proc    *process
}

// Log is the path of its log file.
func (x *XDSServer) Log() string { return x.proc.logPath }

// StartXDSServer starts another xds-server with bin (empty: the first one's) and Start's
// flags, on addresses of its own, and waits for its /readyz: a second replica, or the next
// version of the Deployment's pod. Envoy and extproc do not use it until a test moves them
// (Options.XDSSwitch).
func (k *KubeMVP) StartXDSServer(ctx context.Context, bin string) (*XDSServer, error) {
	if bin == "" {
		bin = k.xdsArgs[0]
	}
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	args := slices.Clone(k.xdsArgs[1:])
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--xds-address":
			args[i+1] = addrs[0]
		case "--admin-address":
			args[i+1] = addrs[1]
		}
	}
	logPath := filepath.Join(filepath.Dir(k.xdsLog), fmt.Sprintf("xds-server-%d.log", len(k.XDSServers)))
	p, err := startProcess(logPath, bin, args...)
	if err != nil {
		return nil, err
	}
	k.procs = append(k.procs, p)
	x := &XDSServer{Bin: bin, Address: addrs[0], Admin: "http://" + addrs[1], proc: p}
	k.XDSServers = append(k.XDSServers, x)
	if err := waitOK(ctx, x.Admin+"/readyz", 2*time.Minute); err != nil {
		return nil, fmt.Errorf("xds-server %s never became ready: %w\n%s", bin, err, tail(logPath, 4096))
	}
	return x, nil
}

// StopXDSServer stops one xds-server (SIGTERM, then SIGKILL after 15 s), as a rollout
// removes an old pod.
func (k *KubeMVP) StopXDSServer(x *XDSServer) { x.proc.stop(15 * time.Second) }

// ReplaceExtproc stops extproc and starts bin (empty: the same binary) in its place with the
// same flags (its previous log kept as extproc.log.N), and waits for its /readyz: the Envoy
// pod's extproc container of another version. The data plane keeps its configuration and
// reconnects to the new process's socket.
func (k *KubeMVP) ReplaceExtproc(ctx context.Context, bin string) error {
	i := slices.IndexFunc(k.procs, func(p *process) bool { return filepath.Base(p.logPath) == "extproc.log" })
	if i < 0 {
		return fmt.Errorf("no extproc")
	}
	if bin == "" {
		bin = k.extArgs[0]
	}
	old := k.procs[i]
	old.stop(15 * time.Second)
	if err := os.Rename(old.logPath, fmt.Sprintf("%s.%d", old.logPath, time.Now().UnixNano())); err != nil {
		return err
	}
	p, err := startProcess(old.logPath, bin, k.extArgs[1:]...)
	if err != nil {
		return err
	}
	k.procs[i] = p
	k.extArgs[0] = bin
	return waitOK(ctx, k.ExtprocAdmin+"/readyz", 2*time.Minute)
}
