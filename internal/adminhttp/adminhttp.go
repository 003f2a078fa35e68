// Package adminhttp reads the admin pages of kube-mvp's processes and Envoy (drain-envoy,
// kubectl mvp) with a bound on what it reads: an admin port may answer anything, and
// kube-mvp's tools never hold more than they asked for.
package adminhttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// MaxPage bounds a whole admin page (a config dump of thousands of resources is a few MiB).
const MaxPage = 64 << 20

// Do sends one request without a body and reads at most limit bytes of the answer: a longer
// answer is an error, never a truncated page.
func Do(ctx context.Context, c *http.Client, method, url string, limit int64) (status int, body []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if int64(len(body)) > limit {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: the answer is longer than %d bytes", method, req.URL.Redacted(), limit)
	}
	return resp.StatusCode, body, nil
}

// FirstLine is an answer's first line, for an error message.
func FirstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
