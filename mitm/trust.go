package mitm

import (
	"bytes"
	"fmt"
	"os"
)

// systemBundles are where Linux distributions keep their bundle of
// trusted roots (the list crypto/x509 reads too).
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Gentoo, Arch, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine
}

// Bundle returns the system's trusted roots followed by the CA, in PEM:
// the file to point SSL_CERT_FILE and its kin at, so that hosts passed
// through untouched still verify.
func (ca *CA) Bundle() ([]byte, error) {
	for _, path := range systemBundles {
		roots, err := os.ReadFile(path)
		if err == nil && len(bytes.TrimSpace(roots)) > 0 {
			var b bytes.Buffer
			b.Write(bytes.TrimRight(roots, "\n"))
			b.WriteString("\n")
			b.Write(ca.pem)
			return b.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("mitm: no system root bundle found (looked in %v)", systemBundles)
}

// Env returns the environment variables that point common tools at the
// trust files inside a sandbox: the bundle (system roots plus the CA) for
// OpenSSL, Python requests, curl, git and the AWS SDKs, and the CA alone
// for Node.js, which adds NODE_EXTRA_CA_CERTS to its own roots.
func Env(bundlePath, caPath string) []string {
	return []string{
		"SSL_CERT_FILE=" + bundlePath,
		"NODE_EXTRA_CA_CERTS=" + caPath,
		"REQUESTS_CA_BUNDLE=" + bundlePath,
		"CURL_CA_BUNDLE=" + bundlePath,
		"GIT_SSL_CAINFO=" + bundlePath,
		"AWS_CA_BUNDLE=" + bundlePath,
	}
}
