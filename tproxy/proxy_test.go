package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
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

func TestTLSBySNI(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "*.npm.test:*"}, nil)
	body, err := w.httpsGet(w.tlsAddr, "api.test")
	require.NoError(t, err, "allowed SNI")
	require.True(t, strings.HasPrefix(body, w.tlsAddr.String()), "allowed SNI: %q", body)
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTLS && r.Host == "api.test" })
	assert.True(t, r.Allowed, "record %+v", r)
	assert.Equal(t, "api.test:*", r.Rule, "record %+v", r)
	assert.NotZero(t, r.BytesUp, "record %+v", r)
	assert.NotZero(t, r.BytesDown, "record %+v", r)
	assert.Equal(t, w.tlsAddr, r.Addr, "record %+v", r)

	_, err = w.httpsGet(w.tlsAddr, "blocked.test")
	require.ErrorContains(t, err, "access denied", "denied SNI: want a TLS access_denied alert")
	r = w.waitRecord(func(r egresslog.Record) bool { return r.Host == "blocked.test" })
	assert.False(t, r.Allowed, "denied record %+v", r)
	assert.Equal(t, policy.ReasonNoRule, r.Reason, "denied record %+v", r)
}

// TestForgedSNI connects to the wrong server's address with an allowed
// SNI: the proxy connects to what the name resolves to on the gateway.
func TestForgedSNI(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	body, err := w.httpsGet(w.otherTLS, "api.test") // client aims at 127.0.0.3
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(body, "127.0.0.2:"), "reached %q; the proxy must connect to api.test's own address, 127.0.0.2", body)
}

// TestBigClientHello sends the 1526-byte Go ClientHello (a post-quantum
// key share) in three writes with pauses, as TCP segments may arrive.
func TestBigClientHello(t *testing.T) {
	w := newWorld(t, []string{"api.example.test:*"}, func(p *Proxy) {
		p.Resolver.(testkit.Resolver)["api.example.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	})
	hello := realHellos(t)["go1.26-default-x25519mlkem768"]
	c := w.dial(w.tlsAddr)
	for _, part := range [][]byte{hello[:3], hello[3:1400], hello[1400:]} {
		_, err := c.Write(part)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond) // let each part arrive on its own
	}
	// The server answers the hello (an alert or a ServerHello): either
	// way the connection reached it rather than being refused.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 5)
	_, err := io.ReadFull(c, b)
	require.NoError(t, err, "no answer from the server")
	require.Contains(t, []byte{0x16, 0x15}, b[0], "answer starts %x", b)
	c.Close()
	w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.example.test" && r.Allowed })
}

func TestHTTPEveryRequestJudged(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	c := w.dial(w.httpAddr)
	br := bufio.NewReader(c)
	get := func(host string) (*http.Response, string) {
		t.Helper()
		fmt.Fprintf(c, "GET /path?secret=x HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := get("api.test")
	require.Equal(t, 200, resp.StatusCode, "first request: %q", body)
	require.True(t, strings.HasSuffix(body, " api.test"), "first request: %q", body)
	resp, body = get("blocked.test") // same keep-alive connection
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "second request with another Host: %q", body)
	require.Contains(t, body, policy.ReasonNoRule, "second request with another Host")
	resp, _ = get("api.test")
	require.Equal(t, 200, resp.StatusCode, "third request")
	// An absolute-form target names the host, whatever the Host header
	// says (RFC 9112, section 3.2.2): it is what is judged.
	fmt.Fprintf(c, "GET http://blocked.test/ HTTP/1.1\r\nHost: api.test\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n")
	abs, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	io.Copy(io.Discard, abs.Body)
	abs.Body.Close()
	require.Equal(t, http.StatusForbidden, abs.StatusCode, "absolute-form request to a denied host with an allowed Host header")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Host == "blocked.test" })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Equal(t, http.StatusForbidden, r.Status, "record %+v", r)
	assert.Equal(t, "/path", r.Path, "record %+v", r)
	assert.Equal(t, "GET", r.Method, "record %+v", r)
	abs1 := w.waitRecord(func(r egresslog.Record) bool {
		return r.Kind == egresslog.KindHTTP && r.Host == "blocked.test" && r.Path == "/"
	})
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", abs1.Trace, "the request's traceparent is recorded, for its span")
}

func TestServerFirstByName(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*"}, nil)
	w.setNames("svc.test")
	c := w.dial(w.bannerAddr)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n') // the client never spoke first
	require.NoError(t, err, "banner: %q", line)
	require.Equal(t, "SSH-2.0-test_banner\r\n", line, "banner")
	fmt.Fprintf(c, "hello\n")
	got, _ := br.ReadString('\n')
	require.Equal(t, "got hello\n", got, "echo")
	c.Close()
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && r.Host == "svc.test" })
	assert.True(t, r.Allowed, "record %+v", r)
	assert.Equal(t, policy.ReasonAllowedByRule, r.Reason, "record %+v", r)
}

// TestServerFirstAfterHalfClose: a client that shuts its side without a
// word still hears a server that speaks first.
func TestServerFirstAfterHalfClose(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*"}, nil)
	w.setNames("svc.test")
	c := w.dial(w.bannerAddr).(*net.TCPConn)
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "banner after half-close: %q", line)
	require.Equal(t, "SSH-2.0-test_banner\r\n", line, "banner after half-close")
}

func TestOtherTCPWithoutNameDenied(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.HelloTimeout = 300 * time.Millisecond })
	c := w.dial(w.bannerAddr) // no remembered name
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err, "read data from a connection that should be refused")
	w.waitRecord(func(r egresslog.Record) bool { return !r.Allowed && r.Reason == ReasonHelloTimeout })

	c = w.dial(w.echoAddr)
	c.Write([]byte("\x00\x01binary"))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err, "read data from a connection that should be refused")
	w.waitRecord(func(r egresslog.Record) bool { return !r.Allowed && r.Reason == ReasonNoName })

	w.setNames("blocked.test") // remembered, but not allowed
	c = w.dial(w.echoAddr)
	c.Write([]byte("\x00\x01binary"))
	c.Read(make([]byte, 1))
	w.waitRecord(func(r egresslog.Record) bool {
		return !r.Allowed && r.Reason == policy.ReasonNoRule && r.Host == "blocked.test"
	})
}

func TestHalfClose(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	c := w.dial(w.echoAddr).(*net.TCPConn)
	c.Write([]byte("ping"))
	c.CloseWrite() // the server answers only after our FIN
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	require.NoError(t, err, "after half-close: %q", b)
	require.Equal(t, "echo:ping", string(b), "after half-close")
}

func TestRefusedUpstreamIsReset(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	ln := listenLoop(t, "127.0.0.2:0")
	closed := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	c := w.dial(closed)
	c.Write([]byte("x\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET, "read after a refused upstream: want a reset")
	r := w.waitRecord(func(r egresslog.Record) bool { return strings.HasPrefix(r.Reason, reasonUpstreamPrefix) })
	assert.Contains(t, r.Reason, "refused", "record %+v", r)
}

func TestUpstreamResetIsReset(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	ln := listenLoop(t, "127.0.0.2:0")
	go acceptLoop(ln, func(c net.Conn) {
		c.Read(make([]byte, 1))
		reset(c.(*net.TCPConn))
	})
	c := w.dial(netip.MustParseAddrPort(ln.Addr().String()))
	c.Write([]byte("x\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET, "read after the upstream reset: want a reset")
}

func TestIdleTimeout(t *testing.T) {
	w := newWorld(t, nil, func(p *Proxy) { p.IdleTimeout = 200 * time.Millisecond })
	w.setPolicy(policy.Config{Mode: policy.Open})
	c := w.dial(w.echoAddr)
	c.Write([]byte("x\n")) // then nothing
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err, "idle connection got data")
	w.waitRecord(func(r egresslog.Record) bool { return r.Reason == ReasonIdle })
}

// TestIdleBeforeAnyoneSpeaks: with a target to speculate on, a silent
// client waits for a server that may speak first, up to the idle timeout,
// and the record says so and names the target.
func TestIdleBeforeAnyoneSpeaks(t *testing.T) {
	w := newWorld(t, nil, func(p *Proxy) { p.IdleTimeout = 200 * time.Millisecond })
	w.setPolicy(policy.Config{Mode: policy.Open})
	c := w.dial(w.echoAddr) // the echo server waits for the client
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err, "silent connection got data")
	r := w.waitRecord(func(r egresslog.Record) bool { return !r.Allowed && r.Kind == egresslog.KindTCP })
	assert.Equal(t, ReasonIdle, r.Reason, "record %+v", r)
	assert.Equal(t, w.echoAddr.Addr().String(), r.Host, "record %+v", r)
}

func TestConnectionLimits(t *testing.T) {
	w := newWorld(t, nil, func(p *Proxy) { p.MaxConnsPerAgent = 1 })
	w.setPolicy(policy.Config{Mode: policy.Open})
	first := w.dial(w.bannerAddr)
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(first)
	_, err := br.ReadString('\n')
	require.NoError(t, err, "first connection")
	if second, err := w.tryDial(w.bannerAddr); err == nil {
		second.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = second.Read(make([]byte, 1))
		require.Error(t, err, "second connection over the limit was served")
	}
	w.waitRecord(func(r egresslog.Record) bool { return r.Reason == ReasonAgentTooManyConns })
	assert.Contains(t, BoundReasons(), ReasonAgentTooManyConns, "the refusal is not counted as a bound's")
	// The first goes on.
	fmt.Fprintf(first, "still here\n")
	got, _ := br.ReadString('\n')
	require.Equal(t, "got still here\n", got, "in-flight connection")
}

func TestUnknownSourceDropped(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	w.origDst.Store(w.echoAddr)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}
	if c, err := d.Dial("tcp", w.tproxyLn.Addr().String()); err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		require.Error(t, err, "unknown source was served")
	}
	w.waitRecord(func(r egresslog.Record) bool { return r.Reason == ReasonUnknownSource && r.Host == "127.0.0.5" })
}

func TestNeverTierRefusedAtDial(t *testing.T) {
	w := newWorld(t, []string{"meta.test:*"}, nil)
	_, err := w.httpsGet(w.tlsAddr, "meta.test")
	require.Error(t, err, "reached a name that resolves to the metadata address")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "meta.test" })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Contains(t, r.Reason, "metadata", "record %+v", r)
}

// interceptor records what it is handed.
type interceptor struct {
	mu    sync.Mutex
	hosts []string
	first []byte
	err   error // what Intercept returns
}

func (i *interceptor) Claims(_, host string) bool { return host == "api.test" }

func (i *interceptor) Intercept(_ context.Context, c net.Conn, agent string, _ policy.Current, host string, port uint16) error {
	b := make([]byte, 5)
	io.ReadFull(c, b)
	i.mu.Lock()
	i.hosts = append(i.hosts, fmt.Sprintf("%s %s:%d", agent, host, port))
	i.first = b
	i.mu.Unlock()
	c.Close()
	return i.err
}

func TestInterceptorHandoff(t *testing.T) {
	ic := &interceptor{}
	w := newWorld(t, []string{"api.test:*", "other.test:*"}, func(p *Proxy) { p.Interceptor = ic })
	w.httpsGet(w.tlsAddr, "api.test")
	body, err := w.httpsGet(w.tlsAddr, "other.test")
	require.NoError(t, err, "unclaimed host not passed through")
	require.NotEmpty(t, body, "unclaimed host not passed through")
	ic.mu.Lock()
	defer ic.mu.Unlock()
	require.Equal(t, []string{fmt.Sprintf("a1 api.test:%d", w.tlsAddr.Port())}, ic.hosts, "what the interceptor got")
	require.Equal(t, byte(0x16), ic.first[0], "interceptor's first bytes %x: the ClientHello was not replayed", ic.first)
}

func TestExplicitProxy(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "127.0.0.2:*"}, nil)
	proxyURL, _ := url.Parse("http://" + w.explicit.Addr().String())
	tr := &http.Transport{
		Proxy:           http.ProxyURL(proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: w.ca.Pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	get := func(u string) (int, string, error) {
		resp, err := client.Get(u)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	status, body, err := get(fmt.Sprintf("https://api.test:%d/", w.tlsAddr.Port()))
	require.NoError(t, err, "CONNECT to an allowed name")
	require.Equal(t, 200, status, "CONNECT to an allowed name: %q", body)
	require.True(t, strings.HasPrefix(body, "127.0.0.2:"), "CONNECT to an allowed name: %q", body)
	_, _, err = get(fmt.Sprintf("https://blocked.test:%d/", w.tlsAddr.Port()))
	require.ErrorContains(t, err, "Forbidden", "CONNECT to a denied name")
	w.waitRecord(func(r egresslog.Record) bool {
		return r.Kind == egresslog.KindConnect && r.Host == "blocked.test" && !r.Allowed
	})
	status, body, err = get(fmt.Sprintf("http://api.test:%d/x", w.httpAddr.Port()))
	require.NoError(t, err, "absolute-form to an allowed name")
	require.Equal(t, 200, status, "absolute-form to an allowed name: %q", body)
	require.True(t, strings.HasSuffix(body, "api.test:"+fmt.Sprint(w.httpAddr.Port())), "absolute-form to an allowed name: %q", body)
	status, _, _ = get(fmt.Sprintf("http://blocked.test:%d/x", w.httpAddr.Port()))
	require.Equal(t, http.StatusForbidden, status, "absolute-form to a denied name")
	// An IP literal follows the address rules.
	status, _, err = get(fmt.Sprintf("http://127.0.0.2:%d/", w.httpAddr.Port()))
	require.NoError(t, err, "absolute-form to an allowed address")
	require.Equal(t, 200, status, "absolute-form to an allowed address")
	status, _, _ = get(fmt.Sprintf("http://127.0.0.3:%d/", w.httpAddr.Port()))
	require.Equal(t, http.StatusForbidden, status, "absolute-form to a denied address")
	// The TLS inside a tunnel is judged too: a CONNECT to an allowed name
	// carrying a ClientHello for a denied one is refused.
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT api.test:%d HTTP/1.1\r\nHost: api.test\r\n\r\n", w.tlsAddr.Port())
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "CONNECT")
	require.Equal(t, 200, resp.StatusCode, "CONNECT: %v", resp)
	tc := tls.Client(c, &tls.Config{ServerName: "blocked.test", RootCAs: w.ca.Pool})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	require.Error(t, tc.Handshake(), "TLS to a denied name inside an allowed tunnel succeeded")
}

func TestExplicitSlowloris(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.HelloTimeout = 200 * time.Millisecond })
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT api.test:443 HTTP/1.1\r\nX-Slow: ") // never finished
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(c)
	require.NoError(t, err, "the proxy did not close a stalled request head")
}

func TestECHConnectionRefused(t *testing.T) {
	w := newWorld(t, []string{"api.example.test:*"}, func(p *Proxy) {
		p.Resolver.(testkit.Resolver)["api.example.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	})
	hello := withExtension(t, realHellos(t)["curl-7.88-openssl-3.0"], extensionECH, []byte{0, 0, 1, 0, 1, 1, 0, 0, 0, 0})
	c := w.dial(w.tlsAddr)
	c.Write(hello)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	alert := make([]byte, len(tlsAccessDenied))
	_, err := io.ReadFull(c, alert)
	require.NoError(t, err, "answer %x; want an access_denied alert", alert)
	require.Equal(t, tlsAccessDenied, alert, "want an access_denied alert")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTLS && !r.Allowed })
	assert.Equal(t, ErrECH.Error(), r.Reason, "record %+v", r)
}

// TestNoSpeculativeDialForClaimedHosts: a transparent connection to an
// address whose remembered name the Interceptor claims is not dialled
// while the client is silent: the Interceptor dials on its own, and an
// early connection would be thrown away.
func TestNoSpeculativeDialForClaimedHosts(t *testing.T) {
	upstream := listenLoop(t, "127.0.0.2:0")
	var accepted atomic.Int32
	go acceptLoop(upstream, func(c net.Conn) { accepted.Add(1); c.Close() })
	ic := &interceptor{}
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.Interceptor = ic })
	w.setNames("api.test")
	c := w.dial(addrPortOf(upstream.Addr()))
	time.Sleep(100 * time.Millisecond) // a speculative dial would have landed (the hold is longer)
	assert.Zero(t, accepted.Load(), "a claimed host was dialled before the client spoke")
	tc := tls.Client(c, &tls.Config{ServerName: "api.test", InsecureSkipVerify: true})
	tc.SetDeadline(time.Now().Add(2 * time.Second))
	tc.Handshake() // the fake interceptor reads and closes
	require.Eventually(t, func() bool { ic.mu.Lock(); defer ic.mu.Unlock(); return len(ic.hosts) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, accepted.Load(), "the upstream saw a connection that carried nothing")

	// An unclaimed name is still dialled early (server-first protocols).
	w.setNames("other.test")
	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"other.test:*"}})
	w.proxy.Resolver.(testkit.Resolver)["other.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	// The upstream hangs up at once, and the proxy passes that on as a
	// reset, which may reach the client before its connect returns.
	if c2, err := w.tryDial(addrPortOf(upstream.Addr())); err == nil {
		defer c2.Close()
	}
	require.Eventually(t, func() bool { return accepted.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "an unclaimed name was not dialled early")
}

// TestServerFirstToClaimedHost: a host the Interceptor claims may also
// serve a protocol in which the server speaks first (a banner on another
// port of a credential's host); its silent client is connected after a
// short hold, not left waiting for the idle timeout.
func TestServerFirstToClaimedHost(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.Interceptor = &interceptor{} })
	w.setNames("api.test")
	start := time.Now()
	c := w.dial(w.bannerAddr)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "banner: %q", line)
	assert.Equal(t, "SSH-2.0-test_banner\r\n", line, "banner")
	assert.GreaterOrEqual(t, time.Since(start), claimedDialDelay, "a claimed host was dialled before its hold")
	c.Close()
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && r.Host == "api.test" })
	assert.True(t, r.Allowed, "record %+v", r)
}
