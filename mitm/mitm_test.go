package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/vault"
	"github.com/agenthold/egress/vault/awssig"
)

const secretValue = "sk-live-7f3c9d1e2b4a60581f2e3d4c5b6a7980" // the value that must never leak

// upstreamCert serves the test upstream's certificates, minted by its own
// root (which the interceptor trusts) for the names it holds: any other
// name gets api.test's certificate, which the interceptor must refuse.
func upstreamCert(root *CA) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	leaves := &Leaves{CA: root}
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		switch {
		case hello.ServerName == "api.test", hello.ServerName == "other.test", hello.ServerName == "open.test", hello.ServerName == "mcp.test",
			strings.HasSuffix(hello.ServerName, ".amazonaws.com"), strings.HasSuffix(hello.ServerName, "github.com"):
			return leaves.Get(hello.ServerName)
		}
		return leaves.Get("api.test")
	}
}

// rootPool trusts the given CAs.
func rootPool(cas ...*CA) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca.Cert)
	}
	return pool
}

// rig is an interceptor in front of a real HTTPS upstream on 127.0.0.2,
// with a real vault. Connections to rig.addr are intercepted as host
// api.test for agent a1 (standing in for tproxy's hand-over; one test
// goes through tproxy itself).
type rig struct {
	t        testing.TB
	ic       *Interceptor
	ca       *CA
	vault    *vault.Vault
	log      *egresslog.Log
	pol      *policy.Policy                // the agent's policy, set before serving
	changed  atomic.Pointer[policy.Policy] // a policy set while serving, if any
	upRoot   *CA                           // signs the upstream's certificates
	upPort   uint16
	addr     string // where the sandbox connects
	ph       string // a1's placeholder for the secret
	upHeader atomic.Pointer[http.Header]
	upQuery  atomic.Pointer[string]
	mux      *http.ServeMux
}

func newRig(t testing.TB) *rig {
	r := &rig{t: t, log: &egresslog.Log{}, mux: http.NewServeMux()}
	var err error
	r.ca, err = NewCA("mitm test")
	require.NoError(t, err)
	r.upRoot, err = NewCA("upstream test root")
	require.NoError(t, err)
	r.mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		h := req.Header.Clone()
		r.upHeader.Store(&h)
		q := req.URL.RawQuery
		r.upQuery.Store(&q)
		fmt.Fprintf(w, "upstream saw host=%s proto=%s", req.Host, req.Proto)
	})
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	r.upPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	upSrv := &http.Server{Handler: r.mux, ErrorLog: log.New(io.Discard, "", 0), TLSConfig: &tls.Config{GetCertificate: upstreamCert(r.upRoot), NextProtos: []string{"h2", "http/1.1"}}}
	go upSrv.ServeTLS(ln, "", "")
	t.Cleanup(func() { upSrv.Close() })

	r.vault, err = vault.Open(vault.FileStorage{Path: filepath.Join(t.TempDir(), "v.json")}, bytes.Repeat([]byte{7}, vault.KeySize), vault.Config{PlaceholderPrefix: "test", SigV4: awssig.Signer{}})
	require.NoError(t, err)
	require.NoError(t, r.vault.Set(vault.Secret{Name: "api", Rule: vault.Rule{Hosts: []string{"api.test"}, Header: "Authorization", Template: "Bearer {{.Value}}"}}, []byte(secretValue)))
	a, err := r.vault.Attach("a1", "api", "API_KEY")
	require.NoError(t, err)
	r.ph = a.Placeholder
	// No connection quota: the benchmarks open connections as fast as they can.
	r.pol, err = policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*", "other.test:*", "broken.test:*", "selfsigned.test:*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	guard, _ := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	r.ic = &Interceptor{
		Leaves:   &Leaves{CA: r.ca},
		Claim:    func(agent, host string) bool { return agent == "a1" && host == "api.test" },
		Injector: r.vault,
		Guard:    guard,
		Resolver: testkit.Resolver{"api.test": loop, "other.test": loop, "broken.test": loop, "selfsigned.test": {netip.MustParseAddr("127.0.0.3")}},
		RootCAs:  rootPool(r.upRoot),
		Log:      r.log,
	}
	t.Cleanup(func() { r.ic.CloseIdleConnections() })
	r.addr = r.serveIntercepted("api.test")
	return r
}

// serveIntercepted accepts connections and intercepts each as host.
func (r *rig) serveIntercepted(host string) string {
	return r.serveInterceptedTo(host, r.upPort)
}

// serveInterceptedTo is serveIntercepted for an upstream on another port
// of 127.0.0.2.
func (r *rig) serveInterceptedTo(host string, port uint16) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(r.t, err)
	r.t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.ic.Intercept(ctx, c, "a1", r.current, host, port)
		}
	}()
	return ln.Addr().String()
}

// current is agent a1's policy now: the one a test changed it to while
// serving, or the one it was set up with.
func (r *rig) current() *policy.Policy {
	if p := r.changed.Load(); p != nil {
		return p
	}
	return r.pol
}

// client returns an HTTP client that trusts the interception CA and
// connects every request to addr.
func (r *rig) client(addr string, h2 bool) *http.Client {
	pool := rootPool(r.ca)
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	r.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (r *rig) get(c *http.Client, rawURL string, header http.Header) (*http.Response, string) {
	r.t.Helper()
	req, _ := http.NewRequest("GET", rawURL, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	require.NoError(r.t, err, "GET %s", rawURL)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (r *rig) upstreamHeader() http.Header {
	if h := r.upHeader.Load(); h != nil {
		return *h
	}
	return nil
}

func TestInjectHTTP1AndHTTP2(t *testing.T) {
	r := newRig(t)
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			resp, body := r.get(r.client(r.addr, h2), "https://api.test/v1/x?q="+r.ph, http.Header{"X-Extra": {"id " + r.ph}})
			wantProto := "HTTP/1.1"
			if h2 {
				wantProto = "HTTP/2.0"
			}
			require.Equal(t, 200, resp.StatusCode, body)
			require.Equal(t, wantProto, resp.Proto, body)
			require.Contains(t, body, "host=api.test")
			h := r.upstreamHeader()
			assert.Equal(t, "Bearer "+secretValue, h.Get("Authorization"), "upstream Authorization")
			assert.Equal(t, "id "+secretValue, h.Get("X-Extra"), "upstream X-Extra")
			assert.Equal(t, "q="+secretValue, *r.upQuery.Load(), "upstream query")
			rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/v1/x" && rec.Status == 200 })
			assert.True(t, rec.Allowed, "record %+v", rec)
			assert.Equal(t, "api", rec.Secret, "record %+v", rec)
			assert.Equal(t, "api.test", rec.Host, "record %+v", rec)
			assert.Equal(t, "GET", rec.Method, "record %+v", rec)
			assert.NotZero(t, rec.BytesDown, "record %+v", rec)
		})
	}
}

func (r *rig) waitRecord(f func(egresslog.Record) bool) egresslog.Record {
	r.t.Helper()
	return testkit.WaitRecord(r.t, r.log, f)
}

func TestCurlThroughInterception(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("requires curl (apt-get install curl)")
	}
	r := newRig(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, r.ca.PEM(), 0o644)
	_, port, _ := net.SplitHostPort(r.addr)
	for _, proto := range []string{"--http1.1", "--http2"} {
		out, err := exec.Command("curl", "-sS", proto, "--cacert", caFile, "--resolve", "api.test:"+port+":127.0.0.1",
			"-H", "Authorization: Bearer "+r.ph, "https://api.test:"+port+"/curl").CombinedOutput()
		require.NoError(t, err, "curl %s: %s", proto, out)
		require.Contains(t, string(out), "host=api.test", "curl %s", proto)
		assert.Equal(t, "Bearer "+secretValue, r.upstreamHeader().Get("Authorization"), "curl %s: upstream Authorization", proto)
	}
}

func TestServerSentEventsStream(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	r.mux.HandleFunc("/events", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-release // the response goes on until the client has the first event
		fmt.Fprintf(w, "data: second\n\n")
	})
	for _, h2 := range []bool{false, true} {
		resp, err := r.client(r.addr, h2).Get("https://api.test/events")
		require.NoError(t, err)
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		require.NoError(t, err, "h2=%v: first event %q", h2, line)
		require.Equal(t, "data: first\n", line, "h2=%v: first event", h2)
		release <- struct{}{}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		assert.Contains(t, string(rest), "data: second", "h2=%v: rest", h2)
	}
}

func TestWebSocketEcho(t *testing.T) {
	r := newRig(t)
	r.mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	pool := rootPool(r.ca)
	cfg, err := websocket.NewConfig("wss://api.test/ws", "https://api.test/")
	require.NoError(t, err)
	cfg.TlsConfig = &tls.Config{RootCAs: pool, ServerName: "api.test"}
	cfg.Dialer = &net.Dialer{}
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	tc := tls.Client(raw, cfg.TlsConfig)
	ws, err := websocket.NewClient(cfg, tc)
	require.NoError(t, err, "websocket handshake")
	defer ws.Close()
	for _, msg := range []string{"hello", "world"} {
		require.NoError(t, websocket.Message.Send(ws, msg))
		var got string
		ws.SetDeadline(time.Now().Add(5 * time.Second))
		err := websocket.Message.Receive(ws, &got)
		require.NoError(t, err, "echo %q: %q", msg, got)
		assert.Equal(t, msg, got, "echo")
	}
}

// TestLargeDownloadFlatMemory moves 1 GiB through the interceptor and
// checks that the heap stays small while it flows.
func TestLargeDownloadFlatMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB")
	}
	r := newRig(t)
	const size = 1 << 30
	chunk := make([]byte, 1<<20)
	r.mux.HandleFunc("/big", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for i := 0; i < size/len(chunk); i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	c := r.client(r.addr, false)
	c.Timeout = 0 // the body may take a while under the race detector
	resp, err := c.Get("https://api.test/big")
	require.NoError(t, err)
	defer resp.Body.Close()
	var peak uint64
	buf := make([]byte, 256<<10)
	var n int64
	for {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		if n%(64<<20) < int64(m) {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
		if err != nil {
			break
		}
	}
	assert.Equal(t, int64(size), n, "bytes downloaded")
	assert.LessOrEqual(t, peak, uint64(64<<20), "heap reached %d MiB while streaming 1 GiB", peak>>20)
	t.Logf("peak heap in use while streaming 1 GiB: %d MiB", peak>>20)
}

func TestBadUpstreamCertificates(t *testing.T) {
	r := newRig(t)
	// broken.test resolves to the upstream, whose certificate does not
	// name it.
	brokenAddr := r.serveIntercepted("broken.test")
	resp, body := r.get(r.client(brokenAddr, false), "https://broken.test/", nil)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "wrong-name upstream: %q", body)
	assert.Contains(t, body, "certificate", "wrong-name upstream")
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Host == "broken.test" })
	assert.Contains(t, rec.Reason, "certificate", "record %+v", rec)
	assert.Equal(t, http.StatusBadGateway, rec.Status, "record %+v", rec)
	// selfsigned.test is a server with a certificate no root vouches for.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), DNSNames: []string{"selfsigned.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.3:%d", r.upPort))
	if err != nil {
		t.Skipf("cannot listen on the upstream's port at 127.0.0.3: %v", err)
	}
	srv := &http.Server{Handler: r.mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	selfAddr := r.serveIntercepted("selfsigned.test")
	resp, body = r.get(r.client(selfAddr, false), "https://selfsigned.test/", nil)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "self-signed upstream: %q", body)
	assert.Contains(t, body, "certificate", "self-signed upstream")
}

func TestHostMismatchJudgedOnItsOwn(t *testing.T) {
	r := newRig(t)
	c := r.client(r.addr, false)
	// SNI api.test, Host other.test: allowed by policy, but no rule names
	// other.test, so the placeholder goes out unchanged.
	resp, body := r.get(c, "https://api.test/", http.Header{"Authorization": {"Bearer " + r.ph}})
	require.Equal(t, 200, resp.StatusCode, body)
	req, _ := http.NewRequest("GET", "https://api.test/mismatch", nil)
	req.Host = "other.test"
	req.Header.Set("Authorization", "Bearer "+r.ph)
	resp2, err := c.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	require.Equal(t, 200, resp2.StatusCode, "status")
	assert.Equal(t, "Bearer "+r.ph, r.upstreamHeader().Get("Authorization"), "the credential reached a host its rule does not name")
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/mismatch" })
	assert.Empty(t, rec.Secret, "record %+v", rec)
	assert.Equal(t, ReasonHostMismatch, rec.Reason, "record %+v", rec)
	assert.Equal(t, "other.test", rec.Host, "record %+v", rec)
	// A Host the policy denies gets 403.
	req, _ = http.NewRequest("GET", "https://api.test/denied", nil)
	req.Host = "evil.test"
	resp3, err := c.Do(req)
	require.NoError(t, err)
	resp3.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp3.StatusCode, "denied Host")
}

// TestCoalescedHTTP2 sends, on one HTTP/2 connection opened for api.test,
// a request whose :authority is another host, as connection coalescing
// would.
func TestCoalescedHTTP2(t *testing.T) {
	r := newRig(t)
	pool := rootPool(r.ca)
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		Protocols:       &protos,
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", r.addr)
		},
	}
	cc, err := tr.NewClientConn(context.Background(), "https", "api.test:443")
	require.NoError(t, err)
	defer cc.Close()
	for _, tt := range []struct {
		authority string
		status    int
		auth      string
	}{
		{"api.test", 200, "Bearer " + secretValue},
		{"other.test", 200, "Bearer " + r.ph},
		{"evil.test", 403, ""},
	} {
		req, _ := http.NewRequest("GET", "https://"+tt.authority+"/coalesced", nil)
		req.Header.Set("Authorization", "Bearer "+r.ph)
		r.upHeader.Store(nil)
		resp, err := cc.RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, tt.status, resp.StatusCode, ":authority %s: status", tt.authority)
		assert.Equal(t, tt.auth, r.upstreamHeader().Get("Authorization"), ":authority %s: upstream Authorization", tt.authority)
	}
}

// TestSecretNeverLeaks pushes the secret through success, upstream
// failure and refusal, and looks for it in every record and every answer.
func TestSecretNeverLeaks(t *testing.T) {
	r := newRig(t)
	var sink strings.Builder
	var mu sync.Mutex
	r.log.Sinks = nil // the log was made without sinks; scan its records instead
	c := r.client(r.addr, false)
	var answers []string
	_, body := r.get(c, "https://api.test/ok?key="+r.ph, http.Header{"X-Key": {r.ph}})
	answers = append(answers, body)
	// An upstream failure after injection: the URL (with the secret in
	// its query) must not appear in the error.
	r.ic.CloseIdleConnections() // no pooled connection to the old address
	r.ic.Resolver.(testkit.Resolver)["api.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.4")}
	resp, body := r.get(c, "https://api.test/fail?key="+r.ph, nil)
	answers = append(answers, body)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "status")
	// Refused by netguard.
	r.ic.CloseIdleConnections()
	r.ic.Resolver.(testkit.Resolver)["api.test"] = []netip.Addr{netip.MustParseAddr("169.254.169.254")}
	_, body = r.get(c, "https://api.test/meta?key="+r.ph, nil)
	answers = append(answers, body)
	r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/meta" })
	mu.Lock()
	defer mu.Unlock()
	for _, rec := range r.log.List(egresslog.Filter{}, 0) {
		sink.Write(rec.AppendJSON(nil))
	}
	for i, a := range append(answers, sink.String()) {
		assert.NotContains(t, a, secretValue, "the secret leaked into output %d", i)
	}
	assert.Contains(t, sink.String(), `"secret":"api"`, "records do not name the injected secret")
}

func TestLeavesCache(t *testing.T) {
	ca, _ := NewCA("leaf test")
	l := &Leaves{CA: ca, Size: 3, TTL: time.Hour}
	var wg sync.WaitGroup
	certs := make([]*tls.Certificate, 32)
	for i := range certs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := l.Get("new.example")
			assert.NoError(t, err) // not the test's goroutine: no FailNow
			certs[i] = c
		}()
	}
	wg.Wait()
	// require: the rest of the test takes certs[0] as the cached leaf.
	for _, c := range certs[1:] {
		require.Same(t, certs[0], c, "a new host was minted more than once under concurrent demand")
	}
	leaf := certs[0].Leaf
	pool := rootPool(ca)
	_, err := leaf.Verify(x509.VerifyOptions{DNSName: "new.example", Roots: pool})
	assert.NoError(t, err, "leaf does not verify for its host")
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "other.example", Roots: pool})
	assert.Error(t, err, "leaf verifies for another host")
	assert.False(t, leaf.PublicKey.(*ecdsa.PublicKey).Equal(&ca.Key.PublicKey), "leaf reuses the CA key")
	assert.LessOrEqual(t, time.Until(leaf.NotAfter), 49*time.Hour, "leaf valid until %v", leaf.NotAfter)
	other, _ := l.Get("other.example")
	assert.False(t, other.PrivateKey.(*ecdsa.PrivateKey).Equal(certs[0].PrivateKey), "two leaves share a key")
	l.Get("third.example")
	l.Get("new.example") // most recent again
	l.Get("fourth.example")
	assert.Equal(t, 3, l.Len(), "leaves cached")
	again, _ := l.Get("new.example")
	assert.Same(t, certs[0], again, "the most recently used leaf was evicted")
	o2, _ := l.Get("other.example")
	assert.NotSame(t, other, o2, "the least recently used leaf survived eviction")
	short := &Leaves{CA: ca, TTL: time.Nanosecond}
	a, _ := short.Get("ttl.example")
	time.Sleep(time.Millisecond) // let the TTL pass
	b, _ := short.Get("ttl.example")
	assert.NotSame(t, a, b, "an expired leaf was served")
}

// TestLeavesFairShare: an agent minting leaves for name after name (a
// wide interception rule and a list of hosts) fills the cache with its
// own and then pushes out its own, least recently used first; a
// neighbour's leaves stay cached, and its next connections mint nothing.
func TestLeavesFairShare(t *testing.T) {
	ca, err := NewCA("leaf test")
	require.NoError(t, err)
	l := &Leaves{CA: ca, Size: 10, TTL: time.Hour}
	quiet := map[string]*tls.Certificate{}
	for _, host := range []string{"a.quiet", "b.quiet", "c.quiet"} {
		quiet[host], err = l.getFor("quiet", host)
		require.NoError(t, err)
	}
	var first *tls.Certificate
	for i := range 30 {
		c, err := l.getFor("flood", fmt.Sprintf("h%d.flood", i))
		require.NoError(t, err)
		if i == 29 {
			first = c
		}
	}
	assert.Equal(t, 10, l.Len(), "leaves cached")
	for host, c := range quiet {
		again, err := l.getFor("quiet", host)
		require.NoError(t, err)
		assert.Same(t, c, again, "%s was pushed out by the other agent's leaves", host)
	}
	again, err := l.getFor("flood", "h29.flood")
	require.NoError(t, err)
	assert.Same(t, first, again, "the flooding agent's most recent leaf was pushed out before its older ones")
}

func TestCAPersistence(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "egress")
	cert, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	ca1, err := LoadOrCreateCA(cert, key, "test")
	require.NoError(t, err)
	fi, _ := os.Stat(key)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "key mode")
	ca2, err := LoadOrCreateCA(cert, key, "test")
	require.NoError(t, err, "reload")
	assert.True(t, ca2.Cert.Equal(ca1.Cert), "reload: a different CA")
	os.WriteFile(cert, []byte("garbage"), 0o644)
	_, err = LoadOrCreateCA(cert, key, "test")
	assert.Error(t, err, "a damaged CA was accepted (or replaced)")
	os.Remove(cert)
	_, err = LoadOrCreateCA(cert, key, "test")
	assert.ErrorContains(t, err, "only one", "a lone key")
	other, _ := NewCA("other")
	os.WriteFile(cert, other.PEM(), 0o644)
	_, err = LoadOrCreateCA(cert, key, "test")
	assert.Error(t, err, "a certificate that does not match the key was accepted")
}

func TestTrustFiles(t *testing.T) {
	ca, _ := NewCA("trust test")
	b, err := ca.Bundle()
	if err != nil {
		t.Skipf("no system roots on this machine: %v", err)
	}
	pool := x509.NewCertPool()
	// Not Contains and friends: they would print the whole bundle.
	assert.True(t, pool.AppendCertsFromPEM(b), "the bundle is not the system roots followed by the CA: it does not parse")
	assert.True(t, strings.HasSuffix(string(b), string(ca.PEM())), "the bundle is not the system roots followed by the CA: it does not end with the CA")
	assert.GreaterOrEqual(t, strings.Count(string(b), "BEGIN CERTIFICATE"), 10, "the bundle is not the system roots followed by the CA: too few certificates")
	env := strings.Join(Env("/etc/egress/bundle.pem", "/etc/egress/node-extra.pem"), " ")
	for _, v := range []string{"SSL_CERT_FILE=/etc/egress/bundle.pem", "NODE_EXTRA_CA_CERTS=/etc/egress/node-extra.pem", "REQUESTS_CA_BUNDLE=", "CURL_CA_BUNDLE=",
		"GIT_SSL_CAINFO=", "AWS_CA_BUNDLE=", "PIP_CERT=", "NPM_CONFIG_CAFILE=", "CARGO_HTTP_CAINFO="} {
		assert.Contains(t, env, v, "Env lacks %s", v)
	}
	// Node.js: the CA and the extra upstream roots, not the system's.
	extra, _ := NewCA("an operator's private root")
	node := ca.NodeExtra(extra.PEM())
	assert.True(t, strings.HasPrefix(string(node), string(ca.PEM())), "NodeExtra does not start with the CA")
	assert.Contains(t, string(node), string(extra.PEM()), "NodeExtra lacks the extra root")
	assert.Equal(t, 2, strings.Count(string(node), "BEGIN CERTIFICATE"), "NodeExtra holds more than the CA and the extra root")
	assert.Equal(t, string(ca.PEM()), string(ca.NodeExtra(nil)), "NodeExtra without extra roots is the CA")
}

func TestRefreshExchange(t *testing.T) {
	r := newRig(t)
	// The token endpoint rotates its refresh token on every grant.
	var current atomic.Pointer[string]
	first := "RT-1-real"
	current.Store(&first)
	var grants atomic.Int32
	r.mux.HandleFunc("/oauth/token", func(w http.ResponseWriter, req *http.Request) {
		var in map[string]string
		json.NewDecoder(req.Body).Decode(&in)
		if in["grant_type"] != "refresh_token" || in["refresh_token"] != *current.Load() {
			// Like some servers, the error echoes the token it got.
			http.Error(w, `{"error":"invalid_grant","error_description":"unknown token `+in["refresh_token"]+`"}`, http.StatusBadRequest)
			return
		}
		n := grants.Add(1)
		next := fmt.Sprintf("RT-%d-real", n+1)
		current.Store(&next)
		json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("AT-%d-real", n), "refresh_token": next, "expires_in": 3600})
	})
	rule := vault.Rule{Hosts: []string{"api.test"}, Header: "Authorization", Mode: vault.Refresh, Paths: []string{"/oauth/token"}}
	require.NoError(t, r.vault.Set(vault.Secret{Name: "refresh", Rule: rule}, []byte(first)))
	access := vault.Rule{Hosts: []string{"api.test"}, Header: "Authorization", Mode: vault.Login, Paths: []string{"/backend-api"}}
	require.NoError(t, r.vault.Set(vault.Secret{Name: "access", Rule: access}, []byte("AT-0-real")))
	r.vault.Detach("a1", "api") // its rule would set Authorization for every path
	rph, _ := r.vault.Attach("a1", "refresh", "REFRESH")
	aph, _ := r.vault.Attach("a1", "access", "ACCESS")
	x := &RefreshExchange{Host: fmt.Sprintf("api.test:%d", r.upPort), Path: "/oauth/token", RefreshSecret: "refresh", AccessSecret: "access", Store: r.vault, Client: r.ic.Client(false)}
	r.ic.Hooks = []Hook{x.Hook()}
	c := r.client(r.addr, false)
	for round := 1; round <= 2; round++ {
		resp, err := c.Post("https://api.test/oauth/token", "application/json", strings.NewReader(`{"grant_type":"refresh_token","refresh_token":"`+rph.Placeholder+`","client_id":"app"}`))
		require.NoError(t, err)
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, "round %d: %v", round, out)
		assert.Equal(t, rph.Placeholder, out["refresh_token"], "round %d: refresh_token", round)
		assert.Equal(t, aph.Placeholder, out["access_token"], "round %d: access_token", round)
		assert.Equal(t, float64(3600), out["expires_in"], "round %d: expires_in", round)
	}
	assert.Equal(t, int32(2), grants.Load(), "grants that reached the endpoint")
	// The rotated access token is used on the way out, by placeholder.
	resp, _ := r.get(c, "https://api.test/backend-api/me", http.Header{"Authorization": {"Bearer " + aph.Placeholder}})
	require.Equal(t, 200, resp.StatusCode, "access token after refresh: status")
	assert.Equal(t, "Bearer AT-2-real", r.upstreamHeader().Get("Authorization"), "access token after refresh")
	// A refused grant whose error echoes the real token reaches the
	// sandbox with the placeholder in its place.
	require.NoError(t, r.vault.Replace("refresh", []byte("RT-stale-real")))
	resp, err := c.Post("https://api.test/oauth/token", "application/json", strings.NewReader(`{"grant_type":"refresh_token","refresh_token":"`+rph.Placeholder+`"}`))
	require.NoError(t, err)
	echoed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "refused grant: %s", echoed)
	assert.NotContains(t, string(echoed), "RT-stale-real", "refused grant")
	assert.Contains(t, string(echoed), "unknown token "+rph.Placeholder, "refused grant")
	// A grant with a token that is not the placeholder passes through.
	resp2, err := c.Post("https://api.test/oauth/token", "application/json", strings.NewReader(`{"grant_type":"refresh_token","refresh_token":"something-else"}`))
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp2.StatusCode, "foreign grant")
}
