package dataplane

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// The ext_proc filter's configuration, compiled.

type extProcCfg struct {
	filterName        string
	cluster           string
	sendHeaders       bool // processing_mode.request_header_mode
	sendRespHeaders   bool // processing_mode.response_header_mode
	allowModeOverride bool
	messageTimeout    time.Duration
	failureModeAllow  bool
	statusOnError     int
	routeCache        extprocfilterv3.ExternalProcessor_RouteCacheAction
	statPrefix        string
	allowedHeaders    []*stringMatcher // nil: all
	disallowed        []*stringMatcher
	rules             *mutationRules
	// receivingNamespaces are metadata_options.receiving_namespaces.untyped: the dynamic
	// metadata namespaces accepted from a ProcessingResponse (none when empty).
	receivingNamespaces []string
}

type mutationRules struct {
	allowAllRouting, allowEnvoy, disallowSystem, disallowAll, disallowIsError bool
	allow, disallow                                                           *regexp.Regexp
}

func compileExtProc(filterName string, c *extprocfilterv3.ExternalProcessor) (*extProcCfg, error) {
	out := &extProcCfg{
		filterName:       filterName,
		cluster:          c.GetGrpcService().GetEnvoyGrpc().GetClusterName(),
		messageTimeout:   200 * time.Millisecond, // Envoy's default message_timeout
		failureModeAllow: c.GetFailureModeAllow(),
		statusOnError:    500, // Envoy: status_on_error defaults to 500
		routeCache:       c.GetRouteCacheAction(),
		statPrefix:       c.GetStatPrefix(),
		// Envoy's ExtProcFilterConfig: metadata_options.receiving_namespaces.untyped
		// (typed receiving and forwarding namespaces: the allowlist rejects them).
		receivingNamespaces: c.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(),
	}
	if out.cluster == "" {
		return nil, errors.New("grpc_service: only envoy_grpc is implemented")
	}
	// Envoy: request_header_mode and response_header_mode DEFAULT mean SEND (only trailers
	// are skipped by default). The allowlist admits response_header_mode SKIP only, so the
	// response headers are sent statically only when the mode is left unset.
	out.sendHeaders = c.GetProcessingMode().GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
	out.sendRespHeaders = c.GetProcessingMode().GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
	if out.sendRespHeaders && !out.sendHeaders {
		// The stream is opened by the request-headers step; opening it for the response
		// headers alone is not implemented.
		return nil, errors.New("processing_mode: response headers without request headers are not implemented")
	}
	// allow_mode_override: a processor's mode_override is honoured for the request it
	// answers; without it, Envoy ignores mode_override.
	out.allowModeOverride = c.GetAllowModeOverride()
	if c.GetMessageTimeout() != nil {
		out.messageTimeout = c.GetMessageTimeout().AsDuration()
	}
	if c.GetStatusOnError() != nil && c.GetStatusOnError().GetCode() != 0 {
		out.statusOnError = int(c.GetStatusOnError().GetCode())
	}
	var err error
	if fr := c.GetForwardRules(); fr != nil {
		// Envoy: an empty allowed list allows every header.
		if len(fr.GetAllowedHeaders().GetPatterns()) > 0 {
			out.allowedHeaders = []*stringMatcher{}
			for _, p := range fr.GetAllowedHeaders().GetPatterns() {
				sm, err := compileStringMatcher(p)
				if err != nil {
					return nil, err
				}
				out.allowedHeaders = append(out.allowedHeaders, sm)
			}
		}
		for _, p := range fr.GetDisallowedHeaders().GetPatterns() {
			sm, err := compileStringMatcher(p)
			if err != nil {
				return nil, err
			}
			out.disallowed = append(out.disallowed, sm)
		}
	}
	if mr := c.GetMutationRules(); mr != nil {
		r := &mutationRules{
			allowAllRouting: mr.GetAllowAllRouting().GetValue(),
			allowEnvoy:      mr.GetAllowEnvoy().GetValue(),
			disallowSystem:  mr.GetDisallowSystem().GetValue(),
			disallowAll:     mr.GetDisallowAll().GetValue(),
			disallowIsError: mr.GetDisallowIsError().GetValue(),
		}
		if re := mr.GetAllowExpression().GetRegex(); re != "" {
			if r.allow, err = compileRE2(re); err != nil {
				return nil, fmt.Errorf("mutation_rules.allow_expression: %w", err)
			}
		}
		if re := mr.GetDisallowExpression().GetRegex(); re != "" {
			if r.disallow, err = compileRE2(re); err != nil {
				return nil, fmt.Errorf("mutation_rules.disallow_expression: %w", err)
			}
		}
		out.rules = r
	}
	return out, nil
}
