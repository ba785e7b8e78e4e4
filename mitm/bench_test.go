package mitm

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/redact"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

// viaTProxy runs a transparent proxy whose connections all go to the
// rig's upstream, handing api.test to the interceptor when intercept is
// set, and returns its address.
func (r *rig) viaTProxy(t testing.TB, intercept bool) string {
	return r.viaTProxyWith(t, intercept, r.ic.Guard, r.ic.Resolver)
}

// viaTProxyWith is viaTProxy with the proxy's own guard and resolver.
func (r *rig) viaTProxyWith(t testing.TB, intercept bool, guard *netguard.Guard, resolver netguard.Resolver) string {
	_, addr := r.tproxyWith(t, intercept, guard, resolver)
	return addr
}

// interceptingTProxy runs tproxy in front of the rig, intercepting, and
// returns it (for Rejudge and Forget) and its address.
func (r *rig) interceptingTProxy(t testing.TB) (*tproxy.Proxy, string) {
	return r.tproxyWith(t, true, r.ic.Guard, r.ic.Resolver)
}

// tproxyWith runs tproxy in front of the rig, whose upstream is every
// connection's original destination and whose current policy is agent
// a1's, and returns it and its address.
func (r *rig) tproxyWith(t testing.TB, intercept bool, guard *netguard.Guard, resolver netguard.Resolver) (*tproxy.Proxy, string) {
	p := &tproxy.Proxy{
		Agents:   func(netip.Addr) (string, *policy.Policy, bool) { return "a1", r.current(), true },
		Guard:    guard,
		Resolver: resolver,
		Log:      r.log,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
			return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort), nil
		},
	}
	if intercept {
		p.Interceptor = r.ic
	}
	ln, err := tproxy.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	return p, ln.Addr().String()
}

// clientFor returns a client that trusts both the interception CA and the
// upstream's root, and dials addr for every request, over HTTP/1.1.
func (r *rig) clientFor(addr string, keepAlive bool) *http.Client {
	return r.clientProto(addr, keepAlive, false)
}

// clientProto is clientFor, over HTTP/2 when h2 is set.
func (r *rig) clientProto(addr string, keepAlive, h2 bool) *http.Client {
	pool := rootPool(r.ca, r.upRoot)
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
	require.Equal(t, 200, resp.StatusCode, body)
	assert.Equal(t, "Bearer "+secretValue, r.upstreamHeader().Get("Authorization"), "upstream Authorization")
	// other.test is not claimed: passed through untouched, the client
	// sees the upstream's own certificate and the placeholder stays.
	resp, _ = r.get(c, "https://other.test/through", http.Header{"Authorization": {"Bearer " + r.ph}})
	require.Equal(t, 200, resp.StatusCode, "passthrough: status")
	assert.Equal(t, "upstream test root", resp.TLS.PeerCertificates[0].Issuer.CommonName, "passthrough: issuer")
	assert.Equal(t, "Bearer "+r.ph, r.upstreamHeader().Get("Authorization"), "a passed-through request was changed")
}

// TestInheritsTheProxysGuardAndResolver: an Interceptor without a Guard
// or a Resolver of its own dials with those of the proxy that hands it
// connections, instead of the host's resolver and the built-in
// classification (which would refuse this test's loopback upstream).
func TestInheritsTheProxysGuardAndResolver(t *testing.T) {
	r := newRig(t)
	guard, resolver := r.ic.Guard, r.ic.Resolver
	require.NotNil(t, guard)
	require.NotNil(t, resolver)
	r.ic.Guard, r.ic.Resolver = nil, nil // before the interceptor's first use
	addr := r.viaTProxyWith(t, true, guard, resolver)
	resp, body := r.get(r.clientFor(addr, false), "https://api.test/inherited", http.Header{"Authorization": {"Bearer " + r.ph}})
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "Bearer "+secretValue, r.upstreamHeader().Get("Authorization"))
}

// TestRequestsLinkToTheirConnection: the requests of an intercepted
// connection carry its ID, and an agent's byte counters count the
// connection's bytes once, not again for each request inside it.
func TestRequestsLinkToTheirConnection(t *testing.T) {
	r := newRig(t)
	c := r.clientFor(r.viaTProxy(t, true), true)
	for range 2 {
		resp, _ := r.get(c, "https://api.test/linked", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	c.CloseIdleConnections() // the connection ends, and is recorded
	conn := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Kind == egresslog.KindTLS })
	require.NotZero(t, conn.ConnID)
	var requests []egresslog.Record
	for _, rec := range r.log.List(egresslog.Filter{Kind: egresslog.KindHTTP}, 0) {
		if rec.Path == "/linked" {
			requests = append(requests, rec)
		}
	}
	require.Len(t, requests, 2)
	for _, rec := range requests {
		assert.Equal(t, conn.ConnID, rec.ConnID, "a request names the connection that carried it")
		assert.Positive(t, rec.BytesDown)
	}
	stats := r.log.Stats()["a1"]
	assert.Equal(t, uint64(conn.BytesDown), stats.BytesDown, "bytes counted once, with the connection")
	assert.Equal(t, uint64(conn.BytesUp), stats.BytesUp)
}

// TestClientRefusingTheLeafIsRecorded: a sandbox that does not trust the
// interception CA fails the handshake, and the connection's record says
// so, instead of a plain "intercepted".
func TestClientRefusingTheLeafIsRecorded(t *testing.T) {
	r := newRig(t)
	var logged strings.Builder
	r.ic.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logged}, nil))
	addr := r.viaTProxy(t, true)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: rootPool(r.upRoot)}) // not the interception CA
	err = tc.Handshake()
	tc.Close()
	require.Error(t, err)
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Kind == egresslog.KindTLS })
	assert.Contains(t, rec.Reason, "client TLS handshake")
	assert.Contains(t, rec.Reason, "certificate")
	assert.Contains(t, logged.String(), "does the sandbox trust the CA")
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func BenchmarkMintLeaf(b *testing.B) {
	ca, err := NewCA("bench")
	require.NoError(b, err)
	now := time.Now()
	for b.Loop() {
		// b.Fatal, not require, inside the timed loop: require calls
		// b.Helper (a lock and a stack walk) each time.
		if _, err := mintLeaf(ca, "api.example.com", now); err != nil {
			b.Fatal(err)
		}
	}
}

// getRate fetches url n times from workers goroutines and returns the
// requests per second.
func getRate(b *testing.B, c *http.Client, url string, n, workers int) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				resp, err := c.Get(url)
				if !assert.NoError(b, err) { // not the benchmark's goroutine: no FailNow
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

// compare runs base and measured in five interleaved rounds of b.N/5 and
// reports the median of each rate and of their ratio.
func compare(b *testing.B, unit, baseName, name string, base, measured func(n int) float64) {
	var bs, ms, ratios []float64
	per := max(b.N/5, 1)
	for range 5 {
		x := base(per)
		y := measured(per)
		bs, ms, ratios = append(bs, x), append(ms, y), append(ratios, y/x)
	}
	b.ReportMetric(median(ms), name+"-"+unit)
	b.ReportMetric(median(bs), baseName+"-"+unit)
	b.ReportMetric(median(ratios), "ratio")
}

// BenchmarkNewConnections opens b.N new TLS connections with one request
// each through the transparent proxy, intercepted and passed through,
// interleaved in rounds, and reports both rates and their ratio.
// Interception reuses pooled upstream connections.
func BenchmarkNewConnections(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientFor(r.viaTProxy(b, true), false)
	passthrough := r.clientFor(r.viaTProxy(b, false), false)
	compare(b, "conn/s", "passthrough", "intercepted",
		func(n int) float64 { return getRate(b, passthrough, "https://other.test/", n, 4) },
		func(n int) float64 { return getRate(b, intercepted, "https://api.test/", n, 4) })
}

// BenchmarkKeptAliveRequests sends b.N requests one after another on one
// kept-alive connection, intercepted (through the transparent proxy) and
// directly to the upstream, interleaved, and reports both rates and their
// ratio.
func BenchmarkKeptAliveRequests(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientFor(r.viaTProxy(b, true), true)
	direct := r.clientFor(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String(), true)
	getRate(b, intercepted, "https://api.test/", 10, 1) // open both connections
	getRate(b, direct, "https://api.test/", 10, 1)
	compare(b, "req/s", "direct", "intercepted",
		func(n int) float64 { return getRate(b, direct, "https://api.test/", n, 1) },
		func(n int) float64 { return getRate(b, intercepted, "https://api.test/", n, 1) })
}

// BenchmarkRulesOnlyHost sends b.N requests one after another on a
// kept-alive intercepted connection (through the transparent proxy) to a
// host intercepted only because request entries judge its requests, and
// to a credential host allowed in full, interleaved, and reports both
// rates and their ratio: what judging each request by method and path
// costs beside what interception costs anyway.
func BenchmarkRulesOnlyHost(b *testing.B) {
	r := newRig(b)
	var err error
	r.pol, err = policy.New(policy.Config{Allow: []string{"api.test:*", "GET,HEAD other.test:*/v1/items/*", "!DELETE other.test:*/**"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(b, err)
	proxy := r.viaTProxy(b, true)
	credential, rulesOnly := r.clientFor(proxy, true), r.clientFor(proxy, true)
	for _, x := range []struct {
		c           *http.Client
		method, url string
		status      int
	}{
		{credential, "GET", "https://api.test/v1/items/7", http.StatusOK},
		{rulesOnly, "GET", "https://other.test/v1/items/7", http.StatusOK},
		{rulesOnly, "DELETE", "https://other.test/v1/items/7", http.StatusForbidden}, // the entries are in force
	} {
		req, _ := http.NewRequest(x.method, x.url, nil)
		resp, err := x.c.Do(req)
		require.NoError(b, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(b, x.status, resp.StatusCode, "%s %s", x.method, x.url)
	}
	compare(b, "req/s", "credential", "rules-only",
		func(n int) float64 { return getRate(b, credential, "https://api.test/v1/items/7", n, 1) },
		func(n int) float64 { return getRate(b, rulesOnly, "https://other.test/v1/items/7", n, 1) })
}

// BenchmarkMultiplexedRequests sends b.N requests, 16 at a time, as
// streams of one HTTP/2 connection, intercepted and direct, interleaved,
// and reports both rates and their ratio: the cost of interception when
// the machine, not the round trip, is the limit.
func BenchmarkMultiplexedRequests(b *testing.B) {
	r := newRig(b)
	intercepted := r.clientProto(r.viaTProxy(b, true), true, true)
	direct := r.clientProto(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String(), true, true)
	getRate(b, intercepted, "https://api.test/", 32, 16)
	getRate(b, direct, "https://api.test/", 32, 16)
	compare(b, "req/s", "direct", "intercepted",
		func(n int) float64 { return getRate(b, direct, "https://api.test/", n, 16) },
		func(n int) float64 { return getRate(b, intercepted, "https://api.test/", n, 16) })
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// switchable turns a Redactor on and off between the rounds of a
// benchmark, so that both run through one interceptor.
type switchable struct {
	on atomic.Bool
	r  Redactor
}

func (s *switchable) Redactor(agent, host string) (*redact.Replacer, error) {
	if !s.on.Load() {
		return nil, nil
	}
	return s.r.Redactor(agent, host)
}

// BenchmarkRedactedDownload downloads 1 GiB of random bytes (a compressed
// archive, say) per operation from a host whose rule injects a secret,
// with the response redacted and without, interleaved, and reports both
// rates and their ratio.
func BenchmarkRedactedDownload(b *testing.B) {
	r := newRig(b)
	sw := &switchable{r: r.vault}
	r.ic.Redactor = sw
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	const size = 1 << 30
	r.mux.HandleFunc("/big", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	c := r.client(r.addr, false)
	c.Timeout = 0
	download := func(on bool) func(n int) float64 {
		return func(n int) float64 {
			sw.on.Store(on)
			start := time.Now()
			for range n {
				// b.Fatal, not require, inside the timed span: require
				// calls b.Helper (a lock and a stack walk) each time.
				resp, err := c.Get("https://api.test/big")
				if err != nil {
					b.Fatal(err)
				}
				got, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if got != size {
					b.Fatalf("downloaded %d bytes", got)
				}
			}
			return float64(n) * size / (1 << 20) / time.Since(start).Seconds()
		}
	}
	compare(b, "MB/s", "plain", "redacted", download(false), download(true))
}

// BenchmarkRedactedKeptAlive sends small requests one after another on a
// kept-alive intercepted connection, with responses redacted and without,
// interleaved, and reports both rates and their ratio.
func BenchmarkRedactedKeptAlive(b *testing.B) {
	r := newRig(b)
	sw := &switchable{r: r.vault}
	r.ic.Redactor = sw
	c := r.client(r.addr, false)
	getRate(b, c, "https://api.test/", 10, 1)
	rate := func(on bool) func(n int) float64 {
		return func(n int) float64 {
			sw.on.Store(on)
			return getRate(b, c, "https://api.test/", n, 1)
		}
	}
	compare(b, "req/s", "plain", "redacted", rate(false), rate(true))
}

// TestUpstreamProcess is not a test: it is the upstream of
// BenchmarkIdleInterceptedMemory, in a process of its own, so that its
// connections' memory is not counted as the gateway's.
func TestUpstreamProcess(t *testing.T) {
	dir := os.Getenv("MITM_BENCH_UPSTREAM")
	if dir == "" {
		t.Skip("the upstream process of BenchmarkIdleInterceptedMemory; not run on its own")
	}
	ca, err := LoadOrCreateCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), "upstream")
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		TLSConfig: &tls.Config{GetCertificate: upstreamCert(ca), NextProtos: []string{"h2", "http/1.1"}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(ln, "", "")
	fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
	io.Copy(io.Discard, os.Stdin) // until the benchmark closes stdin or kills us
	srv.Close()
}

// BenchmarkIdleInterceptedMemory holds b.N idle HTTP/2 connections, each
// after one request, directly to an upstream in another process and
// intercepted on their way to it, and reports what an intercepted
// connection costs the gateway: its client-side TLS, its HTTP/2 server
// state, the proxy's session, and its share of the upstream pool. The
// clients are in this process both times, and cancel out.
func BenchmarkIdleInterceptedMemory(b *testing.B) {
	r := newRig(b)
	dir := b.TempDir()
	upRoot, err := LoadOrCreateCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), "upstream")
	require.NoError(b, err)
	r.upRoot, r.ic.RootCAs = upRoot, rootPool(upRoot)
	exe, err := os.Executable()
	require.NoError(b, err)
	child := exec.Command(exe, "-test.run=^TestUpstreamProcess$", "-test.count=1")
	child.Env = append(os.Environ(), "MITM_BENCH_UPSTREAM="+dir)
	stdout, err := child.StdoutPipe()
	require.NoError(b, err)
	stdin, err := child.StdinPipe()
	require.NoError(b, err)
	require.NoError(b, child.Start())
	b.Cleanup(func() { stdin.Close(); child.Process.Kill(); child.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(b, err)
	port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "PORT ")))
	require.NoError(b, err, "the upstream process said %q", line)
	r.upPort = uint16(port)

	intercepted := r.viaTProxy(b, true)
	direct := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String()
	hold := func(addr string) (goBytes, rssBytes float64, closeAll func()) {
		runtime.GC()
		goBefore, rssBefore := testkit.GoMemory(), testkit.RSS()
		clients := make([]*http.Client, 0, b.N)
		for range b.N {
			c := r.clientProto(addr, true, true)
			resp, err := c.Get("https://api.test/")
			require.NoError(b, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			clients = append(clients, c)
		}
		runtime.GC()
		goAfter, rssAfter := testkit.GoMemory(), testkit.RSS()
		return float64(goAfter) - float64(goBefore), float64(rssAfter) - float64(rssBefore), func() {
			for _, c := range clients {
				c.CloseIdleConnections()
			}
		}
	}
	directGo, directRSS, closeDirect := hold(direct)
	closeDirect()
	icGo, icRSS, closeIntercepted := hold(intercepted)
	defer closeIntercepted()
	n := float64(b.N) * 1024
	b.ReportMetric((icGo-directGo)/n, "gateway-go-KiB/conn")
	b.ReportMetric((icRSS-directRSS)/n, "gateway-rss-KiB/conn")
}

// BenchmarkSSEFirstEvent measures, b.N times, the time from sending a
// request to the first byte of a server-sent event stream (the server
// answers, then sends the event 1 ms later), intercepted and direct, on
// kept-alive connections, and reports the medians and what interception
// adds.
func BenchmarkSSEFirstEvent(b *testing.B) {
	r := newRig(b)
	r.mux.HandleFunc("/events", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		time.Sleep(time.Millisecond)
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
	})
	intercepted := r.clientFor(r.viaTProxy(b, true), true)
	direct := r.clientFor(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort).String(), true)
	first := func(c *http.Client) time.Duration {
		start := time.Now()
		resp, err := c.Get("https://api.test/events")
		require.NoError(b, err)
		defer resp.Body.Close()
		buf := make([]byte, 1)
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(b, err)
		took := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		return took
	}
	first(intercepted) // open both connections
	first(direct)
	var d, ic []float64
	for range b.N {
		d = append(d, float64(first(direct).Microseconds()))
		ic = append(ic, float64(first(intercepted).Microseconds()))
	}
	b.ReportMetric(median(d), "direct-p50-µs")
	b.ReportMetric(median(ic), "intercepted-p50-µs")
	b.ReportMetric(median(ic)-median(d), "added-p50-µs")
}
