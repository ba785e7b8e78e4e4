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
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// TestPolicyChangeWhileJudged: a connection accepted before a policy
// change, silent through it (and through the Rejudge that follows, which
// finds no relay to judge), is judged by the policy as it is when it
// speaks: its relay is judged again as it starts, so a ClientHello naming
// a host the change took away, or bytes to a name it took away, never
// reach the server.
func TestPolicyChangeWhileJudged(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "blocked.test:*", "svc.test:*"}, nil)
	w.setNames("svc.test") // a speculative target: the silent client is held for the idle timeout
	silentTLS := w.dial(w.tlsAddr)
	silentTCP := w.dial(w.echoAddr)
	require.Eventually(t, func() bool {
		v, ok := w.proxy.agentConns.Load("a1")
		return ok && len(v.(*connSet).snapshot()) == 2
	}, 5*time.Second, 10*time.Millisecond, "the silent connections are not held")
	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}})
	w.proxy.Rejudge("a1")

	tc := tls.Client(silentTLS, &tls.Config{ServerName: "blocked.test", RootCAs: w.ca.Pool})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	assert.Error(t, tc.Handshake(), "a host the change took away was reached")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "blocked.test" && !r.Open })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Empty(t, r.Rule, "a rule the change took away: record %+v", r)
	assert.Contains(t, r.Reason, ReasonPolicyChanged+policy.ReasonNoRule, "record %+v", r)
	assert.Zero(t, r.BytesUp, "bytes went up: record %+v", r)

	silentTCP.Write([]byte("after the change\n"))
	silentTCP.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(silentTCP)
	assert.Empty(t, got, "the server answered bytes the change refused")
	assert.Error(t, err, "the connection was not reset")
	r = w.waitRecord(func(r egresslog.Record) bool { return r.Host == "svc.test" && !r.Open })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Contains(t, r.Reason, ReasonPolicyChanged+policy.ReasonNoRule, "record %+v", r)
	assert.Zero(t, r.BytesUp, "bytes went up: record %+v", r)
}

// slowResolver holds lookups of one name until released.
type slowResolver struct {
	testkit.Resolver
	slow    string
	asked   chan struct{}
	release chan struct{}
}

func (r slowResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if host == r.slow {
		r.asked <- struct{}{}
		select {
		case <-r.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return r.Resolver.LookupNetIP(ctx, network, host)
}

// worldWithSlowName is a world whose resolver holds slow.test (at
// 127.0.0.2) until release is closed, and says on asked when it is held.
func worldWithSlowName(t *testing.T, allow []string) (w *world, asked, release chan struct{}) {
	asked, release = make(chan struct{}, 1), make(chan struct{})
	w = newWorld(t, allow, func(p *Proxy) {
		r := p.Resolver.(testkit.Resolver)
		r["slow.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
		p.Resolver = slowResolver{Resolver: r, slow: "slow.test", asked: asked, release: release}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return w, asked, release
}

// TestForgetWhileDialling: a CONNECT whose dial is under way when its
// agent is forgotten is refused, not answered once the dial completes.
func TestForgetWhileDialling(t *testing.T) {
	w, asked, release := worldWithSlowName(t, []string{"*"})
	answered := make(chan *http.Response, 1)
	go func() {
		_, _, resp := w.connectTo(fmt.Sprintf("slow.test:%d", w.echoAddr.Port()))
		answered <- resp
	}()
	<-asked
	w.proxy.Forget("a1")
	close(release)
	resp := <-answered
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a forgotten agent's CONNECT was answered")
	assert.Contains(t, resp.Header.Get("Proxy-Status"), ReasonForgotten)
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "slow.test" })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
}

// TestForgetBeforeItSpeaks: a transparent connection whose agent is
// forgotten before its client says a word is reset and recorded as
// forgotten, not as a client that left.
func TestForgetBeforeItSpeaks(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	c := w.dial(w.tlsAddr)
	require.Eventually(t, func() bool { conns, _ := tracked(w.proxy, "a1"); return conns == 1 }, 5*time.Second, time.Millisecond, "the connection was never tracked")
	w.proxy.Forget("a1")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadAll(c)
	assert.Error(t, err, "not reset")
	r := w.waitRecord(func(r egresslog.Record) bool { return !r.Open })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
}

// TestPolicyChangeWhileDialling: a CONNECT judged before a policy change
// and dialled after it never carries a byte: its tunnel is judged again
// as it starts, by the policy as it is then.
func TestPolicyChangeWhileDialling(t *testing.T) {
	w, asked, release := worldWithSlowName(t, []string{"*"})
	type tunnel struct {
		c    net.Conn
		br   *bufio.Reader
		resp *http.Response
	}
	answered := make(chan tunnel, 1)
	go func() {
		c, br, resp := w.connectTo(fmt.Sprintf("slow.test:%d", w.echoAddr.Port()))
		answered <- tunnel{c, br, resp}
	}()
	<-asked
	w.setPolicy(policy.Config{Mode: policy.DenyAll})
	w.proxy.Rejudge("a1")
	close(release)
	tun := <-answered
	if tun.resp.StatusCode == http.StatusOK { // answered before it was judged again: ended at once
		tun.c.Write([]byte("after the change\n"))
		tun.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(tun.br)
		assert.Empty(t, got, "the tunnel carried bytes the change refused")
		tun.c.Close()
	}
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "slow.test" && !r.Open })
	assert.True(t, strings.HasPrefix(r.Reason, ReasonPolicyChanged), "record %+v", r)
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Zero(t, r.BytesUp, "bytes went up: record %+v", r)
}

// TestForgetEndsTheUpstreamToo: Forget ends a relayed connection on both
// sides at once, though its client had half-closed and its upstream is
// silent, so that nothing reads the client any more: the upstream does
// not stay open, holding the connection's budgets.
func TestForgetEndsTheUpstreamToo(t *testing.T) {
	ln := listenLoop(t, "127.0.0.2:0")
	accepted := make(chan net.Conn, 1)
	go acceptLoop(ln, func(c net.Conn) { accepted <- c }) // a silent server
	w := newWorld(t, []string{"svc.test:*"}, nil)
	w.setNames("svc.test")
	c := w.dial(netip.MustParseAddrPort(ln.Addr().String()))
	c.Write([]byte("x"))
	c.(*net.TCPConn).CloseWrite()
	var srv net.Conn
	select {
	case srv = <-accepted:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "no upstream connection")
	}
	defer srv.Close()
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(srv) // the byte, then the client's half-close
	require.NoError(t, err)
	require.Equal(t, "x", string(got))
	require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 1 }, 5*time.Second, 10*time.Millisecond)

	w.proxy.Forget("a1")
	_, err = srv.Write([]byte("y"))
	if err == nil {
		srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = srv.Read(make([]byte, 1))
	}
	assert.Error(t, err, "the upstream outlived the forgotten agent")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "svc.test" && !r.Open })
	assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
	assert.Eventually(t, func() bool { return w.proxy.open.Load() == 0 }, 5*time.Second, 10*time.Millisecond, "the connection's budget is still held")
}

// TestTrackedDuringForgetIsReachable: a connection tracked while Forget
// runs, into the set Forget takes, goes into the agent's next set, which
// the next Forget reaches: none lands in a set no Forget reaches.
func TestTrackedDuringForgetIsReachable(t *testing.T) {
	p := &Proxy{}
	found := p.agentSet("a1") // what a tracker finds, before it adds to it
	p.Forget("a1")            // taken meanwhile
	assert.False(t, found.add(&agentConn{}), "a set Forget took takes more")
	ac, _ := p.trackAgentConn("a1", nil, nil)
	p.Forget("a1")
	assert.True(t, ac.gone(), "a connection tracked after a Forget was not found by the next")
}
