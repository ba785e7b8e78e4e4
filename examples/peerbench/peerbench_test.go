// Package peerbench measures the library's explicit proxy beside Stripe's
// smokescreen and a minimal CONNECT relay, in one run, on loopback: new
// CONNECT tunnels, and TLS handshakes through a tunnel. Each proxy judges
// the target by name (an allowlist of one host), checks its address
// (loopback is let through for the run) and records nothing (the library's
// log off, smokescreen's at warnings); the library's quotas are off. It is
// a module of its own, so that smokescreen's dependencies never reach the
// library's.
//
//	cd examples/peerbench && go test -run X -bench . -benchtime 20000x
package peerbench

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/smokescreen/pkg/smokescreen"
	acl "github.com/stripe/smokescreen/pkg/smokescreen/acl/v1"
	"github.com/stripe/smokescreen/pkg/smokescreen/conntrack"

	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

// host is the one name every proxy allows, at the upstream's address.
const host = "bench.test"

// world is an upstream on loopback and the three proxies in front of it.
type world struct {
	up                   netip.AddrPort
	roots                *x509.CertPool
	ours, smoke, minimal string // the proxies' addresses
}

// newWorld starts an upstream that runs serve on each connection, and
// the three proxies.
func newWorld(tb testing.TB, serve func(net.Conn, tls.Certificate)) *world {
	cert, roots := selfSigned(tb)
	ln := listen(tb, "127.0.0.2:0")
	go acceptEach(ln, func(c net.Conn) { serve(c, cert) })
	up := netip.MustParseAddrPort(ln.Addr().String())
	return &world{up: up, roots: roots, ours: ours(tb, up.Addr()), smoke: smoke(tb, up.Addr()), minimal: minimal(tb, up.String())}
}

// ours runs the library's explicit proxy, allowing host (at addr) with no
// quota, and returns its address.
func ours(tb testing.TB, addr netip.Addr) string {
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(tb, err)
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{host + ":*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(tb, err)
	p := &tproxy.Proxy{
		Agents:   func(netip.Addr) (string, *policy.Policy, bool) { return "bench", pol, true },
		Guard:    guard,
		Resolver: resolver{addr},
		MaxConns: 1 << 20, MaxConnsPerAgent: 1 << 20, MaxExplicitConnsPerSource: 1 << 20,
	}
	ln := listen(tb, "127.0.0.1:0")
	go p.ServeExplicit(ln)
	tb.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

// smoke runs smokescreen, its ACL allowing host alone and its address
// checks letting loopback through, and returns its address.
func smoke(tb testing.TB, addr netip.Addr) string {
	conf := smokescreen.NewConfig()
	require.NoError(tb, conf.SetAllowRanges([]string{"127.0.0.0/8"}))
	conf.Resolver = resolver{addr}
	conf.Log.SetLevel(logrus.WarnLevel)
	conf.RoleFromRequest = func(*http.Request) (string, error) { return "bench", nil }
	conf.EgressACL = &acl.ACL{Rules: map[string]acl.Rule{}, DefaultRule: &acl.Rule{Project: "bench", Policy: acl.Enforce, DomainGlobs: []string{host}}}
	conf.ConnTracker = conntrack.NewTracker(conf.IdleTimeout, conf.MetricsClient, conf.Log, atomic.Value{}, nil)
	srv := &http.Server{Handler: smokescreen.BuildProxy(conf)}
	ln := listen(tb, "127.0.0.1:0")
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// minimal is the least a CONNECT proxy can do, as a yardstick: read the
// request, dial, answer, copy. No judgement, no address check, no record.
func minimal(tb testing.TB, up string) string {
	ln := listen(tb, "127.0.0.1:0")
	go acceptEach(ln, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		u, err := net.Dial("tcp", up)
		if err != nil {
			return
		}
		defer u.Close()
		io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		go func() { io.Copy(u, br); u.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, u)
	})
	return ln.Addr().String()
}

// resolver answers every name with one address, for both proxies.
type resolver struct{ addr netip.Addr }

func (r resolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{r.addr}, nil
}

func (r resolver) LookupIP(context.Context, string, string) ([]net.IP, error) {
	return []net.IP{r.addr.AsSlice()}, nil
}

func (r resolver) LookupPort(ctx context.Context, network, service string) (int, error) {
	return net.DefaultResolver.LookupPort(ctx, network, service)
}

// tunnel opens a CONNECT tunnel to host through proxy.
func (w *world) tunnel(proxy string) (net.Conn, error) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	target := fmt.Sprintf("%s:%d", host, w.up.Port())
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("CONNECT: %s", res.Status)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	if br.Buffered() > 0 {
		c.Close()
		return nil, fmt.Errorf("the proxy sent %d bytes past its answer", br.Buffered())
	}
	return c, nil
}

// handshake completes a TLS 1.3 handshake on c as a client of host.
func (w *world) handshake(c net.Conn) error {
	return tls.Client(c, &tls.Config{ServerName: host, RootCAs: w.roots, MinVersion: tls.VersionTLS13}).Handshake()
}

// echoByte is an upstream that answers one byte with itself.
func echoByte(c net.Conn, _ tls.Certificate) {
	defer c.Close()
	b := make([]byte, 1)
	if _, err := c.Read(b); err == nil {
		c.Write(b)
	}
}

// tlsServer is an upstream that completes a TLS 1.3 handshake and reads
// until the client closes.
func tlsServer(c net.Conn, cert tls.Certificate) {
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	defer tc.Close()
	if tc.Handshake() == nil {
		io.Copy(io.Discard, tc)
	}
}

// oneByte sends a byte on c and reads its echo. The byte is no letter: a
// first line that could still become an HTTP request line is held as one
// until it can be judged, and a lone letter could.
func oneByte(c net.Conn) error {
	if _, err := c.Write([]byte{0}); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 1))
	return err
}

// TestEachProxyTunnels: the comparison measures what it says: each proxy
// carries a tunnel to the allowed host, and smokescreen and ours refuse
// one to a host no rule allows.
func TestEachProxyTunnels(t *testing.T) {
	w := newWorld(t, tlsServer)
	for name, proxy := range map[string]string{"ours": w.ours, "smokescreen": w.smoke, "minimal": w.minimal} {
		c, err := w.tunnel(proxy)
		require.NoError(t, err, name)
		assert.NoError(t, w.handshake(c), name)
		c.Close()
	}
	for name, proxy := range map[string]string{"ours": w.ours, "smokescreen": w.smoke} {
		c, err := net.Dial("tcp", proxy)
		require.NoError(t, err)
		fmt.Fprintf(c, "CONNECT other.test:%d HTTP/1.1\r\nHost: other.test:%d\r\n\r\n", w.up.Port(), w.up.Port())
		res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		require.NoError(t, err, name)
		assert.NotEqual(t, http.StatusOK, res.StatusCode, "%s let a host no rule allows through", name)
		c.Close()
	}
}

// BenchmarkNewTunnels opens b.N CONNECT tunnels from 8 clients, each a
// new TCP connection with one byte each way, through each proxy in turn
// (five rounds, interleaved with direct connections), and reports
// tunnels per second and each proxy's ratio to the minimal relay.
func BenchmarkNewTunnels(b *testing.B) {
	w := newWorld(b, echoByte)
	compare(b, w, "conn/s", oneByte)
}

// BenchmarkTLSThroughTunnel opens b.N TLS 1.3 connections from 8
// clients, each a new TCP connection and a full handshake, through each
// proxy in turn (five rounds, interleaved with direct connections), and
// reports handshakes per second and each proxy's ratio to the minimal
// relay.
func BenchmarkTLSThroughTunnel(b *testing.B) {
	w := newWorld(b, tlsServer)
	compare(b, w, "handshakes/s", w.handshake)
}

// compare runs op on b.N new connections, a quarter each directly and
// through each proxy, in five rounds that take each in turn, and reports
// the rates (in unit) of the fastest round of each and the proxies'
// ratios to the minimal relay and to smokescreen.
func compare(b *testing.B, w *world, unit string, op func(net.Conn) error) {
	ways := []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"direct", func() (net.Conn, error) { return net.Dial("tcp", w.up.String()) }},
		{"ours", func() (net.Conn, error) { return w.tunnel(w.ours) }},
		{"smokescreen", func() (net.Conn, error) { return w.tunnel(w.smoke) }},
		{"minimal", func() (net.Conn, error) { return w.tunnel(w.minimal) }},
	}
	const rounds = 5
	per := max(b.N/len(ways)/rounds, 1)
	best := make([]float64, len(ways))
	b.ResetTimer()
	for range rounds {
		for i, way := range ways {
			best[i] = max(best[i], parallel(b, 8, per, func() error {
				c, err := way.dial()
				if err != nil {
					return err
				}
				defer c.Close()
				return op(c)
			}))
		}
	}
	for i, way := range ways {
		b.ReportMetric(best[i], way.name+"-"+unit)
	}
	b.ReportMetric(best[1]/best[3], "ours-vs-minimal")
	b.ReportMetric(best[2]/best[3], "smokescreen-vs-minimal")
	b.ReportMetric(best[1]/best[2], "ours-vs-smokescreen")
}

// parallel runs op n times from workers goroutines and returns how many
// it ran per second.
func parallel(b *testing.B, workers, n int, op func() error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if !assert.NoError(b, op()) { // not the benchmark's goroutine: no FailNow
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// selfSigned makes a certificate for host and a pool that trusts it.
func selfSigned(tb testing.TB) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}

func listen(tb testing.TB, addr string) net.Listener {
	ln, err := net.Listen("tcp", addr)
	require.NoError(tb, err)
	tb.Cleanup(func() { ln.Close() })
	return ln
}

func acceptEach(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go handle(c)
	}
}
