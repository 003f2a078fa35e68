// Command pause is the pod sandbox's process in the test cluster's pause image (see
// test/node/images.Pause): it holds the pod's namespaces open, does nothing else, and exits 0
// on SIGTERM or SIGINT. As PID 1 of the pod's PID namespace (shareProcessNamespace) it also
// reaps the orphans re-parented to it, so they don't linger as zombies.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: pause (takes no arguments; exits 0 on SIGTERM or SIGINT)")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap() // children that ended before the handler was in place
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every child that has ended. Signals coalesce, so one SIGCHLD may stand for
// many children: wait until none is left to collect.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil { // 0: children left, none ended; ECHILD: no children
			return
		}
	}
}
