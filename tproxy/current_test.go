package tproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// TestPolicyChangeJudgesTheNextRequest: a request on a kept-alive plain
// HTTP connection is judged by the policy of its moment, not by the one
// the connection was accepted under.
func TestPolicyChangeJudgesTheNextRequest(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	c := w.dial(w.httpAddr)
	br := bufio.NewReader(c)
	get := func() *http.Response {
		t.Helper()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	require.Equal(t, http.StatusOK, get().StatusCode, "before the change")
	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"other.test:*"}})
	resp := get()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "the same connection after the change")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && !r.Allowed })
	assert.Equal(t, policy.ReasonNoRule, r.Reason, "record %+v", r)
}

// TestRejudgeEndsSplicedConnections: after a policy change, Rejudge ends
// the spliced connections the new policy refuses, with a record that says
// so, and leaves the others open.
func TestRejudgeEndsSplicedConnections(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*", "api.test:*"}, nil)
	w.setNames("svc.test")
	banner := w.dial(w.bannerAddr)
	br := bufio.NewReader(banner)
	banner.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := br.ReadString('\n')
	require.NoError(t, err, "banner")
	require.Equal(t, "SSH-2.0-test_banner\r\n", line)

	kept := w.dial(w.echoAddr) // judged by svc.test too
	kept.Write([]byte("x\n"))  // spliced once the client speaks
	w.setNames("api.test")
	other := w.dial(w.echoAddr) // judged by api.test, which both policies allow
	other.Write([]byte("x\n"))
	require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 3 }, 5*time.Second, 10*time.Millisecond, "three spliced connections")

	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}})
	w.proxy.Rejudge("a1")
	_, err = br.ReadString('\n')
	assert.Error(t, err, "a connection the new policy refuses is still open")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "svc.test" && !r.Open })
	assert.Contains(t, r.Reason, ReasonPolicyChanged+policy.ReasonNoRule, "record %+v", r)

	// kept was judged by svc.test too (the names remembered then): ended.
	kept.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = kept.Read(make([]byte, 1))
	assert.Error(t, err, "the second connection to svc.test is still open")
	// other, judged by api.test, goes on.
	other.Write([]byte("still here"))
	other.(*net.TCPConn).CloseWrite()
	other.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(other)
	require.NoError(t, err, "a connection the new policy allows was ended")
	assert.Equal(t, "echo:x\nstill here", string(got))
}

// TestDenyEntryWithPortForRawTCP: under "*" and under open mode, a deny
// entry for a name on one port refuses TCP to an address the agent
// resolved that name to, on that port, though the address alone would be
// allowed.
func TestDenyEntryWithPortForRawTCP(t *testing.T) {
	for _, cfg := range []policy.Config{
		{Mode: policy.Allowlist, Allow: []string{"*"}},
		{Mode: policy.Open},
	} {
		t.Run(cfg.Mode.String(), func(t *testing.T) {
			w := newWorld(t, nil, func(p *Proxy) { p.HelloTimeout = 300 * time.Millisecond })
			deny := fmt.Sprintf("svc.test:%d", w.bannerAddr.Port())
			cfg.Deny = []string{deny}
			w.setPolicy(cfg)
			w.setNames("svc.test")
			c := w.dial(w.bannerAddr)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := bufio.NewReader(c).ReadString('\n')
			assert.Error(t, err, "the server behind a denied name spoke")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP })
			assert.False(t, r.Allowed, "record %+v", r)
			assert.Equal(t, policy.ReasonDenyEntry, r.Reason, "record %+v", r)
			assert.Equal(t, "!"+deny, r.Rule, "record %+v", r)
			assert.Equal(t, "svc.test", r.Host, "record %+v", r)
		})
	}
}

// TestSilentClientRefusedAtOnce: a client that says nothing, on a port no
// destination could be allowed on, is refused at once rather than held
// until the hello timeout.
func TestSilentClientRefusedAtOnce(t *testing.T) {
	w := newWorld(t, []string{"*"}, func(p *Proxy) { p.HelloTimeout = time.Hour })
	for _, tc := range []struct {
		name   string
		cfg    policy.Config
		reason string
	}{
		{"deny-all", policy.Config{Mode: policy.DenyAll}, policy.ReasonDenyAll},
		{"a port no entry names", policy.Config{Allow: []string{"api.test"}}, policy.ReasonPortNotListed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.setPolicy(tc.cfg)
			c, err := w.tryDial(w.echoAddr)
			if err == nil { // else reset before the dial returned
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Read(make([]byte, 1))
			}
			require.Error(t, err)
			var ne net.Error
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the silent client was held: %v", err)
			w.waitRecord(func(r egresslog.Record) bool { return !r.Allowed && r.Reason == tc.reason })
		})
	}
	t.Run("DNS over TLS under *", func(t *testing.T) {
		w.setPolicy(policy.Config{Allow: []string{"*"}})
		assert.False(t, w.pol.Load().DecidePort(853).Allowed)
	})
}

// TestConnectToAddress: a CONNECT to an address is judged as transparent
// TCP to it is (names the agent resolved to it, then the address), and
// answered 200 only once dialled; otherwise refused with a reason.
func TestConnectToAddress(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	target := w.tlsAddr.String()
	_, _, resp := w.connectTo(target)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "an address no entry allows, and no name")
	assert.Contains(t, resp.Header.Get("Proxy-Status"), ReasonNoName)

	w.setNames("api.test")
	c, br, resp := w.connectTo(target)
	require.Equal(t, http.StatusOK, resp.StatusCode, "an address the agent resolved an allowed name to")
	assert.Contains(t, tlsGet(t, c, br, "api.test", w), w.tlsAddr.String())

	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}, Deny: []string{fmt.Sprintf("api.test:%d", w.tlsAddr.Port())}})
	_, _, resp = w.connectTo(target)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a resolved name a deny entry refuses on this port")
	assert.Contains(t, resp.Header.Get("Proxy-Status"), policy.ReasonDenyEntry)
}
