package certgen

// Where the state is stored: the keys of the CA Secret (type Opaque) and of each role's Secret
// (type kubernetes.io/tls, one per role), which are also the file names of
// `xds-server certgen --out-dir` (DIR/<CA key>, DIR/<role>/<role key>).
const (
	CACertKey     = "ca.crt"        // CA Secret: the signing CA's certificate
	CAKeyKey      = "ca.key"        // CA Secret: the signing CA's private key
	CABundleKey   = "ca-bundle.crt" // CA Secret: every trusted CA (signing, next, previous until they expire)
	NextCACertKey = "next-ca.crt"   // CA Secret, rotation phase 1 only: the next CA's certificate
	NextCAKeyKey  = "next-ca.key"   // CA Secret, rotation phase 1 only: the next CA's private key

	CertKey        = "tls.crt" // role Secret: the role's certificate
	KeyKey         = "tls.key" // role Secret: its private key
	TrustBundleKey = "ca.crt"  // role Secret: the trust bundle, every trusted CA (the CA Secret's ca-bundle.crt)
)

// Asking for a renewal now (State.RenewAllRequest, Leaf.RenewRequest): the annotation
// RenewAnnotation (any value) on a role's Secret renews that role's certificate; on the CA
// Secret, every role's certificate (the CA is not rotated). With --out-dir, a file named
// RenewFile (any content) does the same: DIR/<role>/renew for one role, DIR/renew for all.
// certgen removes the annotation or the file once the certificates are written, so the
// request is carried out once.
const (
	RenewAnnotation = "kube-mvp.io/renew"
	RenewFile       = "renew"
)

// CAKeys are the keys certgen owns in the CA Secret; LeafKeys those in a role's Secret.
var (
	CAKeys   = []string{CACertKey, CAKeyKey, CABundleKey, NextCACertKey, NextCAKeyKey}
	LeafKeys = []string{CertKey, KeyKey, TrustBundleKey}
)

// IsPrivateKey reports whether key (of CAKeys or LeafKeys) holds a private key.
func IsPrivateKey(key string) bool { return key == CAKeyKey || key == NextCAKeyKey || key == KeyKey }

// CAData is the CA Secret's data for s: next-ca.* only during a rotation.
func (s State) CAData() map[string][]byte {
	d := map[string][]byte{CACertKey: s.CA.CertPEM, CAKeyKey: s.CA.KeyPEM, CABundleKey: s.BundlePEM}
	if !s.NextCA.empty() {
		d[NextCACertKey], d[NextCAKeyKey] = s.NextCA.CertPEM, s.NextCA.KeyPEM
	}
	return d
}

// SetCAData reads the CA Secret's data into s (missing keys are empty).
func (s *State) SetCAData(d map[string][]byte) {
	s.CA = KeyPair{CertPEM: d[CACertKey], KeyPEM: d[CAKeyKey]}
	s.NextCA = KeyPair{CertPEM: d[NextCACertKey], KeyPEM: d[NextCAKeyKey]}
	s.BundlePEM = d[CABundleKey]
}

// Data is a role Secret's data for l.
func (l Leaf) Data() map[string][]byte {
	return map[string][]byte{CertKey: l.CertPEM, KeyKey: l.KeyPEM, TrustBundleKey: l.BundlePEM}
}

// LeafFromData reads a role Secret's data (missing keys are empty).
func LeafFromData(d map[string][]byte) Leaf {
	return Leaf{CertPEM: d[CertKey], KeyPEM: d[KeyKey], BundlePEM: d[TrustBundleKey]}
}
