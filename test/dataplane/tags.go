package dataplane

import (
	"regexp"
	"sort"
	"strings"
)

// Envoy's default tag extraction, as /stats/prometheus applies it: each default extractor
// (envoyproxy/envoy source/common/config/well_known_names.cc, TagNameValues) is tried on the
// whole stat name; one that matches gives a tag (envoy.<name>) and a span of the name to cut
// out, and the tag-extracted name is what is left (source/common/stats/tag_extractor_impl.cc).
// A regex extractor's first group is the span, its second (or else the first) the value; a
// tokenized one ("cluster.$.**") takes the token at "$" and one dot beside it.
//
// This is the list as Envoy 1.36 has it, in its order; the stand-in uses only a few of the
// prefixes (cluster, http, listener, listener_manager, server), but keeping the whole list
// means a stat the stand-in adds later is named as Envoy names it.
type tagExtractor struct {
	name     string         // the tag, without "envoy."
	re       *regexp.Regexp // a regex extractor
	tokens   []string       // or a tokenized one
	negative string         // a value the regex extractor ignores (listener_address: "admin")
}

const (
	tagValue     = `[^\.]+`
	tagAddress   = `(?:(?:\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[[a-fA-F_\d]+\])_\d+)`
	tagCipher    = `[\w-]+`
	tagTLS       = `TLSv\d\.\d`
	tagRouteName = `[\w\-\.]+`
	tagListOrCl  = `(?:listener|cluster)\..*?`
)

func tagRe(name, expr string) tagExtractor {
	expr = strings.NewReplacer("<TAG_VALUE>", tagValue, "<ADDRESS>", tagAddress, "<CIPHER>", tagCipher,
		"<TLS_VERSION>", tagTLS, "<ROUTE_CONFIG_NAME>", tagRouteName, "<LISTENER_OR_CLUSTER_WITH_NAME>", tagListOrCl).Replace(expr)
	return tagExtractor{name: name, re: regexp.MustCompile(expr)}
}

func tagTokens(name, pattern string) tagExtractor {
	return tagExtractor{name: name, tokens: strings.Split(pattern, ".")}
}

var defaultTagExtractors = []tagExtractor{
	tagRe("response_code", `_rq(_(\d{3}))$`),
	tagRe("response_code_class", `_rq_((\d))xx$`),
	tagRe("dynamo_partition_id", `^http\.<TAG_VALUE>\.dynamodb\.table\.<TAG_VALUE>\.capacity\.<TAG_VALUE>(\.__partition_id=(\w{7}))$`),
	tagRe("dynamo_operation", `^http\.<TAG_VALUE>\.dynamodb.(?:operation|table\.<TAG_VALUE>\.capacity)(\.(<TAG_VALUE>))(?:\.|$)`),
	tagTokens("mongo_callsite", "mongo.*.collection.*.callsite.$.query.**"),
	tagRe("dynamo_table", `^http\.<TAG_VALUE>\.dynamodb.(?:table|error)\.((<TAG_VALUE>)\.)`),
	tagTokens("mongo_collection", "mongo.*.collection.$.**.query.*"),
	tagTokens("mongo_cmd", "mongo.*.cmd.$.**"),
	tagTokens("grpc_bridge_method", "cluster.*.grpc.*.$.**"),
	tagTokens("http_user_agent", "http.*.user_agent.$.**"),
	tagTokens("virtual_cluster", "vhost.*.vcluster.$.**"),
	tagTokens("fault_downstream_cluster", "http.*.fault.$.**"),
	tagRe("ssl_cipher", `^listener\..*?\.ssl\.ciphers(\.(<CIPHER>))$`),
	tagRe("ssl_curve", `^<LISTENER_OR_CLUSTER_WITH_NAME>\.ssl\.curves(\.(<CIPHER>))$`),
	tagRe("ssl_sigalg", `^<LISTENER_OR_CLUSTER_WITH_NAME>\.ssl\.sigalgs(\.(<CIPHER>))$`),
	tagRe("ssl_version", `^<LISTENER_OR_CLUSTER_WITH_NAME>\.ssl\.versions(\.(<TLS_VERSION>))$`),
	tagRe("ssl_cipher_suite", `^cluster\.<TAG_VALUE>\.ssl\.ciphers(\.(<CIPHER>))$`),
	tagTokens("grpc_bridge_service", "cluster.*.grpc.$.**"),
	tagTokens("tcp_prefix", "tcp.$.**"),
	tagTokens("udp_prefix", "udp.$.**"),
	tagTokens("clientssl_prefix", "auth.clientssl.$.**"),
	tagTokens("ratelimit_prefix", "ratelimit.$.**"),
	tagTokens("cluster_name", "cluster.$.**"),
	tagRe("http_conn_manager_prefix", `^listener\..*?\.http\.((<TAG_VALUE>)\.)`),
	tagTokens("ext_authz_prefix", "cluster.*.ext_authz.$.**"),
	tagTokens("ext_authz_prefix", "http.*.ext_authz.$.**"),
	tagTokens("http_conn_manager_prefix", "http.$.**"),
	tagRe("worker_id", `^(?:listener\.(?:<ADDRESS>|<TAG_VALUE>)\.|server\.|listener_manager\.)worker_((\d+)\.)`),
	{name: "listener_address", re: tagRe("", `^listener\.((<ADDRESS>|<TAG_VALUE>)\.)`).re, negative: "admin"},
	tagTokens("virtual_host", "vhost.$.**"),
	tagTokens("mongo_prefix", "mongo.$.**"),
	tagRe("rds_route_config", `^http\.<TAG_VALUE>\.rds\.((<ROUTE_CONFIG_NAME>)\.)\w+?$`),
	tagTokens("route", "vhost.*.route.$.**"),
	tagTokens("thrift_prefix", "thrift.$.**"),
	tagTokens("redis_prefix", "redis.$.**"),
	tagTokens("local_http_ratelimit_prefix", "$.http_local_rate_limit.**"),
	tagTokens("local_network_ratelimit_prefix", "local_rate_limit.$.**"),
	tagTokens("local_listener_ratelimit_prefix", "listener_local_ratelimit.$.**"),
	tagTokens("dns_filter_prefix", "dns_filter.$.**"),
}

// statTag is one extracted tag: Name is Envoy's ("envoy.cluster_name").
type statTag struct{ Name, Value string }

// extractTags is Envoy's default tag extraction of a stat name: the tag-extracted name and
// the tags, in extractor order.
func extractTags(name string) (string, []statTag) {
	var tags []statTag
	var cut [][2]int // spans of name to remove
	tokens := strings.Split(name, ".")
	for _, e := range defaultTagExtractors {
		var value string
		var span [2]int
		if e.re != nil {
			m := e.re.FindStringSubmatchIndex(name)
			if len(m) < 4 || m[2] < 0 || m[2] == m[3] {
				continue
			}
			span = [2]int{m[2], m[3]}
			value = name[m[2]:m[3]]
			if len(m) >= 6 && m[4] >= 0 && m[4] != m[5] {
				value = name[m[4]:m[5]]
			}
			if e.negative != "" && value == e.negative {
				continue
			}
		} else {
			at, start, ok := matchTokens(tokens, e.tokens, 0, 0, 0, -1, 0)
			if !ok || at < 0 {
				continue
			}
			value = tokens[at]
			end := start + len(value)
			if at < len(tokens)-1 {
				end++ // the dot before the next token
			} else if start > 0 {
				start-- // the dot before the last token
			}
			span = [2]int{start, end}
		}
		tags = append(tags, statTag{"envoy." + e.name, value})
		cut = append(cut, span)
	}
	if len(cut) == 0 {
		return name, nil
	}
	remove := make([]bool, len(name))
	for _, s := range cut {
		for i := s[0]; i < s[1]; i++ {
			remove[i] = true
		}
	}
	var b strings.Builder
	for i := range len(name) {
		if !remove[i] {
			b.WriteByte(name[i])
		}
	}
	return b.String(), tags
}

// matchTokens matches name tokens from in against pattern tokens from pat ("*" one token, "**"
// any number, "$" the value), as Envoy's TagExtractorTokensImpl::searchTags: at and start,
// the value's token index and its character offset, carry what was found before in and pat.
func matchTokens(name, pattern []string, in, pat, char, at, start int) (int, int, bool) {
	for ; in < len(name) && pat < len(pattern); in, pat = in+1, pat+1 {
		switch p := pattern[pat]; {
		case p == "$":
			at, start = in, char
		case p == "**":
			if pat == len(pattern)-1 {
				return at, start, true
			}
			for ; in < len(name); in++ {
				if a, s, ok := matchTokens(name, pattern, in, pat+1, char, at, start); ok {
					return a, s, true
				}
				char += len(name[in]) + 1
			}
			return 0, 0, false
		case p != "*" && p != name[in]:
			return 0, 0, false
		}
		char += len(name[in]) + 1
	}
	return at, start, pat == len(pattern) && in == len(name)
}

// promSeries is one line of /stats/prometheus: a family (sanitised, "envoy_"-prefixed
// tag-extracted name) and its labels.
type promSeries struct {
	family string
	labels string // `{a="x",b="y"}` or `{}`
}

// prometheusSeries names a stat as Envoy's /stats/prometheus does
// (source/server/admin/prometheus_stats.cc): "envoy_" and the tag-extracted name, every
// character but [a-zA-Z0-9_] made "_" (tag names likewise); tag values with \, " and newline
// escaped.
func prometheusSeries(stat string) promSeries {
	extracted, tags := extractTags(stat)
	sort.SliceStable(tags, func(i, j int) bool { return tags[i].Name < tags[j].Name })
	parts := make([]string, 0, len(tags))
	for _, t := range tags {
		v := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(t.Value)
		parts = append(parts, promName(t.Name, "")+`="`+v+`"`)
	}
	return promSeries{family: promName(extracted, "envoy_"), labels: "{" + strings.Join(parts, ",") + "}"}
}
