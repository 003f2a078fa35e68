// Package proxycert asks an apiserver itself whether it accepts kube-mvp's proxy
// certificate ("front-proxy client certificate") as a front proxy, and says what to fix when
// it does not. Envoy presents that certificate for requests whose identity kube-mvp sets and
// for its /readyz health checks (as contract.HealthCheckUser in the user header); nothing
// xds-server can read tells whether each apiserver accepts it, and one that does not silently
// gets no requests at all. Check sends what a health check sends, with the same certificate,
// and reads who the apiserver says the request came from. It runs where the key already is:
// extproc, a container of the Envoy pod (cmd/extproc --proxy-client-cert); xds-server never
// holds the key. Why: docs/security.md#each-apiserver-is-asked-whether-it-accepts-the-proxy-certificate.
package proxycert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// DefaultServerName is the SNI sent to the apiservers and the DNS SAN required of their
// serving certificates when none is configured: xds-server's --upstream-server-name default
// (snapshot.DefaultUpstreamServerName), so the check verifies apiservers as Envoy does.
const DefaultServerName = "kubernetes.default.svc"

// ReviewPath is what Check asks: a SelfSubjectReview answers with the user the apiserver
// authenticated, and every authenticated user may create one (system:basic-user).
const ReviewPath = "/apis/authentication.k8s.io/v1/selfsubjectreviews"

// Verdict is what a check found.
type Verdict int

const (
	// Inconclusive: no answer (TLS or network error: "unreachable"), or an answer that does
	// not say who the request came from (a 5xx, 429, 404…). Envoy's health checks deal with
	// apiservers that are down; an inconclusive check counts neither way.
	Inconclusive Verdict = iota
	// Accepted: the apiserver took the request as contract.HealthCheckUser, from the user
	// header, so it accepts the proxy certificate as a front proxy.
	Accepted
	// Refused: the apiserver rejected the request (401) or took it as someone else.
	Refused
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case Refused:
		return "refused"
	}
	return "inconclusive"
}

// Result is one apiserver's answer.
type Result struct {
	Verdict Verdict
	// Status is the HTTP status; 0 when no answer came.
	Status int
	// User is who the apiserver said the request came from; "" when it did not say.
	User string
	// Dangerous: the apiserver authenticated the proxy certificate's requests as User, not
	// from the user header. Envoy's health checks then pass, and every request kube-mvp
	// forwarded there for a client certificate would run as User: extproc reports it to
	// xds-server, which keeps such requests away from it (plan.ProxyCertRefusal).
	Dangerous bool
	// Reason says, unless Accepted, what happened and what to fix.
	Reason string
}

// Checker checks apiservers with one proxy certificate.
type Checker struct {
	// Client presents the proxy certificate and verifies the apiservers (see NewChecker).
	Client *http.Client
	// Proxy is the proxy certificate, named in the reasons.
	Proxy *x509.Certificate
}

// Files are where the proxy certificate, its key and the CA of the apiservers' serving
// certificates are, and the name the serving certificates must carry.
type Files struct {
	Cert, Key, PeerCA string
	// ServerName is the SNI and required DNS SAN; empty means DefaultServerName.
	ServerName string
}

// Load reads the files (again on every call: certificates are renewed in place) and makes a
// Checker of them.
func (f Files) Load() (Checker, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return Checker{}, fmt.Errorf("proxy client certificate %s and key %s: %w", f.Cert, f.Key, err)
	}
	pem, err := os.ReadFile(f.PeerCA)
	if err != nil {
		return Checker{}, fmt.Errorf("peer CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return Checker{}, fmt.Errorf("peer CA %s: no PEM certificate in it", f.PeerCA)
	}
	return NewChecker(pair, pool, f.ServerName)
}

// NewChecker makes a Checker that presents cert and accepts only apiservers whose serving
// certificate peerCA signed for serverName (empty: DefaultServerName), as Envoy's
// front-proxy clusters do. It opens a new connection for every check (each sees the
// certificates in force) and ignores proxy environment variables.
func NewChecker(cert tls.Certificate, peerCA *x509.CertPool, serverName string) (Checker, error) {
	if serverName == "" {
		serverName = DefaultServerName
	}
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return Checker{}, errors.New("proxy client certificate: empty")
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return Checker{}, fmt.Errorf("proxy client certificate: %w", err)
		}
	}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      peerCA,
			ServerName:   serverName,
			MinVersion:   tls.VersionTLS12,
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	// A redirect would repeat the check, user header and all, elsewhere.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return Checker{Client: &http.Client{Transport: tr, CheckRedirect: noRedirect}, Proxy: leaf}, nil
}

// maxBody bounds what is read of an answer.
const maxBody = 64 << 10

// Check asks the apiserver at address (host:port) who it takes a request for: a POST of a
// SelfSubjectReview with the proxy certificate and contract.HealthCheckUser under every one
// of userHeaders, exactly what Envoy's health checks present (snapshot's
// healthCheckIdentityHeaders: each apiserver takes the first of its own names that is set).
// So a refusal here is a refusal of Envoy's requests, never an artefact of the probe: with
// one name only, a name the published list has but the apiserver's flags lack (anyone who
// may write kube-system/extension-apiserver-authentication can prepend one) made every
// capable apiserver look like it refused. ctx bounds the whole exchange.
func (c Checker) Check(ctx context.Context, address string, userHeaders []string) Result {
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+address+ReviewPath, strings.NewReader(body))
	if err != nil {
		return Result{Verdict: Inconclusive, Reason: "cannot ask: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if len(userHeaders) == 0 {
		return Result{Verdict: Inconclusive, Reason: "cannot ask: no user header name"}
	}
	for _, h := range userHeaders {
		req.Header.Set(h, contract.HealthCheckUser)
	}
	res, err := c.Client.Do(req)
	if err != nil {
		return Result{Verdict: Inconclusive, Reason: "unreachable: " + err.Error()}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return Result{Verdict: Inconclusive, Status: res.StatusCode, Reason: "unreachable: reading the answer: " + err.Error()}
	}
	if loc := res.Header.Get("Location"); loc != "" && res.StatusCode >= 300 && res.StatusCode < 400 {
		return Result{Verdict: Inconclusive, Status: res.StatusCode,
			Reason: fmt.Sprintf("inconclusive: answered %d redirecting to %s, which is not followed", res.StatusCode, excerpt([]byte(loc)))}
	}
	return c.judge(res.StatusCode, raw, userHeaders)
}

// judge turns an answer into a Result.
func (c Checker) judge(status int, body []byte, userHeaders []string) Result {
	r := Result{Status: status}
	switch status {
	case http.StatusUnauthorized:
		r.Verdict = Refused
		r.Reason = fmt.Sprintf("does not accept the proxy certificate as a front proxy: %s (if it has both, its --requestheader-username-headers must include %s)",
			c.fix(), canonical(userHeaders))
		return r
	case http.StatusCreated:
		var review struct {
			Kind   string `json:"kind"`
			Status struct {
				UserInfo struct {
					Username string `json:"username"`
				} `json:"userInfo"`
			} `json:"status"`
		}
		if err := json.Unmarshal(body, &review); err != nil || review.Kind != "SelfSubjectReview" {
			r.Reason = fmt.Sprintf("inconclusive: answered 201 with no SelfSubjectReview: %s", excerpt(body))
			return r
		}
		r.User = review.Status.UserInfo.Username
	case http.StatusForbidden:
		// Authorization refused the review, after authentication: its message names the
		// user ("User \"kube-mvp:health-check\" cannot create resource …").
		msg := statusMessage(body)
		m := forbiddenUser.FindStringSubmatch(msg)
		if m == nil {
			r.Verdict = Refused
			r.Reason = fmt.Sprintf("answered 403 without naming a user: %s", msg)
			return r
		}
		r.User = m[1]
	default:
		// Any other answer came after authentication but does not say as whom.
		r.Reason = fmt.Sprintf("inconclusive: answered %d: %s", status, statusMessage(body))
		return r
	}
	switch r.User {
	case contract.HealthCheckUser:
		r.Verdict = Accepted
		return r
	case "":
		r.Reason = fmt.Sprintf("inconclusive: answered %d without a user", status)
		return r
	}
	// The apiserver ignored the user header: it did not take the certificate as a front
	// proxy's but authenticated the request otherwise, as a client certificate of its
	// --client-ca-file or as anonymous.
	r.Verdict, r.Dangerous = Refused, true
	who, hint := "the client "+r.User, ""
	if r.User == "system:anonymous" {
		who = r.User
		hint = fmt.Sprintf(" (if it has both, its --requestheader-username-headers must include %s)", canonical(userHeaders))
	}
	r.Reason = fmt.Sprintf("authenticates the proxy certificate as %s, not as a front proxy: %s%s. "+
		"DANGEROUS: Envoy's health checks pass there, and a request kube-mvp forwarded there for a client certificate would run as %s, "+
		"with that user's permissions, not the caller's; while extproc reports this, xds-server sends such requests only to other apiservers",
		who, c.fix(), hint, r.User)
	return r
}

var forbiddenUser = regexp.MustCompile(`User "([^"]*)"`)

// fix says what makes an apiserver accept the proxy certificate.
func (c Checker) fix() string {
	cn, issuer := "", ""
	if c.Proxy != nil {
		cn, issuer = c.Proxy.Subject.CommonName, c.Proxy.Issuer.String()
	}
	return fmt.Sprintf("add its CN %q to --requestheader-allowed-names and its issuer's CA (%s) to --requestheader-client-ca-file", cn, issuer)
}

// statusMessage is a Kubernetes Status's message, or an excerpt of whatever else body is.
func statusMessage(body []byte) string {
	var s struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &s) == nil && s.Kind == "Status" && s.Message != "" {
		return s.Message
	}
	return excerpt(body)
}

func excerpt(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 200 {
		return fmt.Sprintf("%q…", b[:200])
	}
	return fmt.Sprintf("%q", b)
}

// canonical names the header names as operators write them in flags (X-Remote-User): one,
// or "one of" several.
func canonical(hs []string) string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = http.CanonicalHeaderKey(h)
	}
	if len(out) == 1 {
		return out[0]
	}
	return "one of " + strings.Join(out, ", ")
}
