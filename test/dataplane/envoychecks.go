package dataplane

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// Envoy's load-time checks beyond the field allowlist: what Envoy refuses (a NACK) in a
// resource whose every field this data plane implements. ENVOY_CHECKS.md lists every check
// of the resources and filters our configuration uses, with where Envoy makes it and how
// this data plane stands to it; envoychecks_test.go shows each one modelled here.

// envoyLoadChecks returns the errors Envoy would refuse m with. It runs on a resource the
// allowlist accepted (so every typed_config in it is one of ours).
func envoyLoadChecks(m proto.Message) []error {
	errs := validatePGV(m)
	switch r := m.(type) {
	case *listenerv3.Listener:
		errs = append(errs, checkListenerLoad(r)...)
	case *routev3.RouteConfiguration:
		errs = append(errs, checkRouteConfigLoad(r)...)
	case *clusterv3.Cluster:
		errs = append(errs, checkClusterLoad(r)...)
	case *endpointv3.ClusterLoadAssignment:
		errs = append(errs, checkEndpointsLoad(r)...)
	}
	return errs
}

// validatePGV: the protoc-gen-validate rules of the message and, as Envoy validates each
// typed_config when the factory that owns it unpacks it (MessageUtil::downcastAndValidate,
// Config::Utility::translateOpaqueConfig), of every message inside an Any, recursively.
// Envoy validates every xDS resource as it decodes it (OpaqueResourceDecoderImpl:
// MessageUtil::anyConvertAndValidate) and throws ProtoValidationException.
func validatePGV(m proto.Message) []error {
	var errs []error
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("proto constraint validation failed: %w", err))
		}
	}
	eachAny(m.ProtoReflect(), func(a *anypb.Any) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, err)
			return
		}
		errs = append(errs, validatePGV(inner)...)
	})
	return errs
}

// eachAny calls f on every google.protobuf.Any directly or indirectly in m (not inside
// another Any: f's caller recurses).
func eachAny(m protoreflect.Message, f func(*anypb.Any)) {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		f(m.Interface().(*anypb.Any))
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			for i := 0; i < v.List().Len(); i++ {
				eachAny(v.List().Get(i).Message(), f)
			}
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				eachAny(mv.Message(), f)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.MessageKind:
			eachAny(v.Message(), f)
		}
		return true
	})
}

// checkListenerLoad: the HTTP connection manager's own checks (HttpConnectionManagerConfig's
// constructor) and its local reply configuration's (LocalReplyImpl, ResponseMapperImpl).
func checkListenerLoad(l *listenerv3.Listener) []error {
	var errs []error
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			h := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig() == nil || !f.GetTypedConfig().MessageIs(h) || f.GetTypedConfig().UnmarshalTo(h) != nil {
				continue
			}
			// HttpConnectionManagerConfig: upgrade types are unique, compared without case.
			seen := map[string]bool{}
			for _, u := range h.GetUpgradeConfigs() {
				k := strings.ToLower(u.GetUpgradeType())
				if seen[k] {
					errs = append(errs, fmt.Errorf("Error: multiple upgrade configs with the same name: '%s'", u.GetUpgradeType()))
				}
				seen[k] = true
			}
			for i, m := range h.GetLocalReplyConfig().GetMappers() {
				if err := checkHeadersToAdd(m.GetHeadersToAdd()); err != nil {
					errs = append(errs, fmt.Errorf("local_reply_config.mappers[%d].headers_to_add: %w", i, err))
				}
			}
		}
	}
	return errs
}

// checkRouteConfigLoad: RouteMatcher's domain checks and every HeaderParser::configure of
// the route configuration, its virtual hosts and routes.
func checkRouteConfigLoad(rc *routev3.RouteConfiguration) []error {
	var errs []error
	add := func(where string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	add("request_headers", checkHeaderParser(rc.GetRequestHeadersToAdd(), rc.GetRequestHeadersToRemove()))
	add("response_headers", checkHeaderParser(rc.GetResponseHeadersToAdd(), rc.GetResponseHeadersToRemove()))
	// RouteMatcher::RouteMatcher: a domain (lower-cased) may appear once across the route
	// configuration's virtual hosts, "*" once.
	domains := map[string]bool{}
	wildcard := false
	for i, vh := range rc.GetVirtualHosts() {
		add(fmt.Sprintf("virtual_hosts[%d].request_headers", i), checkHeaderParser(vh.GetRequestHeadersToAdd(), vh.GetRequestHeadersToRemove()))
		add(fmt.Sprintf("virtual_hosts[%d].response_headers", i), checkHeaderParser(vh.GetResponseHeadersToAdd(), vh.GetResponseHeadersToRemove()))
		for j, r := range vh.GetRoutes() {
			add(fmt.Sprintf("virtual_hosts[%d].routes[%d].request_headers", i, j), checkHeaderParser(r.GetRequestHeadersToAdd(), r.GetRequestHeadersToRemove()))
			add(fmt.Sprintf("virtual_hosts[%d].routes[%d].response_headers", i, j), checkHeaderParser(r.GetResponseHeadersToAdd(), r.GetResponseHeadersToRemove()))
		}
		for _, d := range vh.GetDomains() {
			d = strings.ToLower(d)
			switch {
			case d == "*" && wildcard:
				errs = append(errs, fmt.Errorf("Only a single wildcard domain is permitted in route %s", rc.GetName()))
			case d == "*":
				wildcard = true
			case domains[d]:
				errs = append(errs, fmt.Errorf("Only unique values for domains are permitted. Duplicate entry of domain %s in route %s", d, rc.GetName()))
			default:
				domains[d] = true
			}
		}
	}
	return errs
}

// checkClusterLoad: the HTTP health checker's header parser (HttpHealthCheckerImpl).
func checkClusterLoad(c *clusterv3.Cluster) []error {
	var errs []error
	for i, hc := range c.GetHealthChecks() {
		h := hc.GetHttpHealthCheck()
		if err := checkHeaderParser(h.GetRequestHeadersToAdd(), h.GetRequestHeadersToRemove()); err != nil {
			errs = append(errs, fmt.Errorf("health_checks[%d].http_health_check: %w", i, err))
		}
	}
	// Outlier::DetectorImpl::create (defaults: base 30 s, max 300 s, DetectorConfig).
	if od := c.GetOutlierDetection(); od != nil {
		base, max := 30*time.Second, 300*time.Second
		if od.GetBaseEjectionTime() != nil {
			base = od.GetBaseEjectionTime().AsDuration()
		}
		if od.GetMaxEjectionTime() != nil {
			max = od.GetMaxEjectionTime().AsDuration()
		}
		if max.Milliseconds() < base.Milliseconds() {
			errs = append(errs, errors.New("outlier detector's max_ejection_time cannot be smaller than base_ejection_time"))
		}
	}
	return errs
}

// checkEndpointsLoad: an EDS endpoint's socket address must be an IP address
// (EdsClusterImpl::BatchUpdateHelper::updateLocalityEndpoints → resolveProtoAddress →
// Network::Address::resolveProtoSocketAddress, "malformed IP address"; no resolver_name is
// implemented here, so none names a custom resolver).
func checkEndpointsLoad(cla *endpointv3.ClusterLoadAssignment) []error {
	var errs []error
	for _, loc := range cla.GetEndpoints() {
		for _, ep := range loc.GetLbEndpoints() {
			sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
			if sa != nil && net.ParseIP(sa.GetAddress()) == nil {
				errs = append(errs, fmt.Errorf("malformed IP address: %s", sa.GetAddress()))
			}
		}
	}
	return errs
}

// checkHeaderParser is Router::HeaderParser::configure: no ":"-prefixed header or host may
// be added or removed, and every value to add is a substitution format
// (parseHttpHeaderFormatter → Formatter::FormatterImpl::create).
func checkHeaderParser(add []*corev3.HeaderValueOption, remove []string) error {
	if err := checkHeadersToAdd(add); err != nil {
		return err
	}
	for _, h := range remove {
		// Http::HeaderUtility::isRemovableHeader.
		if strings.HasPrefix(h, ":") || strings.EqualFold(h, "host") {
			return errors.New(":-prefixed or host headers may not be removed")
		}
	}
	return nil
}

func checkHeadersToAdd(add []*corev3.HeaderValueOption) error {
	for _, o := range add {
		// HeadersToAddEntry: the deprecated append with a non-default append_action.
		if o.GetAppend() != nil && o.GetAppendAction() != corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD {
			return errors.New("Both append and append_action are set and it's not allowed")
		}
		// Http::HeaderUtility::isModifiableHeader.
		k := o.GetHeader().GetKey()
		if k == "" || strings.HasPrefix(k, ":") || strings.EqualFold(k, "host") {
			return errors.New(":-prefixed or host headers may not be modified")
		}
		if v := o.GetHeader().GetValue(); strings.Contains(v, "%") {
			if _, err := parseSubstitutionFormat(v); err != nil {
				return err
			}
			// Valid for Envoy, but this data plane adds header values verbatim.
			return fmt.Errorf("header %s: a value with substitution commands or %%%% is not implemented", k)
		}
	}
	return nil
}

// formatPiece is one piece of a parsed substitution format: a literal, or a command.
type formatPiece struct {
	literal string
	command string // "" for a literal
	arg     string
	hasArg  bool
	length  string
}

// envoyCommandRE is SubstitutionFormatParser's command syntax (commandWithArgsRegex):
// %COMMAND(ARG):LENGTH% with COMMAND of A-Z, 0-9 and _.
var envoyCommandRE = regexp.MustCompile(`^%((?:[A-Z]|[0-9]|_)+)(?:\((.*?)\))?(?::([0-9]+))?%`)

// parseSubstitutionFormat parses a format as Envoy's SubstitutionFormatParser::parse does:
// "%%" is a literal "%", any other "%" must start a command; a command this data plane does
// not implement is refused (Envoy refuses the ones it does not know: "Not supported field in
// StreamInfo"). The implemented commands take no argument or length (CommandSyntaxChecker
// COMMAND_ONLY).
func parseSubstitutionFormat(format string) ([]formatPiece, error) {
	var out []formatPiece
	var lit strings.Builder
	for pos := 0; pos < len(format); {
		if format[pos] != '%' {
			lit.WriteByte(format[pos])
			pos++
			continue
		}
		if pos+1 < len(format) && format[pos+1] == '%' {
			lit.WriteByte('%')
			pos += 2
			continue
		}
		if lit.Len() > 0 {
			out = append(out, formatPiece{literal: lit.String()})
			lit.Reset()
		}
		m := envoyCommandRE.FindStringSubmatchIndex(format[pos:])
		if m == nil {
			return nil, fmt.Errorf("Incorrect configuration: %s. Couldn't find valid command at position %d", format, pos)
		}
		sub := func(i int) string {
			if m[2*i] < 0 {
				return ""
			}
			return format[pos+m[2*i] : pos+m[2*i+1]]
		}
		p := formatPiece{command: sub(1), arg: sub(2), hasArg: m[4] >= 0, length: sub(3)}
		if !implementedCommands[p.command] {
			return nil, fmt.Errorf("format command %%%s%% is not implemented", p.command)
		}
		if p.arg != "" || p.length != "" {
			return nil, fmt.Errorf("%s does not take any parameters or length", p.command)
		}
		out = append(out, p)
		pos += m[1]
	}
	if lit.Len() > 0 {
		out = append(out, formatPiece{literal: lit.String()})
	}
	return out, nil
}

// endpointKey is an endpoint address as Envoy's Address::Instance::asString compares them
// (the IP in its canonical form); "" for an address without one.
func endpointKey(a *corev3.Address) string {
	if sa := a.GetSocketAddress(); sa != nil {
		host := sa.GetAddress()
		if ip := net.ParseIP(host); ip != nil {
			host = ip.String()
		}
		return net.JoinHostPort(host, fmt.Sprint(sa.GetPortValue()))
	}
	if p := a.GetPipe(); p != nil {
		return "unix:" + p.GetPath()
	}
	return ""
}
