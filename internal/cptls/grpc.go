package cptls

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// PeerRole is the role named by the verified client certificate of the call in ctx.
func PeerRole(ctx context.Context) (Role, error) {
	cert, err := PeerCertificate(ctx)
	if err != nil {
		return "", err
	}
	return RoleOf(cert)
}

// PeerCertificate is the verified client certificate of the call in ctx.
func PeerCertificate(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return nil, errors.New("no verified client certificate")
	}
	return info.State.PeerCertificates[0], nil
}

// Policy says which roles may call the methods of each gRPC service, by full service name
// (e.g. "envoy.service.discovery.v3.AggregatedDiscoveryService"). A service it does not list
// may be called by nobody.
type Policy map[string][]Role

// allows reports whether role may call fullMethod ("/service/method").
func (p Policy) allows(fullMethod string, role Role) bool {
	service, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	for _, r := range p[service] {
		if r == role {
			return true
		}
	}
	return false
}

// Denied is told about every refused call (for a metric and a log line).
type Denied func(fullMethod string, role Role, err error)

func (p Policy) check(ctx context.Context, fullMethod string, denied Denied) error {
	role, err := PeerRole(ctx)
	if err == nil && !p.allows(fullMethod, role) {
		err = errors.New("role " + string(role) + " may not call " + fullMethod)
	}
	if err != nil {
		if denied != nil {
			denied(fullMethod, role, err)
		}
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// ServerOptions are the interceptors that enforce p on every unary and streaming call.
func (p Policy) ServerOptions(denied Denied) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := p.check(ctx, info.FullMethod, denied); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := p.check(ss.Context(), info.FullMethod, denied); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
