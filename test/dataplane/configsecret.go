package dataplane

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/hashicorp/go-multierror"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/cli"
)

// SDS secrets, checked and resolved.

func checkSecret(s *tlsv3.Secret) error {
	switch {
	case s.GetTlsCertificate() != nil:
		if len(dataSource(s.GetTlsCertificate().GetCertificateChain())) == 0 || len(dataSource(s.GetTlsCertificate().GetPrivateKey())) == 0 {
			return errors.New("tls_certificate: certificate_chain and private_key are required")
		}
	case s.GetValidationContext() != nil:
		if len(dataSource(s.GetValidationContext().GetTrustedCa())) == 0 {
			return errors.New("validation_context: trusted_ca is required")
		}
	default:
		return errors.New("only tls_certificate and validation_context secrets are implemented")
	}
	return nil
}

// resolveSecret reads the files a secret refers to and returns it with their contents
// inline (the original, with its paths, stays in raw for /config_dump). Envoy reads
// file-based secrets delivered by SDS when the update arrives and rejects the update when a
// file cannot be read or a key does not match its certificate (SdsApi; the TLS context
// refuses the pair); afterwards it watches the files (see watchSecretFiles).
func resolveSecret(s *tlsv3.Secret) (*tlsv3.Secret, error) {
	out := proto.Clone(s).(*tlsv3.Secret)
	var errs []error
	read := func(d *corev3.DataSource) {
		if d == nil || d.GetFilename() == "" {
			return
		}
		b, err := os.ReadFile(d.GetFilename())
		if err != nil {
			errs = append(errs, err)
			return
		}
		d.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: b}
	}
	if tc := out.GetTlsCertificate(); tc != nil {
		read(tc.GetCertificateChain())
		read(tc.GetPrivateKey())
		if len(errs) == 0 {
			if _, err := tls.X509KeyPair(dataSource(tc.GetCertificateChain()), dataSource(tc.GetPrivateKey())); err != nil {
				errs = append(errs, fmt.Errorf("tls_certificate: %w", err))
			}
		}
	}
	if vc := out.GetValidationContext(); vc != nil {
		read(vc.GetTrustedCa())
	}
	return out, multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).ErrorOrNil()
}

// hasFiles reports whether a secret refers to any file.
func hasFiles(s *tlsv3.Secret) bool {
	tc, vc := s.GetTlsCertificate(), s.GetValidationContext()
	return tc.GetCertificateChain().GetFilename() != "" || tc.GetPrivateKey().GetFilename() != "" || vc.GetTrustedCa().GetFilename() != ""
}

func dataSource(d *corev3.DataSource) []byte {
	if d == nil {
		return nil
	}
	if b := d.GetInlineBytes(); b != nil {
		return b
	}
	return []byte(d.GetInlineString())
}
