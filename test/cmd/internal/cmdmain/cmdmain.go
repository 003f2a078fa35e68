// Package cmdmain is the main function of the test commands that run until interrupted.
package cmdmain

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Main runs run with the command line's arguments, under a context that SIGINT and SIGTERM
// cancel; when run fails, it prints the error after name and exits with code.
func Main(name string, code int, run func(ctx context.Context, args []string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(code)
	}
}
