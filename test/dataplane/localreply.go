package dataplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// Envoy response flags this data plane sets (Envoy's access log documentation, "Response
// flags"; the short names are what response_flag_filter takes).
const (
	flagNoHealthyUpstream   = "UH"  // no healthy upstream host in the cluster
	flagConnectFailure      = "UF"  // upstream connection failure
	flagConnTermination     = "UC"  // upstream connection termination
	flagRemoteReset         = "UR"  // upstream remote reset
	flagOverflow            = "UO"  // upstream overflow (circuit breaking)
	flagRetryLimitExceeded  = "URX" // upstream retry limit (HTTP) reached
	flagNoClusterFound      = "NC"  // no upstream cluster
	flagNoRouteFound        = "NR"  // no route configured for the request
	flagUpstreamReqTimeout  = "UT"  // upstream request timeout
	flagDownstreamTerminate = "DC"  // downstream connection termination
)

// Envoy's response flag short names, for validating response_flag_filter.
var knownFlags = map[string]bool{"DC": true, "DI": true, "DPE": true, "FI": true, "IH": true, "LH": true, "LR": true,
	"NC": true, "NFCF": true, "NR": true, "OM": true, "RFCF": true, "RL": true, "RLSE": true, "SI": true, "UAEX": true,
	"UC": true, "UF": true, "UH": true, "UMSDR": true, "UO": true, "UPE": true, "UR": true, "URX": true, "UT": true, "DF": true, "DO": true}

type localReplyMapper struct {
	flagFilter   bool
	flags        map[string]bool
	statusFilter bool
	statusOp     accesslogv3.ComparisonFilter_Op
	statusValue  int
	status       int // 0: keep
	body         *bodyFormat
	// headers are headers_to_add (every one OVERWRITE_IF_EXISTS_OR_ADD with a plain value;
	// the compiler refuses the rest): ResponseMapperImpl::rewrite evaluates them on the
	// local reply's headers.
	headers []kv
}

type bodyFormat struct {
	json        map[string]any
	text        *string
	contentType string
}

var implementedCommands = map[string]bool{"RESPONSE_CODE_DETAILS": true, "RESPONSE_CODE": true, "RESPONSE_FLAGS": true, "LOCAL_REPLY_BODY": true}

// checkCommands parses a body format string as Envoy does (parseSubstitutionFormat).
func checkCommands(s string) error {
	_, err := parseSubstitutionFormat(s)
	return err
}

func checkStructCommands(v any) error {
	switch x := v.(type) {
	case string:
		return checkCommands(x)
	case map[string]any:
		for _, e := range x {
			if err := checkStructCommands(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := checkStructCommands(e); err != nil {
				return err
			}
		}
	}
	return nil
}

func compileLocalReply(c *hcmv3.LocalReplyConfig) ([]*localReplyMapper, error) {
	var out []*localReplyMapper
	for i, m := range c.GetMappers() {
		lm := &localReplyMapper{status: int(m.GetStatusCode().GetValue())}
		f := m.GetFilter()
		switch ft := f.GetFilterSpecifier().(type) {
		case *accesslogv3.AccessLogFilter_ResponseFlagFilter:
			lm.flagFilter, lm.flags = true, map[string]bool{}
			for _, fl := range ft.ResponseFlagFilter.GetFlags() {
				if !knownFlags[fl] {
					return nil, fmt.Errorf("mappers[%d]: unknown response flag %q", i, fl)
				}
				lm.flags[fl] = true
			}
		case *accesslogv3.AccessLogFilter_StatusCodeFilter:
			cmp := ft.StatusCodeFilter.GetComparison()
			lm.statusFilter, lm.statusOp = true, cmp.GetOp()
			// No runtime layer here: the runtime key always takes its default value, as in
			// an Envoy without runtime overrides.
			lm.statusValue = int(cmp.GetValue().GetDefaultValue())
		default:
			return nil, fmt.Errorf("mappers[%d]: only response_flag_filter and status_code_filter are implemented", i)
		}
		for _, h := range m.GetHeadersToAdd() {
			if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || len(h.GetHeader().GetRawValue()) > 0 || strings.Contains(h.GetHeader().GetValue(), "%") {
				return nil, fmt.Errorf("mappers[%d].headers_to_add: only OVERWRITE_IF_EXISTS_OR_ADD with a plain value is implemented", i)
			}
			lm.headers = append(lm.headers, kv{strings.ToLower(h.GetHeader().GetKey()), h.GetHeader().GetValue()})
		}
		if bf := m.GetBodyFormatOverride(); bf != nil {
			b := &bodyFormat{contentType: bf.GetContentType()}
			switch {
			case bf.GetJsonFormat() != nil:
				b.json = bf.GetJsonFormat().AsMap()
				if err := checkStructCommands(b.json); err != nil {
					return nil, fmt.Errorf("mappers[%d]: %w", i, err)
				}
				if b.contentType == "" {
					b.contentType = "application/json" // Envoy's default for json_format
				}
			case bf.GetTextFormat() != "":
				t := bf.GetTextFormat()
				if err := checkCommands(t); err != nil {
					return nil, fmt.Errorf("mappers[%d]: %w", i, err)
				}
				b.text = &t
				if b.contentType == "" {
					b.contentType = "text/plain"
				}
			default:
				return nil, fmt.Errorf("mappers[%d]: only json_format and text_format are implemented", i)
			}
			lm.body = b
		}
		out = append(out, lm)
	}
	return out, nil
}

func (m *localReplyMapper) matches(status int, flags []string) bool {
	if m.flagFilter {
		// Envoy: a response_flag_filter without flags matches any response with a flag set.
		if len(flags) == 0 {
			return false
		}
		if len(m.flags) == 0 {
			return true
		}
		for _, f := range flags {
			if m.flags[f] {
				return true
			}
		}
		return false
	}
	if m.statusFilter {
		switch m.statusOp {
		case accesslogv3.ComparisonFilter_GE:
			return status >= m.statusValue
		case accesslogv3.ComparisonFilter_LE:
			return status <= m.statusValue
		default:
			return status == m.statusValue
		}
	}
	return false
}

// localReply is an Envoy local reply after local_reply_config: Envoy finds the first mapper
// whose filter matches, rewrites the status code if the mapper has one, and formats the body
// with the mapper's body_format_override (else the body stays Envoy's text/plain). The
// filters see the original status code.
type localReply struct {
	status      int
	body        []byte
	contentType string
	rewritten   bool // a mapper's body_format_override replaced the body
	headers     []kv // the mapper's headers_to_add
}

func (h *hcmCfg) mapLocalReply(status int, body, details string, flags []string) localReply {
	out := localReply{status: status, body: []byte(body)}
	if body != "" {
		out.contentType = "text/plain"
	}
	for _, m := range h.localReply {
		if !m.matches(status, flags) {
			continue
		}
		if m.status != 0 {
			out.status = m.status
		}
		out.headers = m.headers
		if m.body != nil {
			sub := func(s string) string {
				pieces, _ := parseSubstitutionFormat(s) // checked at load
				var b strings.Builder
				for _, p := range pieces {
					switch p.command {
					case "":
						b.WriteString(p.literal)
					case "RESPONSE_CODE_DETAILS":
						b.WriteString(details)
					case "RESPONSE_CODE":
						b.WriteString(strconv.Itoa(out.status))
					case "RESPONSE_FLAGS":
						if len(flags) == 0 {
							b.WriteString("-")
						} else {
							b.WriteString(strings.Join(flags, ","))
						}
					case "LOCAL_REPLY_BODY":
						b.WriteString(body)
					}
				}
				return b.String()
			}
			if m.body.json != nil {
				v := substitute(m.body.json, sub)
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf) // adds the newline Envoy's JSON formatter ends with
				enc.SetEscapeHTML(false)
				if err := enc.Encode(v); err == nil {
					out.body = buf.Bytes()
				}
			} else {
				out.body = []byte(sub(*m.body.text))
			}
			out.contentType = m.body.contentType
			out.rewritten = true
		}
		break
	}
	return out
}

// substitute applies sub to every string in a JSON format; numbers stay numbers, and a
// float with an integral value is written as an integer, as Envoy's formatter does.
func substitute(v any, sub func(string) string) any {
	switch x := v.(type) {
	case string:
		return sub(x)
	case float64:
		if x == float64(int64(x)) {
			return int64(x)
		}
		return x
	case map[string]any:
		o := make(map[string]any, len(x))
		for k, e := range x {
			o[k] = substitute(e, sub)
		}
		return o
	case []any:
		o := make([]any, len(x))
		for i, e := range x {
			o[i] = substitute(e, sub)
		}
		return o
	}
	return v
}
