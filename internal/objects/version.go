package objects

import "regexp"

// plausibleVersion is a Kubernetes gitVersion as /version gives it ("v1.35.0",
// "v1.36.0-alpha.1.23+abcdef", "v1.34.2-gke.100").
var plausibleVersion = regexp.MustCompile(`^v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,6}[-+.0-9A-Za-z]{0,48}$`)

// PlausibleVersion reports whether v looks like a Kubernetes version: what an apiserver says
// of itself is shown to people (kubectl mvp status), so nothing longer or stranger than a
// version gets through.
func PlausibleVersion(v string) bool { return plausibleVersion.MatchString(v) }
