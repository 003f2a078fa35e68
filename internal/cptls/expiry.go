package cptls

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ExpiryMetric is the one name every component gives its certificates' expiry, so that one
// alert covers them all. It is a Unix timestamp, not "days left", as Prometheus advises: the
// value changes only on renewal and the alert does the arithmetic,
// (kube_mvp_certificate_expiry_timestamp_seconds - time()) / 86400 < 14.
const ExpiryMetric = "kube_mvp_certificate_expiry_timestamp_seconds"

// Values of the certificate label.
const (
	// CertificateControlPlane is a role's certificate of the control plane's own CA.
	CertificateControlPlane = "control-plane"
	// CertificateProxyClient is the proxy (front-proxy client) certificate.
	CertificateProxyClient = "proxy-client"
)

// Expiry is one certificate of an ExpiryCollector: which (certificate, role) and when it
// expires; NotAfter's false means unknown now (no series).
type Expiry struct {
	Certificate string
	Role        Role
	NotAfter    func() (time.Time, bool)
}

// ExpiryCollector exports ExpiryMetric{certificate,role} for a fixed list of certificates.
type ExpiryCollector struct {
	desc  *prometheus.Desc
	certs []Expiry
}

// NewExpiryCollector collects certs; their (certificate, role) pairs must be distinct.
func NewExpiryCollector(certs ...Expiry) *ExpiryCollector {
	return &ExpiryCollector{
		desc: prometheus.NewDesc(ExpiryMetric,
			"Unix time at which a certificate expires, by certificate (control-plane: a "+
				"role's certificate of the control plane's own CA; proxy-client: the proxy "+
				"certificate) and role (its holder). Alert on (value - time()) / 86400 < 14.",
			[]string{"certificate", "role"}, nil),
		certs: certs,
	}
}

// Describe implements prometheus.Collector.
func (c *ExpiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *ExpiryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.certs {
		if t, ok := e.NotAfter(); ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(t.Unix()), e.Certificate, string(e.Role))
		}
	}
}

// NotAfterOf is Credentials.CurrentNotAfter as an Expiry's NotAfter.
func (c *Credentials) NotAfterOf() func() (time.Time, bool) {
	return func() (time.Time, bool) { return c.CurrentNotAfter(), true }
}

// FileNotAfter returns a NotAfter that reads the first certificate of the PEM file at path on
// every call, keeping the last good answer while the file does not parse (a Secret volume
// being updated).
func FileNotAfter(path string) func() (time.Time, bool) {
	var (
		mu   sync.Mutex
		last time.Time
	)
	return func() (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		if b, err := os.ReadFile(path); err == nil {
			for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
				if block.Type != "CERTIFICATE" {
					continue
				}
				if c, err := x509.ParseCertificate(block.Bytes); err == nil {
					last = c.NotAfter
				}
				break
			}
		}
		return last, !last.IsZero()
	}
}
