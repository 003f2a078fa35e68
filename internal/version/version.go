// Package version is the build's version stamp. `make build` and `make images` set Version and
// Commit with the linker:
//
//	go build -ldflags "-X github.com/kube-mvp/kube-mvp/internal/version.Version=0.1.0 \
//	    -X github.com/kube-mvp/kube-mvp/internal/version.Commit=abc1234" ./cmd/...
//
// A plain `go build` leaves them "dev" and "unknown"; `go install ...@v0.1.0` reports the module
// version it was installed at.
package version

import (
	"fmt"
	"runtime/debug"
)

// Path is the import path the linker flags name (-X Path.Version=...).
const Path = "github.com/kube-mvp/kube-mvp/internal/version"

// Set by the linker (-X); the defaults are what an unstamped build reports.
var (
	Version = "dev"
	Commit  = "unknown"
)

// String is the one-line version a program prints for --version, e.g.
// "xds-server 0.1.0 (commit abc1234)".
func String(program string) string {
	bi, _ := debug.ReadBuildInfo()
	return format(program, resolve(Version, bi), Commit)
}

func format(program, version, commit string) string {
	return fmt.Sprintf("%s %s (commit %s)", program, version, commit)
}

// resolve falls back from an unstamped "dev" to the module version recorded in the binary when
// it was built with `go install module@version` (a local build records "(devel)" or nothing).
func resolve(version string, bi *debug.BuildInfo) string {
	if version != "dev" || bi == nil {
		return version
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return version
}
