package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

// viaTProxy runs a transparent proxy whose connections all go to the
// rig's upstream, handing api.test to the interceptor when intercept is
// set, and returns its address.
func (r *rig) viaTProxy(t testing.TB, intercept bool) string {
	p := &tproxy.Proxy{
		Agents:   func(netip.Addr) (string, *policy.Policy, bool) { return "a1", r.pol, true },
		Guard:    r.ic.Guard,
		Resolver: r.ic.Resolver,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
			return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort), nil
		},
	}
	if intercept {
		p.Interceptor = r.ic
	}
	ln, err := tproxy.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

// clientFor returns a client that trusts both the interception CA and the
// upstream's root, and dials addr for every request, over HTTP/1.1.
func (r *rig) clientFor(addr string, keepAlive bool) *http.Client {
	return r.clientProto(addr, keepAlive, false)
}

// clientProto is clientFor, over HTTP/2 when h2 is set.
func (r *rig) clientProto(addr string, keepAlive, h2 bool) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(r.ca.Cert)
	pool.AddCert(r.up.cert)
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		DisableKeepAlives: !keepAlive,
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func TestThroughTProxy(t *testing.T) {
	r := newRig(t)
	c := r.clientFor(r.viaTProxy(t, true), false)
	resp, body := r.get(c, "https://api.test/through", http.Header{"Authorization": {"Bearer " + r.ph}})
	if resp.StatusCode != 200 || r.upstreamHeader().Get("Authorization") != "Bearer "+secretValue {
		t.Fatalf("%d %q, upstream Authorization %q", resp.StatusCode, body, r.upstreamHeader().Get("Authorization"))
	}
	// other.test is not claimed: passed through untouched, the client
	// sees the upstream's own certificate and the placeholder stays.
	resp, _ = r.get(c, "https://other.test/through", http.Header{"Authorization": {"Bearer " + r.ph}})
	if resp.StatusCode != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "upstream test root" {
		t.Fatalf("passthrough: %d, issuer %q", resp.StatusCode, resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	if got := r.upstreamHeader().Get("Authorization"); got != "Bearer "+r.ph {
		t.Fatalf("a passed-through request was changed: %q", got)
	}
}

func BenchmarkMintLeaf(b *testing.B) {
	ca, err := NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for b.Loop() {
		if _, err := mintLeaf(ca, "api.example.com", now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewConnections opens b.N new TLS connections with one request
// each through the transparent proxy, intercepted and passed through,
// interleaved in rounds, and reports both rates and their ratio.
// Interception reuses pooled upstream connections.
func BenchmarkNewConnections(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientFor(r.viaTProxy(b, true), false)
	passthrough := r.clientFor(r.viaTProxy(b, false), false)
	run := func(c *http.Client, host string, n int) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					resp, err := c.Get("https://" + host + "/")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	var is, ps, ratios []float64
	per := max(b.N/5, 1)
	for range 5 {
		p := run(passthrough, "other.test", per)
		i := run(intercepted, "api.test", per)
		is, ps, ratios = append(is, i), append(ps, p), append(ratios, i/p)
	}
	b.ReportMetric(median(is), "intercepted-conn/s")
	b.ReportMetric(median(ps), "passthrough-conn/s")
	b.ReportMetric(median(ratios), "ratio")
}

// BenchmarkKeptAliveRequests sends b.N requests on one kept-alive
// connection, intercepted (through the transparent proxy) and directly
// to the upstream, interleaved, and reports both rates and their ratio.
func BenchmarkKeptAliveRequests(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientFor(r.viaTProxy(b, true), true)
	direct := r.clientFor(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String(), true)
	run := func(c *http.Client, n int) float64 {
		start := time.Now()
		for range n {
			resp, err := c.Get("https://api.test/")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return float64(n) / time.Since(start).Seconds()
	}
	run(intercepted, 10) // open both connections
	run(direct, 10)
	var is, ds, ratios []float64
	per := max(b.N/5, 1)
	for range 5 {
		d := run(direct, per)
		i := run(intercepted, per)
		is, ds, ratios = append(is, i), append(ds, d), append(ratios, i/d)
	}
	b.ReportMetric(median(is), "intercepted-req/s")
	b.ReportMetric(median(ds), "direct-req/s")
	b.ReportMetric(median(ratios), "ratio")
}

// BenchmarkMultiplexedRequests sends b.N requests, 16 at a time, as
// streams of one HTTP/2 connection, intercepted and direct, interleaved,
// and reports both rates and their ratio: the cost of interception when
// the machine, not the round trip, is the limit.
func BenchmarkMultiplexedRequests(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientProto(r.viaTProxy(b, true), true, true)
	direct := r.clientProto(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String(), true, true)
	run := func(c *http.Client, n int) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					resp, err := c.Get("https://api.test/")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	run(intercepted, 32)
	run(direct, 32)
	var is, ds, ratios []float64
	per := max(b.N/5, 1)
	for range 5 {
		d := run(direct, per)
		i := run(intercepted, per)
		is, ds, ratios = append(is, i), append(ds, d), append(ratios, i/d)
	}
	b.ReportMetric(median(is), "intercepted-req/s")
	b.ReportMetric(median(ds), "direct-req/s")
	b.ReportMetric(median(ratios), "ratio")
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
