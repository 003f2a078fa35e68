package tablestream

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Why a table update failed, as Follow reports it to OnReject.
const (
	// ReasonTooLarge: the table exceeds the size limit (xds-server refused to send it, or it is
	// over this client's limit).
	ReasonTooLarge = "too_large"
	// ReasonMalformed: the table arrived but cannot be read (broken chunks, bad gzip, a set
	// index out of range, a resource listed twice, ...).
	ReasonMalformed = "malformed"
	// ReasonUnsupportedFormat: the table, or the table stream itself, is of a format this
	// build does not know: xds-server and extproc are of incompatible versions.
	ReasonUnsupportedFormat = "unsupported_format"
	// ReasonStream: the stream could not be opened or broke (xds-server down, restarting or
	// unreachable).
	ReasonStream = "stream"
)

// Reasons lists every reason OnReject is given.
var Reasons = []string{ReasonTooLarge, ReasonMalformed, ReasonUnsupportedFormat, ReasonStream}

// FollowOptions configure Follow; the zero value has the defaults.
type FollowOptions struct {
	// Log receives why updates failed and what to do; nil means slog.Default().
	Log *slog.Logger
	// OnReject, when set, is called whenever a table update fails: a table arrived that
	// cannot be used, or the stream failed. The caller keeps the last table it was given;
	// Follow has logged why. reason is one of Reasons.
	OnReject func(reason string, err error)
	// MaxTableSize is the largest table Follow accepts; 0 means MaxTableSize (tests lower it).
	MaxTableSize int
}

type follower struct {
	log      *slog.Logger
	onReject func(reason string, err error)
	maxSize  int
}

// Follow is the extproc side: it subscribes to the table over conn until ctx ends, calling
// apply with every table received. A table it cannot use (too large, malformed, of an
// unknown format) is not applied: Follow logs why, calls OnReject and waits for
// the next. When the stream fails it does the same, waits (exponential backoff up to 10 s)
// and reconnects; in between, the caller keeps using the last table it was given.
func Follow(ctx context.Context, conn grpc.ClientConnInterface, clientID string, apply func(*plan.Table, string), opts FollowOptions) {
	fl := &follower{log: opts.Log, maxSize: opts.MaxTableSize, onReject: opts.OnReject}
	if fl.log == nil {
		fl.log = slog.Default()
	}
	if fl.maxSize <= 0 {
		fl.maxSize = MaxTableSize
	}
	if fl.onReject == nil {
		fl.onReject = func(string, error) {}
	}
	client := tablev1.NewTableServiceClient(conn)
	const initialBackoff = 100 * time.Millisecond
	backoff := initialBackoff
	for ctx.Err() == nil {
		stream, err := client.Subscribe(ctx, &tablev1.SubscribeRequest{ClientId: clientID}, grpc.MaxCallRecvMsgSize(maxChunkMessage))
		a := &assembler{limit: fl.maxSize}
		for err == nil {
			var c *tablev1.TableChunk
			if c, err = stream.Recv(); err != nil {
				break
			}
			tb, rejected := a.add(c)
			if tb == nil && rejected == nil {
				continue
			}
			backoff = initialBackoff // a whole table arrived: the stream works
			var t *plan.Table
			if rejected == nil {
				t, rejected = FromProto(tb)
			}
			if rejected != nil {
				fl.reject(rejected)
				continue
			}
			apply(t, tb.GetVersion())
		}
		if ctx.Err() != nil {
			return
		}
		fl.reject(streamError{err: err, retryIn: backoff})
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// streamError is the error that ended a table stream.
type streamError struct {
	err     error
	retryIn time.Duration
}

func (e streamError) Error() string { return "table stream: " + e.err.Error() }
func (e streamError) Unwrap() error { return e.err }

// reject logs why a table update failed and what to do about it, and reports it.
func (fl *follower) reject(err error) {
	reason, msg := ReasonMalformed, ""
	var se streamError
	switch isStream := errors.As(err, &se); {
	case isStream && status.Code(se.err) == codes.ResourceExhausted:
		reason = ReasonTooLarge
		msg = "routing table too large to receive; keeping the previous one. Fix: " +
			"fewer or smaller CRDs (the merged discovery dominates the table), or a " +
			"build with a higher table.MaxTableSize on both xds-server and extproc"
	case isStream && status.Code(se.err) == codes.Unimplemented:
		reason = ReasonUnsupportedFormat
		msg = "xds-server does not serve this extproc's table stream (kubemvp.table.v1.TableService/Subscribe); " +
			"keeping the last table and reconnecting. Fix: run xds-server and extproc of the same kube-mvp version"
	case isStream:
		reason = ReasonStream
		msg = "routing table stream lost; keeping the last table and reconnecting. Fix: check that xds-server is running and reachable (--source)"
	case errors.Is(err, ErrTooLarge):
		reason = ReasonTooLarge
		msg = "routing table over this extproc's size limit; keeping the previous one. Fix: fewer or smaller CRDs, or the same table.MaxTableSize in xds-server and extproc"
	case errors.Is(err, ErrUnsupportedFormat):
		reason = ReasonUnsupportedFormat
		msg = "routing table of a format this extproc cannot read; keeping the previous one. Fix: run xds-server and extproc of the same kube-mvp version"
	default:
		msg = "routing table cannot be read; keeping the previous one. Fix: run xds-server and extproc of the same kube-mvp version; if they are, this is a bug: report the error"
	}
	if reason == ReasonStream {
		fl.log.Warn(msg, "reason", reason, "error", err, "retry_in", se.retryIn)
	} else {
		fl.log.Error(msg, "reason", reason, "error", err)
	}
	fl.onReject(reason, err)
}
