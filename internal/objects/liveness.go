package objects

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// When an apiserver counts as live. Everything that decides it is in this file:
//
//   - Every apiserver renews its identity Lease every IdentityLeaseRenewInterval.
//   - It is live while its last renewTime is at most the liveness window old at Options.Now
//     (DefaultLivenessWindow; xds-server's --liveness-window, at least MinLivenessWindow).
//     The Lease's own duration (1 h) is not used.
//   - A renewTime more than MaxClockSkew in the future is not believed: the Lease is refused.
//   - Without Options.Now (translate, extproc's file source) every Lease is live.
//   - When our Lease watch goes quiet the Leases are judged as of the last renewal seen
//     (judgeAsOfLastRenewalSeen); the HTTP/2 health check below bounds that quiet.
//   - Leases go stale without an event: the watcher judges again every RejudgeInterval.

// IdentityLeaseRenewInterval is how often a live apiserver renews its identity Lease
// (upstream's default).
const IdentityLeaseRenewInterval = 10 * time.Second

// DefaultLivenessWindow is how stale a Lease renewal may be before its apiserver counts as
// dead: three renewals, so a crashed apiserver leaves the routes within seconds.
const DefaultLivenessWindow = 30 * time.Second

// MinLivenessWindow is the shortest window xds-server accepts: one renewal and a second.
const MinLivenessWindow = IdentityLeaseRenewInterval + time.Second

// MaxClockSkew is how far in the future a Lease's renewTime may be, by this process's clock,
// before the Lease is rejected: a renewTime in the future would count as alive for ever.
const MaxClockSkew = 10 * time.Second

// HTTP2ReadIdleTimeout and HTTP2PingTimeout are the HTTP/2 health check of xds-server's
// connections to the apiserver (inventory.RESTOptions). Every watch shares one connection;
// if its apiserver hangs with the connection open, client-go's defaults (30 s, 15 s) leave
// the Lease view stuck for up to 45 s. A renewal arrives at least every 10 s, so a ping after
// 10 s of silence costs nothing and finds the dead connection within 15 s.
const (
	HTTP2ReadIdleTimeout = 10 * time.Second
	HTTP2PingTimeout     = 5 * time.Second
)

// RejudgeInterval is how often a watcher judges the Leases again without an event, well
// within the window.
func RejudgeInterval(window time.Duration) time.Duration {
	return max(window/6, 500*time.Millisecond)
}

// livenessWindow is opts.LivenessWindow, or DefaultLivenessWindow when zero.
func (o Options) livenessWindow() time.Duration {
	if o.LivenessWindow == 0 {
		return DefaultLivenessWindow
	}
	return o.LivenessWindow
}

// aliveByOwnRenewal is one Lease's liveness by its own renewTime (none: not alive).
func aliveByOwnRenewal(renewTime *metav1.MicroTime, opts Options) bool {
	switch {
	case opts.Now.IsZero():
		return true
	case renewTime != nil:
		return opts.Now.Sub(renewTime.Time) <= opts.livenessWindow()
	}
	return false
}

// identityLeaseRenewGap is the longest a watch sees between two renewals of one live
// apiserver: the interval, its 4 % jitter, and the write's and the watch's latency on a busy
// control plane, with room to spare.
const identityLeaseRenewGap = IdentityLeaseRenewInterval * 3 / 2

// judgeAsOfLastRenewalSeen handles a Lease watch that went quiet. While it works, some live
// apiserver's renewal arrives at least every IdentityLeaseRenewInterval; when none has for
// longer, our watch is more likely stuck (its connection to a hung apiserver not yet found
// dead: up to HTTP2ReadIdleTimeout + HTTP2PingTimeout, 45 s with client-go's defaults)
// than the control plane dead. Judged
// against the clock, the apiservers would then fall out of the window one by one, in the
// order of their last renewals, and Envoy would be told that only the last one to renew
// (perhaps the hung one) can serve. So Leases are judged as of the newest renewal seen plus
// window - identityLeaseRenewGap: every apiserver that renewed in the last gap before the
// watch went quiet stays alive, and Envoy's health checks decide the rest. A
// forged future renewal can only move that time towards now, i.e. to the plain judgement;
// and judging as of a time before now only ever keeps more apiservers alive.
func judgeAsOfLastRenewalSeen(servers []topology.APIServer, renewed []time.Time, now time.Time, window time.Duration) error {
	var newest time.Time
	for _, rt := range renewed {
		if rt.After(newest) {
			newest = rt
		}
	}
	if now.IsZero() || len(servers) == 0 {
		return nil
	}
	if newest.IsZero() {
		// No renewal at all to judge by (a Lease without renewTime is never alive by itself):
		// rather than tell every Envoy that nothing can serve anything, health checks decide.
		for i := range servers {
			servers[i].Alive = true
		}
		return fmt.Errorf("no identity Lease carries a renewTime: all %d apiservers count as alive, and Envoy's health checks decide", len(servers))
	}
	asOf := newest.Add(max(window-identityLeaseRenewGap, 0))
	if !asOf.Before(now) {
		return nil
	}
	for i, rt := range renewed {
		if !rt.IsZero() {
			servers[i].Alive = asOf.Sub(rt) <= window
		}
	}
	// A short window makes asOf lag now in normal operation too (judging only ever keeps
	// more apiservers alive): said only once the quiet is clearly not renewals' spacing.
	if now.Sub(newest) <= 2*IdentityLeaseRenewInterval {
		return nil
	}
	return fmt.Errorf("no identity Lease renewal seen for %s (apiservers renew every %s): our Lease watch is more "+
		"likely stuck than the apiservers dead, so the Leases are judged as of %s, and Envoy's health checks decide",
		now.Sub(newest).Round(time.Second), IdentityLeaseRenewInterval, asOf.UTC().Format(time.RFC3339))
}
