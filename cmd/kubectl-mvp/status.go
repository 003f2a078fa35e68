package main

import "io"

var statusCommand = &command{
	name:    "status",
	summary: "what the running xds-server and extproc see",
	usage:   func() string { return "usage: kubectl mvp status --xds-admin URL [--extproc-admin URL]\n" },
	run:     func(args []string, stdout, stderr io.Writer) int { return 2 },
}
