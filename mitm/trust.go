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

// NodeExtra returns the CA followed by extraRoots (PEM: the roots the
// gateway trusts for upstream servers beyond the system's, if any): the
// file NODE_EXTRA_CA_CERTS names. Node.js adds that file to its built-in
// roots and never reads the system bundle, so a host passed through
// whose chain ends at an extra root verifies only if the root is here.
func (ca *CA) NodeExtra(extraRoots []byte) []byte {
	var b bytes.Buffer
	b.Write(ca.pem)
	if extra := bytes.TrimSpace(extraRoots); len(extra) > 0 {
		b.WriteByte('\n')
		b.Write(extra)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Env returns the environment variables that point common tools at the
// trust files inside a sandbox:
//
//	variable             file        read by
//	SSL_CERT_FILE        bundle      OpenSSL (curl, Python's ssl, Ruby), Go
//	REQUESTS_CA_BUNDLE   bundle      Python requests
//	CURL_CA_BUNDLE       bundle      curl
//	GIT_SSL_CAINFO       bundle      git
//	AWS_CA_BUNDLE        bundle      the AWS SDKs and CLI
//	PIP_CERT             bundle      pip
//	NPM_CONFIG_CAFILE    bundle      npm (which replaces its roots with it)
//	CARGO_HTTP_CAINFO    bundle      cargo
//	NODE_EXTRA_CA_CERTS  nodeExtra   Node.js (added to its built-in roots)
//
// bundlePath holds the system roots, the extra upstream roots and the CA
// (Bundle); nodeExtraPath the CA and the extra roots alone (NodeExtra).
func Env(bundlePath, nodeExtraPath string) []string {
	return []string{
		"SSL_CERT_FILE=" + bundlePath,
		"REQUESTS_CA_BUNDLE=" + bundlePath,
		"CURL_CA_BUNDLE=" + bundlePath,
		"GIT_SSL_CAINFO=" + bundlePath,
		"AWS_CA_BUNDLE=" + bundlePath,
		"PIP_CERT=" + bundlePath,
		"NPM_CONFIG_CAFILE=" + bundlePath,
		"CARGO_HTTP_CAINFO=" + bundlePath,
		"NODE_EXTRA_CA_CERTS=" + nodeExtraPath,
	}
}
