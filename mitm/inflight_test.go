package mitm

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

// TestWebSocketEndsOnRejudgeAndForget: a WebSocket through tproxy and the
// Interceptor ends when a policy change refuses its path, on a host the
// change still allows (tproxy.Proxy.Rejudge), and when its agent is
// forgotten (Forget), with a record that says why: each request mitm
// forwards registers with the policy.InFlight tproxy hands it.
func TestWebSocketEndsOnRejudgeAndForget(t *testing.T) {
	for _, a := range []struct {
		name   string
		act    func(r *rig, p *tproxy.Proxy)
		reason string
	}{
		{"deny its path", func(r *rig, p *tproxy.Proxy) {
			pol, err := policy.New(policy.Config{Allow: []string{"GET api.test:*/public/*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
			require.NoError(t, err)
			r.changed.Store(pol)
			p.Rejudge("a1")
		}, tproxy.ReasonPolicyChanged + policy.ReasonNoRequestRule},
		{"forget", func(_ *rig, p *tproxy.Proxy) { p.Forget("a1") }, tproxy.ReasonForgotten},
	} {
		t.Run(a.name, func(t *testing.T) {
			r := newRig(t)
			withRequestEntries(t, r)
			r.mux.Handle("/ws/", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
			p := &tproxy.Proxy{
				Agents:   func(netip.Addr) (string, *policy.Policy, bool) { return "a1", r.current(), true },
				Guard:    r.ic.Guard,
				Resolver: r.ic.Resolver,
				Log:      r.log,
				OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
					return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), r.upPort), nil
				},
				Interceptor: r.ic,
			}
			ln, err := tproxy.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go p.Serve(ln)
			t.Cleanup(func() { p.Close() })

			cfg, err := websocket.NewConfig("wss://api.test/ws/allowed", "https://api.test/")
			require.NoError(t, err)
			cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
			raw, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			ws, err := websocket.NewClient(cfg, tls.Client(raw, cfg.TlsConfig))
			require.NoError(t, err, "websocket handshake")
			defer ws.Close()
			ws.SetDeadline(time.Now().Add(5 * time.Second))
			require.NoError(t, websocket.Message.Send(ws, "hello"))
			var got string
			require.NoError(t, websocket.Message.Receive(ws, &got))
			require.Equal(t, "hello", got)

			a.act(r, p)
			for err == nil { // the echo stops: the WebSocket ended
				if err = websocket.Message.Send(ws, "again"); err == nil {
					err = websocket.Message.Receive(ws, &got)
				}
			}
			assert.False(t, strings.Contains(err.Error(), "timeout"), "still open after 5 s: %v", err)
			rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Kind == egresslog.KindHTTP && rec.Path == "/ws/allowed" })
			assert.Equal(t, a.reason, rec.Reason, "record %+v", rec)
		})
	}
}

// TestRequestRefusedAsItRegisters: a request whose registration says it
// is refused (the policy changed, or its agent was forgotten, since it
// was judged) is answered 403 and recorded so, never forwarded.
func TestRequestRefusedAsItRegisters(t *testing.T) {
	r := newRig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ctx := policy.WithInFlight(t.Context(), func(end func(string), _ func() string) (func(), bool) {
		end(tproxy.ReasonForgotten)
		return func() {}, true
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.ic.Intercept(ctx, c, "a1", r.current, "api.test", r.upPort)
		}
	}()
	resp, _ := r.get(r.client(ln.Addr().String(), false), "https://api.test/refused", nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Nil(t, r.upHeader.Load(), "the request reached the upstream")
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/refused" })
	assert.False(t, rec.Allowed, "record %+v", rec)
	assert.Equal(t, tproxy.ReasonForgotten, rec.Reason, "record %+v", rec)
}
