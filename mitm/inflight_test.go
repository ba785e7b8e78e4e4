package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
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
			p, addr := r.interceptingTProxy(t)

			cfg, err := websocket.NewConfig("wss://api.test/ws/allowed", "https://api.test/")
			require.NoError(t, err)
			cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
			raw, err := net.Dial("tcp", addr)
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

// TestUpgradeCountedAndClosed: a WebSocket's bytes are counted in its
// record, each way; an upstream that switches to another protocol than
// the one asked for is refused (502) and its connection closed, not left
// open for as long as it likes.
func TestUpgradeCountedAndClosed(t *testing.T) {
	r := newRig(t)
	r.mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	ended := make(chan error, 1)
	r.mux.HandleFunc("/mismatch", func(w http.ResponseWriter, _ *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
		brw.Flush()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		ended <- err
	})

	cfg, err := websocket.NewConfig("wss://api.test/ws", "https://api.test/")
	require.NoError(t, err)
	cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	ws, err := websocket.NewClient(cfg, tls.Client(raw, cfg.TlsConfig))
	require.NoError(t, err, "websocket handshake")
	msg := strings.Repeat("x", 10_000)
	require.NoError(t, websocket.Message.Send(ws, msg))
	ws.SetDeadline(time.Now().Add(5 * time.Second))
	var echoed strings.Builder
	for echoed.Len() < len(msg) { // the echo may come in several frames
		var got string
		require.NoError(t, websocket.Message.Receive(ws, &got))
		echoed.WriteString(got)
	}
	require.Equal(t, msg, echoed.String())
	ws.Close()
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/ws" })
	assert.GreaterOrEqual(t, rec.BytesUp, int64(len(msg)), "record %+v", rec)
	assert.GreaterOrEqual(t, rec.BytesDown, int64(len(msg)), "record %+v", rec)
	assert.Equal(t, http.StatusSwitchingProtocols, rec.Status, "record %+v", rec)

	req, err := http.NewRequest(http.MethodGet, "https://api.test/mismatch", nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket") // over HTTP/1.1 to the upstream, as only a WebSocket upgrade is
	resp, err := r.client(r.addr, false).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	select {
	case err := <-ended:
		assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the upstream connection is still open: %v", err)
	case <-time.After(15 * time.Second):
		assert.Fail(t, "the upstream never saw its connection end")
	}
}

// TestMCPToolCallEndsWhenItsToolIsRefused: a tools/call that lasts (a
// long tool), through tproxy and the Interceptor, ends when a policy
// change refuses its tool on an endpoint the change still allows, by
// the message judged as it came (its body gone on long since), with a
// record that says why; a change that still allows the tool leaves it
// to finish.
func TestMCPToolCallEndsWhenItsToolIsRefused(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		for _, tc := range []struct {
			name, tools, reason string // reason "": kept
		}{
			{"refused", "search", tproxy.ReasonPolicyChanged + policy.ReasonMCPTool},
			{"kept", "search,slow", ""},
		} {
			t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2]+"/"+tc.name, func(t *testing.T) {
				r := newRig(t)
				started, release := make(chan struct{}, 1), make(chan struct{})
				s := mcp.NewServer(&mcp.Implementation{Name: "slow-tools", Version: "1"}, nil)
				mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "runs until released"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ queryArgs) (*mcp.CallToolResult, any, error) {
					started <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
					case <-time.After(20 * time.Second):
					}
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
				})
				r.mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}))
				endpoint := fmt.Sprintf("https://api.test:%d/mcp", r.upPort)
				setTools := func(tools string) {
					pol, err := policy.New(policy.Config{Allow: []string{"mcp " + endpoint + " tools=" + tools}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
					require.NoError(t, err)
					r.changed.Store(pol)
				}
				setTools("search,slow")
				p, addr := r.interceptingTProxy(t)

				client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
				session, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{
					Endpoint: endpoint, HTTPClient: r.client(addr, h2), MaxRetries: -1,
				}, nil)
				require.NoError(t, err, "the session starts through the gateway")
				defer session.Close()
				called := make(chan error, 1)
				go func() {
					_, err := session.CallTool(t.Context(), &mcp.CallToolParams{Name: "slow", Arguments: queryArgs{Query: "long"}})
					called <- err
				}()
				select {
				case <-started:
				case <-time.After(5 * time.Second):
					require.FailNow(t, "the tool never started")
				}

				setTools(tc.tools)
				p.Rejudge("a1")
				if tc.reason == "" {
					close(release)
				}
				select {
				case err := <-called:
					if tc.reason == "" {
						assert.NoError(t, err, "a call the policy still allows")
					} else {
						assert.Error(t, err, "the call was not ended")
					}
				case <-time.After(5 * time.Second):
					assert.Fail(t, "the call is still open 5 s after the change")
				}
				if tc.reason != "" {
					close(release)
				}
				rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Tool == "slow" })
				if tc.reason != "" {
					assert.Equal(t, tc.reason, rec.Reason, "record %+v", rec)
				} else {
					assert.Equal(t, policy.ReasonAllowedByRule, rec.Reason, "record %+v", rec)
				}
			})
		}
	}
}

// TestInterceptedRequestWhoseClientStalls: a request whose sandbox
// client stopped reading its response ends, and is recorded, when a
// policy change refuses it: its handler was blocked in a write to the
// client, which ending its context does not end.
func TestInterceptedRequestWhoseClientStalls(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			r := newRig(t)
			withRequestEntries(t, r)
			var lastWrite atomic.Int64 // when the upstream's last write returned
			chunk := []byte(strings.Repeat("z", 64<<10))
			r.mux.HandleFunc("/public/stream", func(w http.ResponseWriter, req *http.Request) {
				for req.Context().Err() == nil {
					if _, err := w.Write(chunk); err != nil {
						return
					}
					lastWrite.Store(time.Now().UnixNano())
				}
			})
			p, addr := r.interceptingTProxy(t)

			raw, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer raw.Close()
			raw.(*net.TCPConn).SetReadBuffer(64 << 10)
			tr := &http.Transport{
				DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
					c := tls.Client(raw, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test", NextProtos: map[bool][]string{false: {"http/1.1"}, true: {"h2"}}[h2]})
					return c, c.Handshake()
				},
				ForceAttemptHTTP2: h2,
			}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			t.Cleanup(tr.CloseIdleConnections)
			resp, err := (&http.Client{Transport: tr}).Get("https://api.test/public/stream")
			require.NoError(t, err)
			defer resp.Body.Close() // read no further
			require.Eventually(t, func() bool {
				last := lastWrite.Load()
				return last != 0 && time.Since(time.Unix(0, last)) > 200*time.Millisecond
			}, 10*time.Second, 10*time.Millisecond, "the upstream's writes never blocked")

			pol, err := policy.New(policy.Config{Allow: []string{"GET api.test:*/other"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
			require.NoError(t, err)
			r.changed.Store(pol)
			start := time.Now()
			p.Rejudge("a1")
			rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/public/stream" })
			assert.Equal(t, tproxy.ReasonPolicyChanged+policy.ReasonNoRequestRule, rec.Reason, "record %+v", rec)
			// TLS's close_notify waited 5 s on the client that reads nothing.
			assert.Less(t, time.Since(start), 2*time.Second, "ended, and recorded, only after %v", time.Since(start))
		})
	}
}

// TestUnreadBodyDoesNotHoldTheConnection: a refused request whose body
// stops coming is answered, and its connection closed, at once: net/http
// reads what remains of a body after the handler, without a deadline.
func TestUnreadBodyDoesNotHoldTheConnection(t *testing.T) {
	r := newRig(t)
	withRequestEntries(t, r)
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(c, "POST /refused HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "no answer")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	_, err = io.Copy(io.Discard, br)
	assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the connection is still open: %v", err)
}

// TestFullDuplexIntercepted: an intercepted request's body reaches an
// upstream that answered before it had all come, and the answer reaches
// the client whole: net/http had read what remained of the body at the
// answer's first write, and closed it, beneath the forwarder.
func TestFullDuplexIntercepted(t *testing.T) {
	r := newRig(t)
	r.mux.HandleFunc("/upload", testkit.EarlyAnswer)
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	testkit.CheckEarlyAnswer(t, c, "POST /upload HTTP/1.1\r\nHost: api.test\r\n")
}

// TestEarlyAnswerDoesNotHoldTheConnection: an intercepted request
// answered before its body came, by an HTTP/1.1 upstream, ends with its
// answer though the body never comes whole, and what came of it (a
// request of its own) is answered by no one: net/http had cleared the
// deadline that ends the forwarder's read under way, and read the rest
// of the body after the handler, with none.
func TestEarlyAnswerDoesNotHoldTheConnection(t *testing.T) {
	r := newRig(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	up := &http.Server{Handler: http.HandlerFunc(testkit.EarlyAnswerUnread),
		TLSConfig: &tls.Config{GetCertificate: upstreamCert(r.upRoot), NextProtos: []string{"http/1.1"}}}
	go up.ServeTLS(ln, "", "")
	t.Cleanup(func() { up.Close() })
	raw, err := net.Dial("tcp", r.serveInterceptedTo("api.test", uint16(ln.Addr().(*net.TCPAddr).Port)))
	require.NoError(t, err)
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	testkit.CheckEndsAfterEarlyAnswer(t, c, "POST /upload HTTP/1.1\r\nHost: api.test\r\n", "GET /next HTTP/1.1\r\nHost: api.test\r\n\r\n")
}
