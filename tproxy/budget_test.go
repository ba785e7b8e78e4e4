package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// TestExplicitRequestsCountAsConnections: absolute-form requests on the
// explicit proxy take a connection slot each while in flight, so an
// agent's cap bounds what it has going upstream however it asks.
func TestExplicitRequestsCountAsConnections(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.MaxConnsPerAgent = 2 })
	release := make(chan struct{})
	var upstream, peak atomic.Int32
	backend := listenLoop(t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := upstream.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		upstream.Add(-1)
		fmt.Fprint(rw, "ok")
	})}
	go srv.Serve(backend)
	t.Cleanup(func() { srv.Close() })
	url := fmt.Sprintf("http://api.test:%d/", backend.Addr().(*net.TCPAddr).Port)

	var wg sync.WaitGroup
	statuses := make(chan string, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", w.explicit.Addr().String())
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", url)
			line := make([]byte, 12)
			io.ReadFull(c, line)
			statuses <- string(line)
		}()
	}
	require.Eventually(t, func() bool { return len(statuses) == 8 && upstream.Load() == 2 },
		5*time.Second, 10*time.Millisecond, "two requests in flight upstream, the eight over the cap refused while they are held")
	close(release)
	wg.Wait()
	close(statuses)
	refused := 0
	for s := range statuses {
		if strings.Contains(s, "503") {
			refused++
		}
	}
	assert.Equal(t, 8, refused)
	assert.EqualValues(t, 2, peak.Load(), "never more than the cap upstream at once")
	w.waitRecord(func(r egresslog.Record) bool {
		return r.Kind == egresslog.KindHTTP && r.Reason == ReasonAgentTooManyConns
	})
}

// TestConnectionRateQuota: an agent opening connections faster than its
// quota is refused beyond its burst, with a record saying why.
func TestConnectionRateQuota(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{ConnectionsPerSecond: 5}}) // bursts of 10
	served := 0
	for range 30 {
		if echoThrough2(w) == nil {
			served++
		}
	}
	assert.GreaterOrEqual(t, served, 10, "the burst is served")
	assert.LessOrEqual(t, served, 15, "beyond the burst, the rate")
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Reason == policy.ReasonQuotaConnections })
	assert.Equal(t, "a1", rec.Agent)
}

// TestForgetStartsTheRateAfresh: an agent removed and made again under
// the same name (another sandbox, say) has its whole burst, not what the
// removed one left of it.
func TestForgetStartsTheRateAfresh(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{ConnectionsPerSecond: 1}}) // bursts of 2
	for range 2 {
		require.NoError(t, echoThrough2(w), "the burst")
	}
	require.Error(t, echoThrough2(w), "past the burst")
	w.proxy.Forget("a1")
	for range 2 {
		assert.NoError(t, echoThrough2(w), "the agent made again under the name")
	}
}

func echoThrough2(w *world) error {
	w.origDst.Store(w.echoAddr)
	return echoThrough(w.tproxyLn.Addr().String())
}

// TestByteRateQuota: a download is held to the agent's bytes per second.
// The bound checked is a lower one: a slower machine only takes longer.
func TestByteRateQuota(t *testing.T) {
	w := newWorld(t, nil, nil)
	const size, rate = 3 << 20, 1 << 20
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: rate}})
	big := listenLoop(t, "127.0.0.2:0")
	go acceptLoop(big, func(c net.Conn) {
		defer c.Close()
		c.Write(bytes.Repeat([]byte("x"), size))
	})
	c := w.dial(addrPortOf(big.Addr()))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	require.NoError(t, err)
	assert.EqualValues(t, size, n)
	// A second's burst, then two seconds at the rate.
	assert.Greater(t, time.Since(start), 1500*time.Millisecond, "3 MiB at 1 MiB/s took less than 1.5 s")
}

// TestByteRateQuotaAcrossConnections: the rate is the agent's, whatever
// the number of its connections.
func TestByteRateQuotaAcrossConnections(t *testing.T) {
	w := newWorld(t, nil, nil)
	const conns, size, rate = 8, 1 << 20, 2 << 20
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: rate}})
	big := listenLoop(t, "127.0.0.2:0")
	go acceptLoop(big, func(c net.Conn) {
		defer c.Close()
		c.Write(bytes.Repeat([]byte("x"), size))
	})
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		c := w.dial(addrPortOf(big.Addr()))
		wg.Go(func() {
			n, err := io.Copy(io.Discard, c)
			assert.NoError(t, err)
			assert.EqualValues(t, size, n)
		})
	}
	wg.Wait()
	// 8 MiB at 2 MiB/s: a second's burst, each connection's first chunk
	// ahead of paying, then the rest at the rate.
	assert.Greater(t, time.Since(start), 2*time.Second, "8 MiB over 8 connections at 2 MiB/s took less than 2 s")
}

// TestInterceptRefusedForQuota: a connection the Interceptor refused for a
// quota is recorded as a denial with the quota's reason, not as an
// intercepted connection that failed.
func TestInterceptRefusedForQuota(t *testing.T) {
	ic := &interceptor{err: fmt.Errorf("mitm: client TLS handshake for api.test: %w", &policy.QuotaError{Reason: policy.ReasonQuotaMints})}
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.Interceptor = ic })
	w.httpsGet(w.tlsAddr, "api.test")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && r.Kind == egresslog.KindTLS })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Equal(t, policy.ReasonQuotaMints, r.Reason)
}

// agentRecordingResolver resolves as its map does, and notes which agent
// each lookup was made for.
type agentRecordingResolver struct {
	testkit.Resolver
	mu     sync.Mutex
	agents []string
}

func (r *agentRecordingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.agents = append(r.agents, policy.AgentFrom(ctx))
	r.mu.Unlock()
	return r.Resolver.LookupNetIP(ctx, network, host)
}

// TestLookupsAreForTheirAgent: the gateway's own lookups, for transparent
// TLS, CONNECT and plain HTTP alike, say which agent they are for, so that
// a shared resolver charges that agent.
func TestLookupsAreForTheirAgent(t *testing.T) {
	var rec *agentRecordingResolver
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) {
		rec = &agentRecordingResolver{Resolver: p.Resolver.(testkit.Resolver)}
		p.Resolver = rec
	})
	_, err := w.httpsGet(w.tlsAddr, "api.test")
	require.NoError(t, err)
	c, _, resp := w.connectTo(fmt.Sprintf("api.test:%d", w.tlsAddr.Port()))
	c.Close()
	require.Equal(t, 200, resp.StatusCode)
	hc := w.dial(w.httpAddr)
	fmt.Fprintf(hc, "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
	hresp, err := http.ReadResponse(bufio.NewReader(hc), nil)
	require.NoError(t, err)
	hresp.Body.Close()
	require.Equal(t, 200, hresp.StatusCode)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.agents, 3)
	for _, a := range rec.agents {
		assert.Equal(t, "a1", a)
	}
}

// TestExplicitConnectionsBounded: connections to the explicit proxy port
// count per source even before they carry a request, so that half-sent
// heads cannot pile up.
func TestExplicitConnectionsBounded(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.MaxExplicitConnsPerSource = 2 })
	open := func() net.Conn {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		if err != nil {
			return nil // reset already
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "CONNECT api.test:443 HTTP/1.1\r\nX-Slow: ") // never finished
		return c
	}
	closedAtOnce := func(c net.Conn) bool {
		if c == nil {
			return true
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	// The server counts connections as it accepts them, in the order the
	// kernel queued them: both held ones before the extra one.
	held := []net.Conn{open(), open()}
	extra := open()
	assert.True(t, closedAtOnce(extra), "a third connection from the same source was kept")
	for _, c := range held {
		assert.False(t, closedAtOnce(c), "a connection within the bound was closed")
	}
	held[0].Close()
	assert.Eventually(t, func() bool { return !closedAtOnce(open()) }, 5*time.Second, 20*time.Millisecond, "a connection was refused after one closed")
}

// TestExplicitByteRateQuota: plain HTTP through the explicit proxy is held
// to the agent's bytes per second too.
func TestExplicitByteRateQuota(t *testing.T) {
	w := newWorld(t, nil, nil)
	const size, rate = 3 << 20, 1 << 20
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: rate}})
	backend := listenLoop(t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Write(bytes.Repeat([]byte("x"), size))
	})}
	go srv.Serve(backend)
	t.Cleanup(func() { srv.Close() })
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", backend.Addr())
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	assert.EqualValues(t, size, n)
	assert.Greater(t, time.Since(start), 1500*time.Millisecond, "3 MiB at 1 MiB/s took less than 1.5 s")
}

// TestLastConnectionsKeptForLightAgents: agents each within their bound
// (2 connections, of 20 in all) hold silent connections until the
// gateway is nearly full; past three quarters, an agent holding any is
// refused, and an agent holding none still gets its connection. Ten
// such agents refused every other agent's connections before.
func TestLastConnectionsKeptForLightAgents(t *testing.T) {
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"web.test"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	log := &egresslog.Log{}
	p := &Proxy{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-" + src.String(), pol, true },
		Log:    log,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
			return netip.MustParseAddrPort("198.18.0.5:443"), nil
		},
		MaxConns: 20, MaxConnsPerAgent: 2, HelloTimeout: time.Minute,
	}
	ln := listenLoop(t, "127.0.0.1:0")
	go p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	// dial connects from src; a connection the proxy refuses may be reset
	// before the dial returns, which is a refusal too.
	dial := func(src netip.Addr, refusable bool) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if refusable && errors.Is(err, syscall.ECONNRESET) {
			return nil
		}
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	refusals := func(reason string) int {
		n := 0
		for _, r := range log.List(egresslog.Filter{DeniedOnly: true}, 0) {
			if r.Reason == reason {
				n++
			}
		}
		return n
	}
	for i := range 10 {
		for range 2 {
			dial(netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 1)}), true)
		}
	}
	require.Eventually(t, func() bool { return p.open.Load()+int64(refusals(ReasonConnsKept)) == 20 }, 5*time.Second, 10*time.Millisecond,
		"the heavy agents' connections were neither held nor refused")
	assert.Positive(t, refusals(ReasonConnsKept), "no heavy agent was refused past three quarters")
	assert.Subset(t, BoundReasons(), []string{ReasonConnsKept, ReasonTooManyConns}, "the refusals are not counted as a bound's")
	assert.Zero(t, refusals(ReasonTooManyConns), "the heavy agents filled the gateway")

	held := p.open.Load()
	c := dial(netip.MustParseAddr("127.0.0.50"), false)
	require.Eventually(t, func() bool { return p.open.Load() == held+1 }, 5*time.Second, 10*time.Millisecond, "the light agent's connection was not taken")
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err = c.Read(make([]byte, 1))
	assert.True(t, isTimeout(err), "the light agent's connection was ended: %v", err)
	for _, r := range log.List(egresslog.Filter{Agent: "agent-127.0.0.50"}, 0) {
		assert.True(t, r.Allowed, "the light agent was refused: %+v", r)
	}
}
