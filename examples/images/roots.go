package main

import (
	"bytes"
	"encoding/pem"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// rootsPEM is the images' /etc/ssl/certs/ca-certificates.crt: the NSS
// roots of the pinned x509roots/fallback, in its order. A root that NSS
// trusts only with a constraint (certificates issued up to a date) is
// left out: a PEM bundle cannot carry the constraint, and trusting the
// root without it would trust more than NSS does.
func rootsPEM() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return b.Bytes()
}
