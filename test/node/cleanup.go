package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// lock takes the machine's node lock, waiting for another node to finish.
func lock(ctx context.Context, log io.Writer) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	waited := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !waited {
			fmt.Fprintf(log, "node: waiting for another test node to finish (%s)\n", lockPath)
			waited = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// podCgroups is the kubelet's cgroup tree (cgroupfs driver, default cgroup root) in the pids
// hierarchy: every container process of the node is in it.
const podCgroups = "/sys/fs/cgroup/pids/kubepods"

// killPods kills every process in the node's pod cgroups: containers outlive their shims.
func killPods(log io.Writer) {
	for range 3 {
		pids := cgroupProcs(podCgroups)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(log, "node: processes left in %s: %v\n", podCgroups, cgroupProcs(podCgroups))
}

func cgroupProcs(root string) []int {
	var pids []int
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// clearLeftovers undoes whatever a node (this one, or one of a run that was killed) left:
// processes in the node's namespace and pod cgroups, mounts under the node's directory and
// the pods' network namespaces, the kubelet's cgroups, the namespace and veth, the files.
func clearLeftovers(ctx context.Context, log io.Writer) {
	if b, err := os.ReadFile("/run/netns/" + netnsName); err == nil || len(b) > 0 || !os.IsNotExist(err) {
		if out, err := runOut(ctx, "ip", "netns", "pids", netnsName); err == nil {
			for _, f := range strings.Fields(out) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}
	killPods(log)
	time.Sleep(100 * time.Millisecond)
	unmountUnder(baseDir + "/")
	// containerd names the pods' network namespaces cni-<uuid> under /run/netns.
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "cni-") {
				run(ctx, "ip", "netns", "del", e.Name())
			}
		}
	}
	removeCgroups("kubepods")
	run(ctx, "ip", "link", "del", hostLinkName)
	run(ctx, "ip", "netns", "del", netnsName)
	if err := os.RemoveAll(filepath.Join(baseDir, "run")); err != nil {
		fmt.Fprintf(log, "node: removing %s: %v\n", baseDir, err)
	}
}

// unmountUnder unmounts every mount point below prefix, deepest first.
func unmountUnder(prefix string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], prefix) {
			points = append(points, unescapeMount(fields[4]))
		}
	}
	f.Close()
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeCgroups removes the cgroup name (and its children, deepest first) from every v1
// hierarchy.
func removeCgroups(name string) {
	hierarchies, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hierarchies {
		root := filepath.Join("/sys/fs/cgroup", h.Name(), name)
		var dirs []string
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			syscall.Rmdir(d)
		}
	}
}

func runOut(ctx context.Context, name string, args ...string) (string, error) {
	out, err := execCommand(ctx, name, args...).Output()
	return string(out), err
}
