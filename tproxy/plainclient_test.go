package tproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// serveHeads runs a plain HTTP server that answers each request with a
// response head of header fields weighing size bytes.
func (w *world) serveHeads(size int) netip.AddrPort {
	ln := listenLoop(w.t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		for i := 0; i*1000 < size; i++ {
			rw.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("d", 1000))
		}
		io.WriteString(rw, "ok")
	}), MaxHeaderBytes: 1 << 20}
	go srv.Serve(ln)
	w.t.Cleanup(func() { srv.Close() })
	return addrPortOf(ln.Addr())
}

// bigHead is header lines weighing about size bytes.
func bigHead(size int) string {
	var b strings.Builder
	for i := 0; i*1000 < size; i++ {
		fmt.Fprintf(&b, "X-Field-%d: %s\r\n", i, strings.Repeat("s", 1000))
	}
	return b.String()
}

// TestPlainHTTPHeadsHeldAndCounted: a plain HTTP request's head and its
// response's are held to the agent's byte rates, through the explicit
// proxy as on a transparent connection, and counted in the request's
// record: net/http reads and writes heads beneath the bodies that were
// paced and counted, and an agent could move as much as it liked in
// header fields.
func TestPlainHTTPHeadsHeldAndCounted(t *testing.T) {
	const rate = 64 << 10
	for _, p := range plainPaths {
		t.Run(p.name+"/up", func(t *testing.T) {
			w := newWorld(t, nil, nil)
			w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondUp: rate}})
			addr := w.serveHeads(0)
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(c)
			const requests, size = 3, 60 << 10
			start := time.Now()
			for range requests {
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: svc.test:%d\r\n%s\r\n", p.target(addr, "/"), addr.Port(), bigHead(size))
				resp, err := http.ReadResponse(br, nil)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			// A second's burst, then the rate.
			assert.Greater(t, time.Since(start), time.Duration((float64(requests*size)/rate-1.5)*float64(time.Second)), "heads up not held to the rate")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP })
			assert.Greater(t, r.BytesUp, int64(size), "the head is not in the record: %+v", r)
		})
		t.Run(p.name+"/down", func(t *testing.T) {
			w := newWorld(t, nil, nil)
			w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: rate}})
			const size = 192 << 10
			addr := w.serveHeads(size)
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			start := time.Now()
			p.send(c, addr, "/", "Connection: close")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Greater(t, time.Since(start), time.Duration((float64(size)/rate-1.5)*float64(time.Second)), "the head down not held to the rate")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP })
			assert.Greater(t, r.BytesDown, int64(size), "the head is not in the record: %+v", r)
		})
	}
}

// TestResponseHeadBounded: an upstream's response head beyond
// httpfwd.MaxResponseHeaderBytes is refused (502), not passed on: net/http
// takes 10 MB, for every request.
func TestResponseHeadBounded(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, nil, nil)
			w.setPolicy(policy.Config{Mode: policy.Open})
			addr := w.serveHeads(httpfwd.MaxResponseHeaderBytes + 64<<10)
			c := p.open(w, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			p.send(c, addr, "/", "Connection: close")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
			assert.Less(t, len(resp.Header), 10, "the head was passed on")
		})
	}
}

// TestUnreadBodyDoesNotHoldTheConnection: a refused request whose body
// stops coming is answered, and its connection closed, at once: net/http
// reads what remains of a body after the handler, without a deadline and
// where neither Forget, Rejudge nor the idle sweep sees it, so such a
// connection stayed open for as long as its client liked. One forwarded,
// whose upstream answered without reading its body, waits for it the same
// way, seen: the idle sweep ends it.
func TestUnreadBodyDoesNotHoldTheConnection(t *testing.T) {
	for _, p := range plainPaths {
		for _, tc := range []struct {
			name, host string
			status     int // 0: ended, unanswered
		}{
			{"refused", "blocked.test", http.StatusForbidden},
			{"answered unread", "svc.test", 0},
		} {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				w := newWorld(t, []string{"svc.test:*"}, func(px *Proxy) { px.IdleTimeout = 300 * time.Millisecond })
				addr := w.serveLong("127.0.0.2")
				c := p.open(w, addr)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				target := p.target(addr, "/unread")
				if p.name == "explicit" {
					target = fmt.Sprintf("http://%s:%d/unread", tc.host, addr.Port())
				}
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s:%d\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", target, tc.host, addr.Port())
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if tc.status == 0 {
					assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "still open after 5 s: %v", err)
					r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/unread" })
					assert.Equal(t, ReasonIdle, r.Reason, "record %+v", r)
					return
				}
				require.NoError(t, err, "no answer")
				assert.Equal(t, tc.status, resp.StatusCode)
				_, err = io.Copy(io.Discard, br)
				assert.NoError(t, err, "the connection is still open")
			})
		}
	}
}

// TestEndedRequestWhoseClientStalls: a request whose client stopped
// reading its response ends, and is recorded, when its agent is
// forgotten or a policy change refuses it: its handler was blocked in a
// write to the client, which ending its context does not end.
func TestEndedRequestWhoseClientStalls(t *testing.T) {
	for _, p := range plainPaths {
		for _, a := range []struct {
			name   string
			act    func(w *world)
			reason string
		}{
			{"forget", func(w *world) { w.proxy.Forget("a1") }, ReasonForgotten},
			{"rejudge", func(w *world) { w.setPolicy(policy.Config{Mode: policy.DenyAll}); w.proxy.Rejudge("a1") }, ReasonPolicyChanged + policy.ReasonDenyAll},
		} {
			t.Run(p.name+"/"+a.name, func(t *testing.T) {
				w := newWorld(t, nil, nil)
				w.setPolicy(policy.Config{Mode: policy.Open})
				var lastWrite atomic.Int64 // when the upstream's last write returned
				backend := listenLoop(t, "127.0.0.2:0")
				chunk := []byte(strings.Repeat("z", 64<<10))
				srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
					for r.Context().Err() == nil {
						if _, err := rw.Write(chunk); err != nil {
							return
						}
						lastWrite.Store(time.Now().UnixNano())
					}
				})}
				go srv.Serve(backend)
				t.Cleanup(func() { srv.Close() })
				addr := addrPortOf(backend.Addr())
				c := p.open(w, addr)
				c.(*net.TCPConn).SetReadBuffer(64 << 10)
				p.send(c, addr, "/")
				require.Eventually(t, func() bool {
					last := lastWrite.Load()
					return last != 0 && time.Since(time.Unix(0, last)) > 200*time.Millisecond
				}, 10*time.Second, 10*time.Millisecond, "the upstream's writes never blocked")

				a.act(w)
				r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP })
				assert.Equal(t, a.reason, r.Reason, "record %+v", r)
			})
		}
	}
}

// TestShutdownWaitsForPlainRequests: Shutdown waits for a plain HTTP
// exchange in flight, a stream or an upgrade's tunnel (which the server
// it came through no longer knows), on both paths, and ends it, recorded
// so, when its time is up. The explicit proxy's streams were cut at
// once, and recorded as ending by themselves.
func TestShutdownWaitsForPlainRequests(t *testing.T) {
	for _, p := range plainPaths {
		for _, path := range []string{"/stream", "/upgrade"} {
			t.Run(p.name+path, func(t *testing.T) {
				w := newWorld(t, []string{"svc.test:*"}, nil)
				addr := w.serveLong("127.0.0.2")
				c, br := openExchange(t, w, p, addr, path)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				shut := make(chan error, 1)
				go func() { shut <- w.proxy.Shutdown(ctx) }()
				for range 5 { // during the grace, it goes on
					if path == "/upgrade" {
						fmt.Fprintf(c, "ping\n")
					}
					_, err := br.ReadString('\n')
					require.NoError(t, err, "ended during the grace")
				}
				assert.ErrorIs(t, <-shut, context.DeadlineExceeded, "Shutdown did not wait for the exchange")
				endsSoon(t, c, br, path == "/upgrade")
				r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == path })
				assert.Equal(t, ReasonShuttingDown, r.Reason, "record %+v", r)
			})
		}
	}
}

// TestForgottenWhileItsBodyIsRead: a request forgotten while the body an
// MCP endpoint's messages are judged from is read, and stops coming,
// ends at once, recorded so: on the explicit proxy, nothing else ended
// it (a transparent connection is reset).
func TestForgottenWhileItsBodyIsRead(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, nil, nil)
			addr := w.serveLong("127.0.0.2")
			w.setPolicy(policy.Config{Allow: []string{fmt.Sprintf("mcp http://svc.test:%d/stream tools=search", addr.Port())}})
			c := p.open(w, addr)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: svc.test:%d\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\"", p.target(addr, "/stream"), addr.Port())
			require.Eventually(t, func() bool { _, requests := tracked(w.proxy, "a1"); return requests == 1 }, 5*time.Second, time.Millisecond, "the request was never tracked")
			w.proxy.Forget("a1")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.Copy(io.Discard, c)
			assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "still open 5 s after Forget")
			r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP })
			assert.False(t, r.Allowed, "record %+v", r)
			assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
		})
	}
}

// tracked counts what the proxy tracks for agent: connections, and
// plain requests (whose agentConn carries no connection of its own).
func tracked(p *Proxy, agent string) (conns, requests int) {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		return 0, 0
	}
	set := v.(*connSet)
	set.mu.Lock()
	defer set.mu.Unlock()
	for ac := range set.m {
		ac.mu.Lock()
		if ac.conn == nil {
			requests++
		} else {
			conns++
		}
		ac.mu.Unlock()
	}
	return conns, requests
}

// serveWith runs a plain HTTP server of h on 127.0.0.2.
func (w *world) serveWith(h http.HandlerFunc) netip.AddrPort {
	ln := listenLoop(w.t, "127.0.0.2:0")
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	w.t.Cleanup(func() { srv.Close() })
	return addrPortOf(ln.Addr())
}

// TestPlainHTTPFullDuplex: a request's body reaches an upstream that
// answered before it had all come, and the answer reaches the client
// whole, on a connection then closed. net/http, at the response's first
// write, read what remained of the body itself and closed it beneath the
// forwarder: the answer waited for the body's end, which never reached
// the upstream, and a stream answered just before the forwarder saw the
// body's end was cut after its first bytes, its upstream connection
// closed by the failed read.
func TestPlainHTTPFullDuplex(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, nil)
			addr := w.serveWith(testkit.EarlyAnswer)
			testkit.CheckEarlyAnswer(t, p.open(w, addr), fmt.Sprintf("POST %s HTTP/1.1\r\nHost: svc.test:%d\r\n", p.target(addr, "/upload"), addr.Port()))
		})
	}
}

// TestEarlyAnswerDoesNotHoldTheConnection: a request answered before its
// body came, which never comes whole, ends with its answer, and what
// came of its body (a request for a host no entry allows) is answered by
// no one: the forwarder's read of the body, still under way as the
// handler returned, had net/http clear the deadline that ends it, and
// read the rest with none, where neither the idle sweep nor Forget sees
// it.
func TestEarlyAnswerDoesNotHoldTheConnection(t *testing.T) {
	for _, p := range plainPaths {
		t.Run(p.name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, func(px *Proxy) { px.IdleTimeout = 300 * time.Millisecond })
			addr := w.serveWith(testkit.EarlyAnswerUnread)
			testkit.CheckEndsAfterEarlyAnswer(t, p.open(w, addr),
				fmt.Sprintf("POST %s HTTP/1.1\r\nHost: svc.test:%d\r\n", p.target(addr, "/upload"), addr.Port()),
				fmt.Sprintf("GET %s HTTP/1.1\r\nHost: blocked.test:%d\r\n\r\n", p.target(addr, "/next"), addr.Port()))
		})
	}
}
