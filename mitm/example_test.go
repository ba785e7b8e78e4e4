package mitm_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"

	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/vault"
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

// Interception with injection, composed with vault: the sandbox sends a
// placeholder to example.com; the upstream (an httptest server, declared
// public) sees the real key; the sandbox never does, not even when the
// upstream echoes it back.
func ExampleInterceptor() {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-live-123" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "authorized; you sent %s\n", r.Header.Get("Authorization"))
	}))
	defer upstream.Close()
	upstreamRoots := x509.NewCertPool()
	upstreamRoots.AddCert(upstream.Certificate())

	// The vault holds the key; the agent gets a placeholder.
	key, err := vault.NewKey()
	if err != nil {
		panic(err)
	}
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{})
	if err != nil {
		panic(err)
	}
	rule := vault.Rule{Hosts: []string{"example.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"}
	if err := v.Set(vault.Secret{Name: "api", Rule: rule}, []byte("sk-live-123")); err != nil {
		panic(err)
	}
	att, err := v.AttachPlaceholder("agent-1", "api", "API_KEY", "example-placeholder-0001")
	if err != nil {
		panic(err)
	}

	ca, _ := mitm.NewCA("example CA")
	guard, _ := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	ic := &mitm.Interceptor{
		Leaves: &mitm.Leaves{CA: ca}, Claim: v.Covers, Injector: v,
		Guard: guard, Resolver: oneHost{"example.com": netip.MustParseAddr("127.0.0.1")}, RootCAs: upstreamRoots,
	}
	defer ic.CloseIdleConnections()
	pol, _ := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"example.com:*"}})

	// Each connection to ln stands in for one tproxy hands over.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	_, upPort, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	port, _ := strconv.Atoi(upPort)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go ic.Intercept(context.Background(), c, "agent-1", func() *policy.Policy { return pol }, "example.com", uint16(port))
		}
	}()

	// The sandbox trusts the CA and knows only the placeholder.
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AddCert(ca.Cert)
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: sandboxRoots},
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) },
	}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "https://example.com/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+att.Placeholder)
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(string(body))
	// Output: authorized; you sent Bearer example-placeholder-0001
}

// oneHost is a fixed resolver, standing in for the gateway's DNS.
type oneHost map[string]netip.Addr

func (o oneHost) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := o[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
