package dataplane

import (
	"net/http"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"golang.org/x/net/http2"
)

// HTTP/2 flow control from http2_protocol_options.

// h2Flow is the flow control of an HTTP/2 connection, from http2_protocol_options:
// max_concurrent_streams, initial_stream_window_size, initial_connection_window_size.
type h2Flow struct {
	maxStreams   uint32
	streamWindow uint32
	connWindow   uint32
}

// Envoy's defaults since 1.36 (api/envoy/config/core/v3/protocol.proto; changelog 1.36.0,
// "safe_http2_options"), the oldest Envoy kube-mvp supports.
const (
	envoyH2DefaultMaxStreams   = 1024
	envoyH2DefaultStreamWindow = 16 << 20
	envoyH2DefaultConnWindow   = 24 << 20
)

// compileH2Flow reads the options' stream limit and windows, Envoy's defaults where unset
// (o may be nil). Their ranges (1.., 65535..2^31-1) are the proto's validation rules,
// which every resource passed already.
func compileH2Flow(o *corev3.Http2ProtocolOptions) h2Flow {
	f := h2Flow{maxStreams: envoyH2DefaultMaxStreams, streamWindow: envoyH2DefaultStreamWindow, connWindow: envoyH2DefaultConnWindow}
	if v := o.GetMaxConcurrentStreams(); v != nil {
		f.maxStreams = v.GetValue()
	}
	if v := o.GetInitialStreamWindowSize(); v != nil {
		f.streamWindow = v.GetValue()
	}
	if v := o.GetInitialConnectionWindowSize(); v != nil {
		f.connWindow = v.GetValue()
	}
	return f
}

// transportConfig is f for Go's HTTP/2 client (http.HTTP2Config, which x/net/http2's
// Transport reads through ConfigureTransports). Its MaxReceiveBufferPerConnection is what
// the connection window is raised by beyond the protocol's initial 65535 (x/net/http2's
// newClientConn sends a WINDOW_UPDATE of exactly that), whereas Envoy's
// initial_connection_window_size is the whole window (ConnectionImpl::sendSettings submits
// a WINDOW_UPDATE of the size minus 65535); Go reads 0 as its own default (1 GiB), so the
// client cannot advertise less than 2 × 65535: a smaller window is raised to that.
// MaxConcurrentStreams is a server setting to Go; the pool enforces the client's limit
// (h2HostPool.reserve).
func (f h2Flow) transportConfig() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReceiveBufferPerStream:     int(f.streamWindow),
		MaxReceiveBufferPerConnection: max(int(f.connWindow)-65535, 65535),
	}
}

// server is f for Go's HTTP/2 server: its MaxUploadBufferPerConnection is the whole
// connection window, as Envoy's (the server sends a WINDOW_UPDATE of it minus 65535).
func (f h2Flow) server() *http2.Server {
	return &http2.Server{
		MaxConcurrentStreams:         f.maxStreams,
		MaxUploadBufferPerStream:     int32(f.streamWindow),
		MaxUploadBufferPerConnection: int32(f.connWindow),
	}
}
