package node

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodReport describes the pods of a namespace and their recent events, for a failure message.
func (n *Node) PodReport(ctx context.Context, ns string) string {
	client, err := n.Client()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s", p.Name, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "; %s ready=%t restarts=%d", c.Name, c.Ready, c.RestartCount)
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if t := c.LastTerminationState.Terminated; t != nil {
				fmt.Fprintf(&b, " last exit %d %s: %s", t.ExitCode, t.Reason, t.Message)
			}
		}
		b.WriteString("\n")
	}
	events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		items := events.Items
		if len(items) > 30 {
			items = items[len(items)-30:]
		}
		for _, e := range items {
			fmt.Fprintf(&b, "event %s %s/%s: %s: %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}
