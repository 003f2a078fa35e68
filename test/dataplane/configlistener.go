package dataplane

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
)

// Listeners and their HTTP connection manager, compiled.

type listenerCfg struct {
	name    string
	address string // host:port from the resource
	tls     *downstreamTLS
	hcm     *hcmCfg
}

type downstreamTLS struct {
	certSecret    string
	caSecret      string
	requireClient bool
	alpn          []string
	// tickets is stateless session resumption, on unless
	// disable_stateless_session_resumption (listener.go, downstreamTLSConfig). Stateful
	// resumption (disable_stateful_session_resumption) is TLS 1.2 session IDs, which Go's
	// server cannot resume: either value is accepted and nothing is modelled.
	tickets bool
}

type hcmCfg struct {
	statPrefix       string
	rdsName          string
	early            []headerRemoval
	fcc              hcmv3.HttpConnectionManager_ForwardClientCertDetails
	certSubject      bool
	certURI          bool
	useRemoteAddress bool
	upgrades         map[string]bool
	extProc          *extProcCfg // nil: no ext_proc filter
	// filters are the HTTP filters before the router, in the configured order: each
	// entry is one of lua or extProc.
	filters           []httpFilterCfg
	suppressEnvoy     bool
	passThroughServer bool
	localReply        []*localReplyMapper
	// h2 is http2_protocol_options: what the downstream HTTP/2 server advertises.
	h2 h2Flow
}

type httpFilterCfg struct {
	lua     *luaFilterCfg
	extProc *extProcCfg
}

type headerRemoval struct {
	exact   string
	matcher *stringMatcher
}

func compileListener(l *listenerv3.Listener) (*listenerCfg, error) {
	sa := l.GetAddress().GetSocketAddress()
	if sa == nil {
		return nil, errors.New("address: only socket_address is implemented")
	}
	out := &listenerCfg{name: l.GetName(), address: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}
	if len(l.GetFilterChains()) != 1 {
		return nil, fmt.Errorf("filter_chains: exactly one filter chain is implemented, got %d", len(l.GetFilterChains()))
	}
	fc := l.GetFilterChains()[0]
	if len(fc.GetFilters()) != 1 {
		return nil, fmt.Errorf("filter_chains[0].filters: exactly one filter (the HTTP connection manager) is implemented, got %d", len(fc.GetFilters()))
	}
	if ts := fc.GetTransportSocket(); ts != nil {
		ctx := &tlsv3.DownstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
			return nil, fmt.Errorf("filter_chains[0].transport_socket: %w", err)
		}
		ct := ctx.GetCommonTlsContext()
		if len(ct.GetTlsCertificateSdsSecretConfigs()) != 1 {
			return nil, errors.New("filter_chains[0].transport_socket: exactly one tls_certificate_sds_secret_configs is implemented")
		}
		out.tls = &downstreamTLS{
			certSecret:    ct.GetTlsCertificateSdsSecretConfigs()[0].GetName(),
			caSecret:      ct.GetValidationContextSdsSecretConfig().GetName(),
			requireClient: ctx.GetRequireClientCertificate().GetValue(),
			alpn:          ct.GetAlpnProtocols(),
			tickets:       !ctx.GetDisableStatelessSessionResumption(),
		}
	}
	h := &hcmv3.HttpConnectionManager{}
	if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(h); err != nil {
		return nil, fmt.Errorf("filter_chains[0].filters[0]: %w", err)
	}
	hcm, err := compileHCM(h)
	if err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	out.hcm = hcm
	return out, nil
}

func compileHCM(h *hcmv3.HttpConnectionManager) (*hcmCfg, error) {
	out := &hcmCfg{
		statPrefix:        h.GetStatPrefix(),
		fcc:               h.GetForwardClientCertDetails(),
		certSubject:       h.GetSetCurrentClientCertDetails().GetSubject().GetValue(),
		certURI:           h.GetSetCurrentClientCertDetails().GetUri(),
		useRemoteAddress:  h.GetUseRemoteAddress().GetValue(),
		upgrades:          map[string]bool{},
		passThroughServer: h.GetServerHeaderTransformation() == hcmv3.HttpConnectionManager_PASS_THROUGH,
		h2:                compileH2Flow(h.GetHttp2ProtocolOptions()),
	}
	if h.GetRds() == nil {
		return nil, errors.New("rds: route configuration by RDS is the only one implemented")
	}
	out.rdsName = h.GetRds().GetRouteConfigName()
	for _, u := range h.GetUpgradeConfigs() {
		// Envoy: an upgrade config applies unless enabled is explicitly false.
		if u.GetEnabled() == nil || u.GetEnabled().GetValue() {
			out.upgrades[strings.ToLower(u.GetUpgradeType())] = true
		}
	}
	for i, e := range h.GetEarlyHeaderMutationExtensions() {
		m := &earlymutationv3.HeaderMutation{}
		if err := e.GetTypedConfig().UnmarshalTo(m); err != nil {
			return nil, err
		}
		for j, mu := range m.GetMutations() {
			switch {
			case mu.GetRemove() != "":
				out.early = append(out.early, headerRemoval{exact: strings.ToLower(mu.GetRemove())})
			case mu.GetRemoveOnMatch() != nil:
				sm, err := compileStringMatcher(mu.GetRemoveOnMatch().GetKeyMatcher())
				if err != nil {
					return nil, fmt.Errorf("early_header_mutation_extensions[%d].mutations[%d]: %w", i, j, err)
				}
				out.early = append(out.early, headerRemoval{matcher: sm})
			default:
				return nil, fmt.Errorf("early_header_mutation_extensions[%d].mutations[%d]: only remove and remove_on_match are implemented", i, j)
			}
		}
	}
	filters := h.GetHttpFilters()
	if len(filters) == 0 {
		return nil, errors.New("http_filters: the router filter is required")
	}
	for i, f := range filters {
		m, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			return nil, fmt.Errorf("http_filters[%d]: %w", i, err)
		}
		switch c := m.(type) {
		case *routerv3.Router:
			if i != len(filters)-1 {
				return nil, errors.New("http_filters: the router must be the last filter")
			}
			out.suppressEnvoy = c.GetSuppressEnvoyHeaders()
		case *extprocfilterv3.ExternalProcessor:
			if out.extProc != nil {
				return nil, errors.New("http_filters: only one ext_proc filter is implemented")
			}
			ep, err := compileExtProc(f.GetName(), c)
			if err != nil {
				return nil, fmt.Errorf("http_filters[%d] (%s): %w", i, f.GetName(), err)
			}
			out.extProc = ep
			out.filters = append(out.filters, httpFilterCfg{extProc: ep})
		case *luafilterv3.Lua:
			lf, err := compileLua(f.GetName(), c)
			if err != nil {
				return nil, fmt.Errorf("http_filters[%d] (%s): %w", i, f.GetName(), err)
			}
			out.filters = append(out.filters, httpFilterCfg{lua: lf})
		}
	}
	if _, ok := mustUnmarshalLast(filters).(*routerv3.Router); !ok {
		return nil, errors.New("http_filters: the last filter must be the router")
	}
	lr, err := compileLocalReply(h.GetLocalReplyConfig())
	if err != nil {
		return nil, fmt.Errorf("local_reply_config: %w", err)
	}
	out.localReply = lr
	return out, nil
}

func mustUnmarshalLast(filters []*hcmv3.HttpFilter) proto.Message {
	m, _ := filters[len(filters)-1].GetTypedConfig().UnmarshalNew()
	return m
}
