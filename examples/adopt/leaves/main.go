// Command leaves uses mitm's CA and leaves alone: a per-sandbox CA in
// memory and a leaf for a host that verifies against it.
package main

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/agenthold/egress/mitm"
)

func main() {
	ca, err := mitm.NewCA("adopt CA")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	cert, err := (&mitm.Leaves{CA: ca}).Get("api.github.com")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err = cert.Leaf.Verify(x509.VerifyOptions{DNSName: "api.github.com", Roots: roots})
	fmt.Println("api.github.com leaf verifies:", err == nil)
}
