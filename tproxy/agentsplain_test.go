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
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
)

// serveLong runs a plain HTTP server whose exchanges last: /upgrade
// switches to a line echo (Upgrade: echo), /flood switches and sends
// floodSize bytes, /mismatch switches to another protocol than asked
// and says on w.mismatchEnded how its connection ended, /quiet sends a
// line and then nothing for 20 s, /sink reads a
// request body as long as it comes, /stream sends a line every 20 ms for up to 20 s, /cut
// sends one line of a chunked body and then closes the connection.
func (w *world) serveLong(ip string) netip.AddrPort {
	ln := listenLoop(w.t, ip+":0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upgrade":
			c, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			for {
				line, err := brw.ReadString('\n')
				if err != nil {
					return
				}
				brw.WriteString("echo " + line)
				brw.Flush()
			}
		case "/flood":
			c, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Write(bytes.Repeat([]byte("x"), floodSize))
			brw.Flush()
		case "/mismatch": // switches to another protocol than the one asked for, and waits
			c, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
			brw.Flush()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Read(make([]byte, 1))
			w.mismatchEnded <- err
		case "/quiet": // a response that begins, then says nothing
			io.WriteString(rw, "first\n")
			http.NewResponseController(rw).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
		case "/sink": // reads the request body, as long as it comes
			io.Copy(io.Discard, r.Body)
		case "/stream":
			for range 1000 {
				if _, err := io.WriteString(rw, "tick\n"); err != nil {
					return
				}
				http.NewResponseController(rw).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		case "/cut":
			io.WriteString(rw, "tick\n")
			http.NewResponseController(rw).Flush()
			if c, _, err := http.NewResponseController(rw).Hijack(); err == nil {
				c.Close()
			}
		}
	})}
	go srv.Serve(ln)
	w.t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

const floodSize = 3 << 20

// plainPath opens a connection for plain HTTP to svc.test at addr, and
// says how a request line names its target there.
type plainPath struct {
	name   string
	open   func(w *world, addr netip.AddrPort) net.Conn
	target func(addr netip.AddrPort, path string) string
}

var plainPaths = []plainPath{
	{"transparent", func(w *world, addr netip.AddrPort) net.Conn { return w.dial(addr) },
		func(_ netip.AddrPort, path string) string { return path }},
	{"explicit", func(w *world, _ netip.AddrPort) net.Conn {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		require.NoError(w.t, err)
		w.t.Cleanup(func() { c.Close() })
		return c
	}, func(addr netip.AddrPort, path string) string {
		return fmt.Sprintf("http://svc.test:%d%s", addr.Port(), path)
	}},
}

// send sends a GET for path on c, with extra header lines.
func (p plainPath) send(c net.Conn, addr netip.AddrPort, path string, header ...string) {
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: svc.test:%d\r\n%s\r\n", p.target(addr, path), addr.Port(), strings.Join(append(header, ""), "\r\n"))
}

// upgradeHeader asks for the echo protocol.
var upgradeHeader = []string{"Connection: Upgrade", "Upgrade: echo"}

// openExchange sends a request for path on p and reads its answer's
// head: an upgrade's 101, or a stream's first line.
func openExchange(t *testing.T, w *world, p plainPath, addr netip.AddrPort, path string) (net.Conn, *bufio.Reader) {
	c := p.open(w, addr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if path == "/upgrade" {
		p.send(c, addr, path, upgradeHeader...)
	} else {
		p.send(c, addr, path)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	if path == "/upgrade" {
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		fmt.Fprintf(c, "ping\n")
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "echo ping\n", line)
		return c, br
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "tick\n", line)
	return c, br
}

// endsSoon asserts that c ends (end of stream, or a reset) well before
// its deadline, however much it had moved before; an upgrade is pinged
// as it goes, so that only an end stops the echo.
func endsSoon(t *testing.T, c net.Conn, br *bufio.Reader, upgrade bool) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var err error
	for err == nil {
		if upgrade {
			if _, err = fmt.Fprintf(c, "ping\n"); err == nil {
				_, err = br.ReadString('\n')
			}
			time.Sleep(10 * time.Millisecond)
		} else {
			_, err = br.ReadString('\n')
		}
	}
	assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "still open after 5 s: %v", err)
}

// TestPlainHTTPEndsOnForgetAndRejudge: a plain HTTP exchange that lasts
// (an upgrade's tunnel, a streamed response), transparent or through the
// explicit proxy, ends when its agent is forgotten, when a policy change
// refuses its host, and when one refuses its path, with a record that
// says why; one the change still allows goes on.
func TestPlainHTTPEndsOnForgetAndRejudge(t *testing.T) {
	actions := []struct {
		name   string
		act    func(w *world)
		reason string
	}{
		{"forget", func(w *world) { w.proxy.Forget("a1") }, ReasonForgotten},
		{"deny all", func(w *world) {
			w.setPolicy(policy.Config{Mode: policy.DenyAll})
			w.proxy.Rejudge("a1")
		}, ReasonPolicyChanged},
		{"deny its path", func(w *world) {
			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"GET svc.test:*/other"}})
			w.proxy.Rejudge("a1")
		}, ReasonPolicyChanged},
	}
	for _, p := range plainPaths {
		for _, path := range []string{"/upgrade", "/stream"} {
			for _, a := range actions {
				t.Run(p.name+path+"/"+a.name, func(t *testing.T) {
					w := newWorld(t, []string{"GET svc.test:*/upgrade", "GET svc.test:*/stream"}, nil)
					addr := w.serveLong("127.0.0.2")
					c, br := openExchange(t, w, p, addr, path)
					a.act(w)
					endsSoon(t, c, br, path == "/upgrade")
					r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == path })
					assert.True(t, strings.HasPrefix(r.Reason, a.reason), "record %+v", r)
					assert.True(t, r.Allowed, "it was allowed, and ended: record %+v", r)
				})
			}
		}
	}
}

// TestPlainMCPCallEndsWhenItsToolIsRefused: a tools/call posted to a
// plain HTTP MCP endpoint, whose answer streams, ends when a policy
// change refuses its tool, by the message judged as it came (its body
// gone on long since), and goes on when the change still allows it; so
// does a POST whose override method a change refuses.
func TestPlainMCPCallEndsWhenItsToolIsRefused(t *testing.T) {
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{}}}`
	for _, p := range plainPaths {
		for _, tc := range []struct {
			name        string
			header      string
			first, then string // allow entries, %d the port
			reason      string // "": kept
		}{
			{"tool refused", "", "mcp http://svc.test:%d/stream tools=search,fetch", "mcp http://svc.test:%d/stream tools=fetch", policy.ReasonMCPTool},
			{"tool kept", "", "mcp http://svc.test:%d/stream tools=search,fetch", "mcp http://svc.test:%d/stream tools=search", ""},
			{"override refused", "X-HTTP-Method-Override: DELETE\r\n", "POST,DELETE svc.test:%d/stream", "POST svc.test:%d/stream", policy.ReasonNoRequestRule},
		} {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				w := newWorld(t, nil, nil)
				addr := w.serveLong("127.0.0.2")
				w.setPolicy(policy.Config{Allow: []string{fmt.Sprintf(tc.first, addr.Port())}})
				c := p.open(w, addr)
				c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: svc.test:%d\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
					p.target(addr, "/stream"), addr.Port(), tc.header, len(call), call)
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				body := bufio.NewReader(resp.Body)
				_, err = body.ReadString('\n')
				require.NoError(t, err)

				w.setPolicy(policy.Config{Allow: []string{fmt.Sprintf(tc.then, addr.Port())}})
				w.proxy.Rejudge("a1")
				if tc.reason == "" {
					for range 10 { // a tick each 20 ms: well past the Rejudge
						line, err := body.ReadString('\n')
						require.NoError(t, err, "ended by a policy that allows it")
						assert.Equal(t, "tick\n", line)
					}
					return
				}
				endsSoon(t, c, body, false)
				r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/stream" })
				assert.Equal(t, ReasonPolicyChanged+tc.reason, r.Reason, "record %+v", r)
			})
		}
	}
}

// TestPlainHTTPKeptByAPolicyThatAllowsIt: Rejudge leaves a lasting
// exchange alone when the new policy still allows it.
func TestPlainHTTPKeptByAPolicyThatAllowsIt(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, nil)
			addr := w.serveLong("127.0.0.2")
			c, br := openExchange(t, w, p, addr, "/upgrade")
			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"GET svc.test:*/upgrade", "api.test:*"}})
			w.proxy.Rejudge("a1")
			fmt.Fprintf(c, "still\n")
			line, err := br.ReadString('\n')
			assert.NoError(t, err)
			assert.Equal(t, "echo still\n", line)
		})
	}
}

// TestPlainHTTPForgottenWhileJudged: a request whose agent is forgotten
// while its approval is awaited is refused, never forwarded.
func TestPlainHTTPForgottenWhileJudged(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			b := &approval.Broker{Timeout: 10 * time.Second}
			w := newWorld(t, nil, func(px *Proxy) { px.Approver = b })
			w.setPolicy(policy.Config{Ask: true})
			addr := w.serveLong("127.0.0.2")
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			p.send(c, addr, "/stream")
			require.Eventually(t, func() bool { return len(b.Pending()) == 1 }, 5*time.Second, time.Millisecond, "no approval request")
			w.proxy.Forget("a1")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil { // the explicit proxy answers; a transparent connection is reset
				assert.Equal(t, http.StatusForbidden, resp.StatusCode)
			}
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/stream" })
			assert.False(t, r.Allowed, "record %+v", r)
			assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
			assert.Zero(t, r.BytesDown, "record %+v", r)
		})
	}
}

// TestPlainHTTPCutStreamIsRecorded: a response its upstream cuts short
// mid-stream is recorded too (the forwarder ends such a response with a
// panic the server recovers from).
func TestPlainHTTPCutStreamIsRecorded(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, nil)
			addr := w.serveLong("127.0.0.2")
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			p.send(c, addr, "/cut")
			io.Copy(io.Discard, c)
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/cut" })
			assert.True(t, r.Allowed, "record %+v", r)
			assert.Equal(t, http.StatusOK, r.Status, "record %+v", r)
			assert.NotZero(t, r.BytesDown, "the line it had: record %+v", r)
		})
	}
}

// interceptedEcho opens a transparent connection to api.test that an
// echoing Interceptor holds, and has it echo curl's ClientHello.
func (w *world) interceptedEcho() net.Conn {
	w.t.Helper()
	curl, err := os.ReadFile("testdata/clienthello/curl-7.88-openssl-3.0.bin")
	require.NoError(w.t, err)
	hello := withServerName(w.t, curl, "api.test")
	c := w.dial(w.tlsAddr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Write(hello)
	require.NoError(w.t, err)
	_, err = io.ReadFull(c, make([]byte, len(hello)))
	require.NoError(w.t, err, "the interceptor's echo")
	return c
}

// echoInterceptor claims api.test and echoes what it is sent, the
// ClientHello first, until its connection ends.
type echoInterceptor struct{}

func (echoInterceptor) Claims(_, host string) bool { return host == "api.test" }

func (echoInterceptor) Intercept(_ context.Context, c net.Conn, _ string, _ policy.Current, _ string, _ uint16) error {
	io.Copy(c, c)
	return nil
}

// TestInterceptedEndsOnForgetAndRejudge: an intercepted connection (a
// WebSocket the Interceptor holds open, say) ends when its agent is
// forgotten, or when a policy change refuses its host, with a record
// that says why; one the change still allows goes on.
func TestInterceptedEndsOnForgetAndRejudge(t *testing.T) {
	for _, a := range []struct {
		name   string
		act    func(w *world)
		reason string // "": kept
	}{
		{"forget", func(w *world) { w.proxy.Forget("a1") }, ReasonForgotten},
		{"deny all", func(w *world) {
			w.setPolicy(policy.Config{Mode: policy.DenyAll})
			w.proxy.Rejudge("a1")
		}, ReasonPolicyChanged + policy.ReasonDenyAll},
		{"still allowed", func(w *world) {
			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:443", fmt.Sprintf("api.test:%d", w.tlsAddr.Port())}})
			w.proxy.Rejudge("a1")
		}, ""},
	} {
		t.Run(a.name, func(t *testing.T) {
			w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.Interceptor = echoInterceptor{} })
			c := w.interceptedEcho()
			require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 1 }, 5*time.Second, 10*time.Millisecond)
			a.act(w)
			br := bufio.NewReader(c)
			if a.reason == "" {
				fmt.Fprintf(c, "still\n")
				line, err := br.ReadString('\n')
				assert.NoError(t, err)
				assert.Equal(t, "still\n", line)
				return
			}
			endsSoon(t, c, br, true)
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && !r.Open })
			assert.Equal(t, a.reason, r.Reason, "record %+v", r)
		})
	}
}

// TestUpgradeHeldAndCounted: an upgrade's tunnel, transparent or through
// the explicit proxy, is held to the agent's byte rate and counted in its
// record, though the forwarder copies it beneath every response writer.
// The bound checked is a lower one: a slower machine only takes longer.
func TestUpgradeHeldAndCounted(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, nil, nil)
			w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: 1 << 20}})
			addr := w.serveLong("127.0.0.2")
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			start := time.Now()
			p.send(c, addr, "/flood", upgradeHeader...)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
			n, err := io.Copy(io.Discard, br)
			require.NoError(t, err)
			require.EqualValues(t, floodSize, n)
			// A second's burst, then two seconds at the rate.
			assert.Greater(t, time.Since(start), 1500*time.Millisecond, "3 MiB at 1 MiB/s took less than 1.5 s")
			c.Close()
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/flood" })
			assert.GreaterOrEqual(t, r.BytesDown, int64(floodSize), "record %+v", r)
		})
	}
}

// TestIdleUpgradeEnds: an upgrade's tunnel that moves nothing for the
// idle timeout is ended, as a relay is, with a record that says so.
func TestIdleUpgradeEnds(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, func(px *Proxy) { px.IdleTimeout = 300 * time.Millisecond })
			addr := w.serveLong("127.0.0.2")
			c, br := openExchange(t, w, p, addr, "/upgrade")
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err := br.ReadString('\n')
			assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "an idle upgrade still open after 5 s")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/upgrade" })
			assert.Equal(t, ReasonIdle, r.Reason, "record %+v", r)
			// The heads, and the tunnel's bytes.
			up, down := int64(len("GET /upgrade HTTP/1.1\r\n")+len("ping\n")), int64(len("HTTP/1.1 101 Switching Protocols\r\n")+len("echo ping\n"))
			assert.True(t, r.BytesUp >= up && r.BytesUp < up+512, "record %+v", r)
			assert.True(t, r.BytesDown >= down && r.BytesDown < down+512, "record %+v", r)
			assert.Equal(t, http.StatusSwitchingProtocols, r.Status, "record %+v", r)
		})
	}
}

// inFlightInterceptor claims api.test and, as mitm does for each request
// it forwards, registers one request with the policy.InFlight it is
// handed: judged by its path, /ws, and ended by closing the connection.
type inFlightInterceptor struct{ ended chan string }

func (inFlightInterceptor) Claims(_, host string) bool { return host == "api.test" }

func (i inFlightInterceptor) Intercept(ctx context.Context, c net.Conn, _ string, current policy.Current, host string, port uint16) error {
	track := policy.InFlightFrom(ctx)
	if track == nil {
		return errors.New("no InFlight in the Interceptor's context")
	}
	done, refused := track(func(why string) { i.ended <- why; c.Close() }, func() string {
		if d := current().DecideRequest(host, port, http.MethodGet, "/ws"); !d.Allowed {
			return d.Reason
		}
		return ""
	})
	defer done()
	if !refused {
		io.Copy(c, c)
	}
	return nil
}

// TestInterceptedRequestsEndOnForgetAndRejudge: a request an Interceptor
// forwards (a WebSocket) is found by Rejudge when the new policy refuses
// its path on a host it still allows, and by Forget.
func TestInterceptedRequestsEndOnForgetAndRejudge(t *testing.T) {
	for _, a := range []struct {
		name   string
		act    func(w *world)
		reason string
	}{
		{"forget", func(w *world) { w.proxy.Forget("a1") }, ReasonForgotten},
		{"deny its path", func(w *world) {
			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"GET api.test:*/other"}})
			w.proxy.Rejudge("a1")
		}, ReasonPolicyChanged + policy.ReasonNoRequestRule},
	} {
		t.Run(a.name, func(t *testing.T) {
			ic := inFlightInterceptor{ended: make(chan string, 1)}
			w := newWorld(t, []string{"GET api.test:*/ws"}, func(p *Proxy) { p.Interceptor = ic })
			w.interceptedEcho()
			a.act(w)
			select {
			case why := <-ic.ended:
				assert.Equal(t, a.reason, why)
			case <-time.After(5 * time.Second):
				assert.Fail(t, "the request was not ended")
			}
		})
	}
}

// TestIdleInterceptedEnds: an intercepted connection that moves nothing
// for the idle timeout (a WebSocket the Interceptor holds open, silent)
// is ended, as a relay is, with a record that says so.
func TestIdleInterceptedEnds(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) {
		p.Interceptor = echoInterceptor{}
		p.IdleTimeout = 300 * time.Millisecond
	})
	c := w.interceptedEcho()
	_, err := c.Read(make([]byte, 1))
	assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "an idle intercepted connection still open after 10 s")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && !r.Open })
	assert.Equal(t, ReasonIdle, r.Reason, "record %+v", r)
}

// TestRefusedSwitchClosesTheUpstream: an upstream that switches to
// another protocol than the one asked for is refused (502), and its
// connection closed: the forwarder leaves it open, and an agent whose
// server answers so would make the gateway hold a connection for each
// request.
func TestRefusedSwitchClosesTheUpstream(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, nil)
			w.mismatchEnded = make(chan error, 1)
			addr := w.serveLong("127.0.0.2")
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			p.send(c, addr, "/mismatch", upgradeHeader...)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
			err = <-w.mismatchEnded
			assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the upstream connection is still open: %v", err)
		})
	}
}

// TestEndlessUploadEndsOnForgetAndRejudge: a request whose body streams
// up without end, to an upstream that reads it all, stops going up when
// its agent is forgotten or a policy change refuses its host.
func TestEndlessUploadEndsOnForgetAndRejudge(t *testing.T) {
	for _, p := range plainPaths {
		for _, a := range []struct {
			name string
			act  func(w *world)
		}{
			{"forget", func(w *world) { w.proxy.Forget("a1") }},
			{"deny all", func(w *world) {
				w.setPolicy(policy.Config{Mode: policy.DenyAll})
				w.proxy.Rejudge("a1")
			}},
		} {
			t.Run(p.name+"/"+a.name, func(t *testing.T) {
				w := newWorld(t, []string{"svc.test:*"}, nil)
				addr := w.serveLong("127.0.0.2")
				c := p.open(w, addr)
				p.send(c, addr, "/sink", "Transfer-Encoding: chunked")
				chunk := []byte(fmt.Sprintf("%x\r\n%s\r\n", 16<<10, bytes.Repeat([]byte("u"), 16<<10)))
				c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				for range 64 { // 1 MiB up before the change
					_, err := c.Write(chunk)
					require.NoError(t, err)
				}
				require.Eventually(t, func() bool {
					v, ok := w.proxy.agentConns.Load("a1")
					return ok && len(movingIn(v.(*connSet).snapshot())) > 0
				}, 5*time.Second, 10*time.Millisecond, "the upload is not being forwarded")
				a.act(w)
				c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				var err error
				for i := 0; err == nil && i < 100_000; i++ { // at most 1.6 GiB
					_, err = c.Write(chunk)
				}
				assert.Error(t, err, "the upload still goes up")
				assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the upload was held, not ended: %v", err)
			})
		}
	}
}

// TestSilentResponseEnds: a plain HTTP response that begins and then
// moves nothing for the idle timeout (an event stream with no events) is
// ended, with a record that says so; one that keeps moving is not.
func TestSilentResponseEnds(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, func(px *Proxy) { px.IdleTimeout = 300 * time.Millisecond })
			addr := w.serveLong("127.0.0.2")
			kept, keptBr := openExchange(t, w, p, addr, "/stream") // a line every 20 ms
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			p.send(c, addr, "/quiet")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			_, err = io.Copy(io.Discard, resp.Body)
			assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "a silent response still open after 10 s")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/quiet" })
			assert.Equal(t, ReasonIdle, r.Reason, "record %+v", r)

			kept.SetDeadline(time.Now().Add(5 * time.Second))
			for ticks := 0; ticks < 10; { // 200 ms more of it, well past the idle timeout since it began
				line, err := keptBr.ReadString('\n') // the chunked body, line by line
				require.NoError(t, err, "a response that keeps moving was ended")
				if line == "tick\n" {
					ticks++
				}
			}
		})
	}
}
