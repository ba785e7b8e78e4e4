package mitm

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// gauge counts what is in progress and remembers the most at once.
type gauge struct{ now, peak atomic.Int32 }

func (g *gauge) in() {
	n := g.now.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
}

func (g *gauge) out() { g.now.Add(-1) }

// TestStreamsPerConnectionBounded: an intercepted HTTP/2 connection
// advertises at most MaxStreams concurrent streams, and a client that
// opens more anyway has the extra ones refused.
func TestStreamsPerConnectionBounded(t *testing.T) {
	r := newRig(t)
	r.ic.MaxStreams = 4
	release := make(chan struct{})
	defer close(release)
	var handlers gauge
	r.mux.HandleFunc("/hold", func(w http.ResponseWriter, req *http.Request) {
		handlers.in()
		defer handlers.out()
		<-release
	})
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: rootPool(r.ca), NextProtos: []string{"h2"}})
	require.NoError(t, c.Handshake())
	require.Equal(t, "h2", c.ConnectionState().NegotiatedProtocol)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())

	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for id := uint32(1); id <= 11; id += 2 { // six streams
		hbuf.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "api.test"}, {":path", "/hold"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndStream: true, EndHeaders: true}))
	}
	advertised := uint32(0)
	refused := map[uint32]bool{}
	for len(refused) < 2 {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				advertised = v
			}
		case *http2.RSTStreamFrame:
			refused[f.StreamID] = true
		}
	}
	assert.EqualValues(t, 4, advertised, "the streams advertised")
	assert.Equal(t, map[uint32]bool{9: true, 11: true}, refused, "the streams beyond the bound are refused")
	require.Eventually(t, func() bool { return handlers.now.Load() == 4 }, 5*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 4, handlers.peak.Load(), "requests in flight upstream from one connection")
}

// TestUpstreamMultiplexed: an agent's requests to a host that speaks
// HTTP/2 share one upstream connection, as streams, whatever the number
// of its own connections to the gateway.
func TestUpstreamMultiplexed(t *testing.T) {
	r := newRig(t)
	var held gauge
	var mu sync.Mutex
	conns := map[string]bool{} // upstream connections seen, by the gateway's address
	protos := map[string]bool{}
	release := make(chan struct{})
	r.mux.HandleFunc("/hold", func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		conns[req.RemoteAddr], protos[req.Proto] = true, true
		mu.Unlock()
		held.in()
		defer held.out()
		<-release
	})
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			c := r.client(r.addr, false) // a connection of its own to the gateway
			if resp, err := c.Get("https://api.test/hold"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	require.Eventually(t, func() bool { return held.now.Load() == 12 }, 5*time.Second, 10*time.Millisecond)
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, conns, 1, "upstream connections for 12 concurrent requests")
	assert.Equal(t, map[string]bool{"HTTP/2.0": true}, protos)
}

// TestUpstreamConnectionsBounded: to a host that speaks only HTTP/1.1, an
// agent's requests reuse a bounded pool of connections per host; beyond
// the agent's total, requests that would need another are refused.
func TestUpstreamConnectionsBounded(t *testing.T) {
	r := newRig(t)
	r.ic.MaxUpstreamConnsPerHost = 2
	var held gauge
	var mu sync.Mutex
	conns := map[string]bool{} // upstream connections seen, by the gateway's address
	release := make(chan struct{})
	h1 := http.NewServeMux()
	h1.HandleFunc("/hold", func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		conns[req.RemoteAddr] = true
		mu.Unlock()
		held.in()
		defer held.out()
		<-release
	})
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h1, TLSConfig: &tls.Config{GetCertificate: upstreamCert(r.upRoot), NextProtos: []string{"http/1.1"}}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	addr := r.serveInterceptedTo("api.test", uint16(ln.Addr().(*net.TCPAddr).Port))
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			c := r.client(addr, false) // a connection of its own to the gateway
			if resp, err := c.Get("https://api.test/hold"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	require.Eventually(t, func() bool { return held.now.Load() == 2 }, 5*time.Second, 10*time.Millisecond)
	close(release)
	wg.Wait()
	assert.EqualValues(t, 2, held.peak.Load(), "requests held upstream at once, over the whole run")
	mu.Lock()
	assert.Len(t, conns, 2, "upstream connections to one host, for one agent: the 12 requests reused them")
	mu.Unlock()

	// The agent's total across hosts.
	r.ic.CloseIdleConnections()
	require.Eventually(t, func() bool { n, _ := r.ic.upstream.Count("a1"); return n == 0 }, 5*time.Second, 10*time.Millisecond)
	for range 64 {
		require.True(t, r.ic.upstream.Acquire("a1", 0, 0)) // the agent's budget, used up elsewhere
	}
	resp, body := r.get(r.client(r.addr, false), "https://api.test/", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	assert.Contains(t, body, ReasonUpstreamConns)
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Reason == ReasonUpstreamConns })
	assert.False(t, rec.Allowed, "a request refused for the agent's bound is a denial")
	assert.Contains(t, BoundReasons(), rec.Reason, "the refusal is not counted as a bound's")
}

// TestMintRate: an agent that names new hosts faster than its minting rate
// is refused leaves beyond its burst; cached leaves are always served.
func TestMintRate(t *testing.T) {
	r := newRig(t)
	r.ic.MintsPerSecond = 2 // bursts of 8
	minted := 0
	for i := range 30 {
		if _, err := r.ic.leafFor("a1", fmt.Sprintf("h%d.example.com", i)); err == nil {
			minted++
		} else {
			assert.EqualError(t, err, policy.ReasonQuotaMints)
		}
	}
	assert.Equal(t, 8, minted)
	_, err := r.ic.leafFor("a1", "h0.example.com")
	assert.NoError(t, err, "a cached leaf costs nothing")
	_, err = r.ic.leafFor("a2", "fresh.example.com")
	assert.NoError(t, err, "another agent has its own rate")
}

// TestIdleUpstreamConnectionsGiveBackTheirSlots: an agent whose slots are
// all held by idle connections gets one back for a new host at once.
func TestIdleUpstreamConnectionsGiveBackTheirSlots(t *testing.T) {
	r := newRig(t)
	r.ic.MaxUpstreamConnsPerAgent = 1
	resp, body := r.get(r.client(r.addr, false), "https://api.test/", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	n, _ := r.ic.upstream.Count("a1")
	require.Equal(t, 1, n, "the idle connection holds the agent's one slot")
	// A request for another host (judged on its own Host) needs another
	// upstream connection.
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	req.Host = "other.test"
	resp, err := r.client(r.addr, false).Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestRequestsPerAgentBounded: an agent's intercepted requests in progress,
// over all its connections, are bounded.
func TestRequestsPerAgentBounded(t *testing.T) {
	r := newRig(t)
	r.ic.MaxRequestsPerAgent = 2
	release := make(chan struct{})
	var held gauge
	r.mux.HandleFunc("/hold", func(w http.ResponseWriter, req *http.Request) {
		held.in()
		defer held.out()
		<-release
	})
	var wg sync.WaitGroup
	codes := make(chan int, 5)
	for range 5 {
		wg.Go(func() {
			resp, _ := r.get(r.client(r.addr, false), "https://api.test/hold", nil)
			codes <- resp.StatusCode
		})
	}
	require.Eventually(t, func() bool { return len(codes) == 3 }, 5*time.Second, 10*time.Millisecond, "requests beyond the bound are refused at once")
	require.Eventually(t, func() bool { return held.now.Load() == 2 }, 5*time.Second, 10*time.Millisecond, "the two within the bound reach the upstream")
	close(release)
	wg.Wait()
	close(codes)
	refused := 0
	for c := range codes {
		if c == http.StatusServiceUnavailable {
			refused++
		}
	}
	assert.Equal(t, 3, refused)
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Reason == ReasonAgentRequests && !rec.Allowed })
	assert.Contains(t, BoundReasons(), rec.Reason, "the refusal is not counted as a bound's")
}

// TestDoHRequestsRefused: a DNS-over-HTTPS request to an intercepted host
// the policy allows only by a wildcard is refused, in every form; naming
// the host exactly lets it through.
func TestDoHRequestsRefused(t *testing.T) {
	r := newRig(t)
	wild, err := policy.New(policy.Config{Allow: []string{"*.test:*"}})
	require.NoError(t, err)
	r.pol = wild
	addr := r.serveIntercepted("api.test")
	for _, tc := range []struct {
		name, method, url, header, value string
	}{
		{"POST dns-message", "POST", "https://api.test/dns-query", "Content-Type", "application/dns-message"},
		{"GET ?dns=", "GET", "https://api.test/dns-query?dns=AAABAAABAAAAAAAAA3d3dwdleGFtcGxlA2NvbQAAAQAB", "", ""},
		{"JSON", "GET", "https://api.test/resolve?name=example.com&type=A", "Accept", "application/dns-json"},
	} {
		req, _ := http.NewRequest(tc.method, tc.url, strings.NewReader("\x00\x00"))
		if tc.header != "" {
			req.Header.Set(tc.header, tc.value)
		}
		resp, err := r.client(addr, false).Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, tc.name)
		assert.Contains(t, string(body), policy.ReasonDoH, tc.name)
	}
	testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Reason == policy.ReasonDoH && !rec.Allowed })
	// A plain request to the same host goes.
	resp, body := r.get(r.client(addr, false), "https://api.test/plain", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	// Named exactly, the resolver is the operator's choice.
	named, err := policy.New(policy.Config{Allow: []string{"api.test:*"}})
	require.NoError(t, err)
	r.pol = named
	addr = r.serveIntercepted("api.test")
	req, _ := http.NewRequest("POST", "https://api.test/dns-query", strings.NewReader("\x00\x00"))
	req.Header.Set("Content-Type", "application/dns-message")
	resp, err = r.client(addr, false).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestAgentsPoolIsForItsPolicy: an agent's requests share kept-alive
// upstream connections while its policy stays; a new policy (whose
// per-address rules no kept connection was dialled under) and Forget
// each give the agent a new pool. The upstream tells the connection by
// its peer address.
func TestAgentsPoolIsForItsPolicy(t *testing.T) {
	r := newRig(t)
	r.mux.HandleFunc("/peer", func(w http.ResponseWriter, req *http.Request) { io.WriteString(w, req.RemoteAddr) })
	c := r.client(r.addr, false)
	peer := func() string {
		resp, body := r.get(c, "https://api.test/peer", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		return body
	}
	first := peer()
	require.Equal(t, first, peer(), "the agent's second request did not reuse its upstream connection")

	same, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	r.changed.Store(same)
	afterChange := peer()
	assert.NotEqual(t, first, afterChange, "a request under a new policy rode a connection dialled under the old one")
	assert.Equal(t, afterChange, peer(), "the new policy's pool does not keep its connections")

	r.ic.Forget("a1")
	assert.NotEqual(t, afterChange, peer(), "the agent's pool outlived Forget")
}

// oneSlotRig is a rig whose agent may hold one upstream connection, with
// a path, /hold, whose requests wait until released; get returns the
// status of a request for a path on a connection of its own, and
// holdAcross makes a request to /hold, calls meanwhile while it is held,
// and returns once it has ended and its connection is idle.
type oneSlotRig struct {
	*rig
	held, release chan struct{}
}

func newOneSlotRig(t *testing.T) *oneSlotRig {
	r := &oneSlotRig{newRig(t), make(chan struct{}, 1), make(chan struct{})}
	r.ic.MaxUpstreamConnsPerAgent = 1
	r.mux.HandleFunc("/hold", func(w http.ResponseWriter, req *http.Request) {
		r.held <- struct{}{}
		<-r.release
	})
	return r
}

func (r *oneSlotRig) get(path string) int {
	resp, body := r.rig.get(r.client(r.addr, false), "https://api.test"+path, nil)
	if resp.StatusCode != http.StatusOK {
		assert.Contains(r.t, body, ReasonUpstreamConns)
	}
	return resp.StatusCode
}

func (r *oneSlotRig) holdAcross(meanwhile func()) {
	done := make(chan int)
	go func() { done <- r.get("/hold") }()
	select {
	case <-r.held:
	case <-time.After(5 * time.Second):
		require.Fail(r.t, "the request was not held")
	}
	meanwhile()
	r.release <- struct{}{}
	require.Equal(r.t, http.StatusOK, <-done)
	n, _ := r.ic.upstream.Count("a1")
	require.Equal(r.t, 1, n, "the held request's connection, idle, holds the agent's slot")
}

// newPolicy gives the rig's agent a policy of its own, as a policy set
// (or the agent made again) would.
func (r *oneSlotRig) newPolicy() {
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(r.t, err)
	r.changed.Store(pol)
}

// TestRetiredPoolsGiveBackTheirSlots: a connection of a pool an earlier
// policy retired while it was in use counts against the agent's bound
// until it closes, and once idle gives its slot back to a request under
// the new policy, and is closed by Forget; neither waits for it to idle
// out.
func TestRetiredPoolsGiveBackTheirSlots(t *testing.T) {
	r := newOneSlotRig(t)
	// The policy changes, and a request under the new one retires the
	// pool, while the held request is in progress on its connection.
	retireInUse := func() {
		r.newPolicy()
		assert.Equal(t, http.StatusServiceUnavailable, r.get("/"), "the retired pool's connection in use did not hold the agent's slot")
	}

	r.holdAcross(retireInUse)
	assert.Equal(t, http.StatusOK, r.get("/"), "a request under the new policy")
	r.holdAcross(retireInUse)
	r.ic.Forget("a1")
	n, _ := r.ic.upstream.Count("a1")
	assert.Zero(t, n, "Forget left a retired pool's idle connection open")
}

// TestForgottenPoolsGiveBackTheirSlots: a connection in use when its
// agent was forgotten, idle after, gives the slot back to the agent made
// again under the same name, and is closed by the next Forget, whatever
// request of the agent came after Forget.
func TestForgottenPoolsGiveBackTheirSlots(t *testing.T) {
	r := newOneSlotRig(t)
	forget := func() { r.ic.Forget("a1") }

	r.holdAcross(forget)
	r.newPolicy() // the agent made again
	assert.Equal(t, http.StatusOK, r.get("/"), "a request of the agent made again")

	r.holdAcross(forget)
	assert.Equal(t, http.StatusOK, r.get("/"), "a request of the forgotten agent's, under way at Forget")
	r.ic.Forget("a2")
	n, _ := r.ic.upstream.Count("a1")
	assert.Zero(t, n, "the next Forget left a forgotten agent's idle connection open")
}

// TestGatewayBounds: agents that each take all their own bounds allow
// leave the gateway's last quarter to an agent that holds none; once all
// agents together hold the gateway's upstream connections or requests in
// progress, it too is refused, with the gateway's reason.
func TestGatewayBounds(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		set          func(ic *Interceptor)
		counter      func(ic *Interceptor) *budget.Counter
	}{
		{"upstream connections", ReasonGatewayUpstreamConns,
			func(ic *Interceptor) { ic.MaxUpstreamConns, ic.MaxUpstreamConnsPerAgent = 16, 4 },
			func(ic *Interceptor) *budget.Counter { return &ic.upstream }},
		{"requests", ReasonGatewayRequests,
			func(ic *Interceptor) { ic.MaxRequests, ic.MaxRequestsPerAgent = 16, 4 },
			func(ic *Interceptor) *budget.Counter { return &ic.requests }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			tc.set(r.ic)
			c := tc.counter(r.ic)
			for i := range 16 { // four other agents, each taking what its bounds allow
				c.Acquire(fmt.Sprintf("other%d", i/4), 4, 16)
			}
			resp, body := r.get(r.client(r.addr, false), "https://api.test/", nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "the agent that held none was starved: %s", body)

			r.ic.pools.CloseIdle("a1") // its next request needs a new upstream connection
			for c.Acquire("many", 0, 16) {
				// many light agents, together filling the rest
			}
			resp, body = r.get(r.client(r.addr, false), "https://api.test/", nil)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
			assert.Contains(t, body, tc.reason)
			rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Reason == tc.reason })
			assert.False(t, rec.Allowed, "a request refused for the gateway's bound is a denial")
			assert.Contains(t, BoundReasons(), rec.Reason, "the refusal is not counted as a bound's")
		})
	}
}
