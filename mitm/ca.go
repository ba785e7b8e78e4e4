package mitm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// CA is the certificate authority the sandboxes trust for intercepted
// hosts: an ECDSA P-256 key and a self-signed certificate.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	pem  []byte
}

// NewCA creates a CA in memory, never written anywhere: one per sandbox,
// as the sidecar does.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"egress interception CA"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("mitm: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mitm: create CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadOrCreateCA loads the CA from certPath and keyPath, creating both on
// first start (the certificate 0644, the key 0600, their directory 0700).
// An existing but damaged, mismatched or over-readable CA is an error: it
// is never silently replaced, since every sandbox trusts it.
func LoadOrCreateCA(certPath, keyPath, name string) (*CA, error) {
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		return loadCA(certPath, keyPath)
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
	case certErr != nil && !errors.Is(certErr, fs.ErrNotExist):
		return nil, fmt.Errorf("mitm: CA certificate: %w", certErr)
	case keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist):
		return nil, fmt.Errorf("mitm: CA key: %w", keyErr)
	default:
		return nil, fmt.Errorf("mitm: only one of %s and %s exists; restore the other or remove both", certPath, keyPath)
	}
	ca, err := NewCA(name)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA key: %w", err)
	}
	for _, dir := range []string{filepath.Dir(certPath), filepath.Dir(keyPath)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("mitm: %w", err)
		}
	}
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(certPath, ca.pem, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("mitm: %w", err)
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	if err := errors.Join(werr, serr, f.Close()); err != nil {
		return fmt.Errorf("mitm: write %s: %w", path, err)
	}
	return nil
}

func loadCA(certPath, keyPath string) (*CA, error) {
	fi, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("mitm: CA key %s has mode %v; it must be readable by its owner only (chmod 600)", keyPath, fi.Mode().Perm())
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("mitm: %s is not a PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mitm: %s: %w", certPath, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("mitm: %s is not a PEM EC private key", keyPath)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mitm: %s: %w", keyPath, err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("mitm: %s does not belong to %s", keyPath, certPath)
	}
	if !cert.IsCA || time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("mitm: %s is not a valid CA certificate (CA=%v, expires %s)", certPath, cert.IsCA, cert.NotAfter.Format(time.DateOnly))
	}
	return &CA{Cert: cert, Key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// PEM returns the CA certificate in PEM form, for the sandbox.
func (ca *CA) PEM() []byte { return append([]byte(nil), ca.pem...) }

func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("mitm: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}
