// Package testkit holds the helpers that the module's tests share: kernel
// namespaces for integration tests (Linux), a fixed resolver, a stub DNS server, a
// test certificate authority, and waiting for a log record. It is imported
// by tests only.
package testkit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/egresslog"
)

// Resolver answers lookups from a fixed table (names in lower case); an
// unknown name is not found. It implements netguard.Resolver.
type Resolver map[string][]netip.Addr

// LookupNetIP implements netguard.Resolver.
func (r Resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[strings.TrimSuffix(strings.ToLower(host), ".")]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// ListenDNS opens a UDP socket and a TCP listener on one loopback port,
// as a DNS server serves both.
func ListenDNS(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	// The UDP port's TCP twin may be taken (by a connection in TIME_WAIT,
	// say): try another pair.
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("no free UDP and TCP port pair on 127.0.0.1")
	return nil, nil
}

// ServeDNS serves h over UDP on pc and TCP on ln (either may be nil) until
// the test ends, returning once both serve.
func ServeDNS(t testing.TB, h dns.Handler, pc net.PacketConn, ln net.Listener) {
	t.Helper()
	var servers []*dns.Server
	if pc != nil {
		servers = append(servers, &dns.Server{PacketConn: pc, Handler: h})
	}
	if ln != nil {
		servers = append(servers, &dns.Server{Listener: ln, Handler: h})
	}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		failed := make(chan error, 1)
		go func() { failed <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-failed:
			t.Fatalf("stub DNS server: %v", err)
		}
		t.Cleanup(func() { srv.Shutdown() })
	}
}

// Zone is an authoritative DNS handler for a fixed set of names (lower
// case, without the final dot): A and AAAA queries get the addresses of
// their family, with a TTL of 60 s; other names get NXDOMAIN.
type Zone map[string][]netip.Addr

// ServeDNS implements dns.Handler.
func (z Zone) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	addrs, ok := z[strings.TrimSuffix(strings.ToLower(q.Name), ".")]
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
	for _, a := range addrs {
		switch {
		case q.Qtype == dns.TypeA && a.Is4():
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case q.Qtype == dns.TypeAAAA && a.Is6():
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	w.WriteMsg(m)
}

// CA issues server certificates for test servers.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	Pool *x509.CertPool // trusts Cert
}

// NewCA makes a CA valid for an hour either side of now.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, Pool: pool}
}

// Issue returns a server certificate for names (DNS names or IP
// addresses).
func (ca *CA) Issue(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// PEM is the CA certificate in PEM form.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// WaitRecord returns the first record of log, kept or new, that match
// accepts, following the log rather than polling it; it fails t after
// five seconds.
func WaitRecord(t testing.TB, log *egresslog.Log, match func(egresslog.Record) bool) egresslog.Record {
	t.Helper()
	fl := log.Follow(context.Background(), egresslog.Filter{}, 1024)
	defer fl.Close()
	for _, r := range log.List(egresslog.Filter{}, 0) {
		if match(r) {
			return r
		}
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case r := <-fl.C:
			if match(r) {
				return r
			}
		case <-timeout:
			t.Fatalf("no matching record; have %+v", log.List(egresslog.Filter{}, 0))
			return egresslog.Record{}
		}
	}
}
