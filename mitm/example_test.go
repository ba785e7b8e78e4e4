package mitm_test

import (
	"crypto/x509"
	"fmt"

	"github.com/agenthold/egress/mitm"
)

func ExampleLeaves() {
	ca, err := mitm.NewCA("per-sandbox CA") // in memory; LoadOrCreateCA persists one
	if err != nil {
		panic(err)
	}
	leaves := &mitm.Leaves{CA: ca}
	cert, err := leaves.Get("api.github.com")
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err = cert.Leaf.Verify(x509.VerifyOptions{DNSName: "api.github.com", Roots: roots})
	fmt.Println(cert.Leaf.DNSNames, "verifies against the CA:", err == nil)
	again, _ := leaves.Get("api.github.com")
	fmt.Println("cached:", again == cert)
	// Output:
	// [api.github.com] verifies against the CA: true
	// cached: true
}
