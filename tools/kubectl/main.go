// Command kubectl is upstream's kubectl, built from the published k8s.io/kubectl module for
// the demo and the end-to-end tests (no release download is reachable from our machines).
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
